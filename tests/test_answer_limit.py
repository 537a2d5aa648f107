"""Where a request asks for its answer's length, per dialect: the one reader the proxy's resume
(which spends from it) and the slot clock (which plans by it) share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.engine import MESSAGES, NATIVE, OPENAI, RESPONSES, answer_limit


def test_each_dialect_reads_its_own_key():
    assert answer_limit({"max_tokens": 50}, OPENAI)[1:] == ("max_tokens", 50)
    assert answer_limit({"max_tokens": 50, "max_completion_tokens": 30}, OPENAI)[1:] == ("max_completion_tokens", 30)
    assert answer_limit({"max_output_tokens": 70}, RESPONSES)[1:] == ("max_output_tokens", 70)
    assert answer_limit({"max_tokens": 70}, RESPONSES) is None  # not Responses' key
    holder, key, asked = answer_limit({"options": {"num_predict": 60}}, NATIVE)
    assert (holder, key, asked) == ({"num_predict": 60}, "num_predict", 60)
    assert answer_limit({"num_predict": 60}, NATIVE) is None  # Ollama reads it from options only
    assert answer_limit({"max_tokens": 1024}, MESSAGES)[1:] == ("max_tokens", 1024)


def test_the_holder_is_the_bodys_own_object_so_resume_can_spend_from_it():
    body = {"options": {"num_predict": 60, "temperature": 0}}
    holder, key, asked = answer_limit(body, NATIVE)
    holder[key] = asked - 20
    assert body == {"options": {"num_predict": 40, "temperature": 0}}


values = st.one_of(st.integers(-5, 10_000), st.booleans(), st.none(), st.text(max_size=3), st.floats(allow_nan=False),
                   st.lists(st.integers(), max_size=2))
keys = st.sampled_from(["max_tokens", "max_completion_tokens", "max_output_tokens", "num_predict", "stream"])
bodies = st.dictionaries(st.sampled_from(["max_tokens", "max_completion_tokens", "max_output_tokens", "model"]), values,
                         max_size=4) | st.fixed_dictionaries({"options": st.one_of(st.dictionaries(keys, values, max_size=3),
                                                                                   values)})


@given(body=st.one_of(bodies, values), dialect=st.sampled_from([None, OPENAI, RESPONSES, NATIVE, MESSAGES, "rerank"]))
def test_only_a_positive_whole_number_in_the_body_is_an_ask(body, dialect):
    found = answer_limit(body, dialect)
    if found is not None:
        holder, key, asked = found
        assert type(asked) is int and asked > 0 and holder[key] is asked
        assert holder is body or holder is body.get("options")
    elif isinstance(body, dict) and dialect is None:
        # nothing found with every dialect's keys: no key anywhere holds a positive whole number
        options = body.get("options") if isinstance(body.get("options"), dict) else {}
        for value in (*(body.get(k) for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")),
                      options.get("num_predict")):
            assert not (type(value) is int and value > 0)
