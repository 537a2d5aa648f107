"""The helpers the Engine base class gives plugins: get_json's sentences, request_errors
tables, telling engines apart by owned_by, error_message's shapes, and the testing aids."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubpool_core import REQUEST_ERROR_SIGNATURES, Engine, EngineConfig, ProbeResult, error_message
from hubpool_core.engine import NATIVE, OPENAI, JsonAnswer, ProbeFailed
from hubpool_core.testing import answer, mock_http, raising, run

URL = "http://127.0.0.1:7001"


class ToyEngine(Engine):
    kind = "toy"
    product = "Toy Server"
    env_var = "TOY_URL"
    default_url = "http://127.0.0.1:7001"
    owned_by_names = frozenset({"toy", " Toy-Lib "})
    request_errors = (
        ("no-user-query", r"no user query"),
        ("context-length", r"context (?:length|window)"),
        ("chat-template", r"template"),  # later rows lose to earlier ones
    )

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        try:
            entries = await self.openai_models(http)
            other = self.other_engine_result(e.get("owned_by") for e in entries)
            return other or ProbeResult(running=True, healthy=True)
        except Exception as exc:
            return self.probe_failure(exc)


class ToyNeighbour(Engine):
    """Another engine on the toy's default port (as two real engines share one)."""

    kind = "toyneighbour"
    product = "Neighbour"
    env_var = "NEIGHBOUR_URL"
    default_url = "http://127.0.0.1:7001"
    owned_by_names = frozenset({"neighbour"})

    async def probe(self, http):  # pragma: no cover - never probed here
        raise AssertionError


class ToyFaraway(Engine):
    kind = "toyfaraway"
    env_var = "FARAWAY_URL"
    default_url = "http://127.0.0.1:7002"
    owned_by_names = frozenset({"faraway"})

    async def probe(self, http):  # pragma: no cover
        raise AssertionError


def toy(api_key=None, source="default", url=URL):
    return ToyEngine(EngineConfig(base_url=url + "/", api_key=api_key, source=source))


def get(routes, path="/x", **kw):
    engine = kw.pop("engine", None) or toy()
    return run(engine.get_json(mock_http(routes), path, **kw))


# -- class attributes ---------------------------------------------------------------
def test_product_defaults_to_kind_and_key_variable_sits_beside_the_url_variable():
    assert ToyFaraway.product == "toyfaraway"
    assert ToyEngine.product == "Toy Server"
    assert toy().api_key_var == "TOY_API_KEY"

    class Renamed(ToyEngine):
        kind = "renamed"

    class SameKind(ToyEngine):
        pass

    assert Renamed.product == "renamed" and SameKind.product == "Toy Server"


def test_owned_by_names_are_trimmed_and_lower_cased_and_must_be_a_set():
    assert ToyEngine.owned_by_names == frozenset({"toy", "toy-lib"})
    with pytest.raises(TypeError, match="owned_by_names"):
        type("Bad", (ToyEngine,), {"owned_by_names": "toy"})


# -- get_json -------------------------------------------------------------------------
def test_get_json_of_a_200_with_json_sends_the_key():
    seen = []
    engine = toy(api_key="k")
    got = run(engine.get_json(mock_http({"/x": (200, {"a": 1})}, seen=seen), "/x"))
    assert got == JsonAnswer(body={"a": 1}, error=None, status=200, running=True) and got.ok
    assert seen[0].url == f"{URL}/x" and seen[0].headers["authorization"] == "Bearer k"
    assert "authorization" not in run_seen(toy(), {"/x": (200, {})})[0].headers


def run_seen(engine, routes):
    seen = []
    run(engine.get_json(mock_http(routes, seen=seen), "/x"))
    return seen


def test_get_json_of_json_null_is_ok():
    got = get({"/x": (200, None)})
    assert got.ok and got.body is None and got.status == 200


def test_get_json_timeout_overrides_the_clients():
    seen = []
    run(toy().get_json(mock_http({"/x": (200, {})}, seen=seen), "/x", timeout=0.25))
    assert seen[0].extensions["timeout"]["read"] == 0.25


@pytest.mark.parametrize("source,where", [("default", "set TOY_URL"), ("TOY_URL", "TOY_URL points here")])
def test_get_json_connection_refused(source, where):
    got = run(toy(source=source).get_json(mock_http(raising(httpx.ConnectError)), "/x"))
    assert not got.running and got.status is None and got.body is None and not got.ok
    assert got.error == f"connection refused at {URL} (is Toy Server running? {where})"


def test_get_json_timeouts():
    got = get(raising(httpx.ConnectTimeout))
    assert not got.running
    assert got.error == f"no connection to {URL} within the probe timeout (is Toy Server running? set TOY_URL)"
    got = get(raising(httpx.ReadTimeout))
    assert got.running and got.status is None
    assert got.error == f"{URL} took the connection but did not answer GET /x in time"


def test_get_json_other_transport_failures():
    got = get(raising(httpx.RemoteProtocolError))
    assert got.running and got.error == f"GET {URL}/x failed: boom"
    got = get(raising(httpx.UnsupportedProtocol))
    assert not got.running and got.error.startswith(f"GET {URL}/x failed")


@pytest.mark.parametrize("status", [401, 403])
def test_get_json_key_refused_or_wanted(status):
    got = get({"/x": (status, {"error": "Unauthorized"})}, engine=toy(api_key="wrong"))
    assert got.running and got.status == status and got.body == {"error": "Unauthorized"}
    assert got.error == f"Toy Server at {URL} refused this node's API key ({status}); check TOY_API_KEY"
    got = get({"/x": (status, "")})
    assert got.error == (f"Toy Server at {URL} wants an API key ({status}) and this node holds none "
                         f"for it (set TOY_API_KEY)")


def test_get_json_other_status_keeps_the_body_and_says_its_message():
    got = get({"/x": (503, {"detail": "busy"})})
    assert got.running and got.status == 503 and got.body == {"detail": "busy"}
    assert got.error == f"Toy Server at {URL} answered GET /x with 503: busy"
    assert get({"/x": (500, "<html>")}).error == f"Toy Server at {URL} answered GET /x with 500"
    assert get({}).error == f"Toy Server at {URL} answered GET /x with 404"  # mock_http's default 404


def test_get_json_not_json():
    got = get({"/x": (200, "<html>nginx</html>")})
    assert got.running and got.status == 200 and got.body is None
    assert got.error == f"the server at {URL} answered GET /x with something that is not JSON " \
                        f"(is it Toy Server? set TOY_URL)"


def test_json_answer_as_a_probe_result():
    got = get(raising(httpx.ConnectError))
    assert got.unhealthy() == ProbeResult(running=False, healthy=False, error=got.error)


# -- require_json, wrong_answer, probe_failure, openai_models ----------------------------
def test_require_json_raises_the_sentence():
    assert run(toy().require_json(mock_http({"/x": (200, [1])}), "/x")) == [1]
    with pytest.raises(ProbeFailed) as failed:
        run(toy().require_json(mock_http(raising(httpx.ConnectError)), "/x"))
    assert not failed.value.running and failed.value.error.startswith("connection refused")
    assert failed.value.result() == ProbeResult(running=False, healthy=False, error=failed.value.error)


def test_wrong_answer_and_probe_failure():
    wrong = toy(source="TOY_URL").wrong_answer("/health", "without the fields")
    assert wrong.running and wrong.error == (f"the server at {URL} answered GET /health without the fields "
                                             f"(is it Toy Server? TOY_URL points here)")
    assert toy().probe_failure(wrong) == ProbeResult(running=True, healthy=False, error=wrong.error)
    assert toy().probe_failure(KeyError("id")) == ProbeResult(
        running=True, healthy=False, error=f"could not read the answer of {URL}: KeyError('id')")


def test_openai_models_keeps_entries_with_an_id():
    body = {"data": [{"id": "a"}, {"id": 3}, "x", None, {"id": "b", "owned_by": "toy"}]}
    assert run(toy().openai_models(mock_http({"/v1/models": (200, body)}))) == [
        {"id": "a"}, {"id": "b", "owned_by": "toy"}]


@pytest.mark.parametrize("answer_", [(200, {"models": []}), (200, [1]), (200, {"data": "x"})])
def test_openai_models_without_a_list(answer_):
    with pytest.raises(ProbeFailed) as failed:
        run(toy().openai_models(mock_http({"/v1/models": answer_})))
    assert failed.value.running
    assert failed.value.error == (f"the server at {URL} answered GET /v1/models without a model list "
                                  f"(is it Toy Server? set TOY_URL)")


def test_openai_models_under_another_prefix():
    class Prefixed(ToyEngine):
        kind = "toyprefixed"
        openai_prefix = "/api/v1"

    http = mock_http({"/api/v1/models": (200, {"data": [{"id": "m"}]})})
    assert run(Prefixed(EngineConfig(base_url=URL)).openai_models(http)) == [{"id": "m"}]


# -- request_errors -------------------------------------------------------------------
@pytest.mark.parametrize("body,signature", [
    ({"error": "No User Query found"}, "no-user-query"),                  # case-insensitive
    ({"error": {"message": "exceeds the context window"}}, "context-length"),
    ({"object": "error", "message": "chat template failed"}, "chat-template"),
    ({"detail": "no user query in the template"}, "no-user-query"),      # first row wins
    ({"error": "out of memory"}, None),
    ({"detail": [{"msg": "no user query"}]}, None),                      # validation list: no message
    ({}, None), (None, None), ([], None), ("no user query", None), (7, None),
])
def test_request_error_reads_the_table(body, signature):
    assert toy().request_error(500, body) == signature


def test_request_error_without_a_table_is_none_and_a_subclass_inherits_or_replaces_it():
    assert ToyNeighbour(EngineConfig(base_url=URL)).request_error(500, {"error": "no user query"}) is None

    class Inherits(ToyEngine):
        kind = "toyinherits"

    class Replaces(ToyEngine):
        kind = "toyreplaces"
        request_errors = (("invalid-message", r"bad role"),)

    config = EngineConfig(base_url=URL)
    assert Inherits(config).request_error(500, {"error": "no user query"}) == "no-user-query"
    assert Replaces(config).request_error(500, {"error": "no user query"}) is None
    assert Replaces(config).request_error(500, {"error": "Bad Role"}) == "invalid-message"


@pytest.mark.parametrize("table,exc,match", [
    ((("not-a-signature", r"x"),), ValueError, "unknown signature 'not-a-signature'"),
    ((("chat-template", r"("),), ValueError, "bad regex for 'chat-template'"),
    ((("chat-template",),), TypeError, "string pairs"),
    (("chat-template",), TypeError, "string pairs"),
])
def test_a_bad_table_fails_when_the_class_is_defined(table, exc, match):
    with pytest.raises(exc, match=match):
        type("BadTable", (ToyEngine,), {"kind": "badtable", "request_errors": table})


def test_every_signature_is_allowed():
    table = tuple((s, s) for s in REQUEST_ERROR_SIGNATURES)
    cls = type("AllSignatures", (ToyEngine,), {"kind": "allsignatures", "request_errors": table})
    assert [s for s, _ in cls._request_error_patterns] == list(REQUEST_ERROR_SIGNATURES)


# -- owned_by ---------------------------------------------------------------------------
@pytest.mark.parametrize("values,named", [
    (["neighbour"], "Neighbour"),
    ([" NEIGHBOUR ", None, 3], "Neighbour"),          # trimmed, lower-cased, non-strings ignored
    (["faraway"], "toyfaraway"),                      # product defaults to kind
    (["system", "faraway"], "toyfaraway"),            # a generic owner beside an engine's
    (["toy", "neighbour"], None),                     # the server names this engine too
    (["toy-lib"], None),
    (["system"], None), (["organization-owner"], None), ([], None), ([""], None),
])
def test_other_engine_named(values, named):
    assert toy().other_engine_named(values) == named


def test_other_engine_named_is_stable_with_two_others():
    assert toy().other_engine_named(["neighbour", "faraway"]) == "toyfaraway"  # sorted values


def test_the_other_engine_sees_the_first_one_too():
    neighbour = ToyNeighbour(EngineConfig(base_url=URL))
    assert neighbour.other_engine_named(["toy-lib"]) == "Toy Server"
    assert neighbour.other_engine_named(["neighbour", "toy"]) is None


def test_other_engine_result_on_a_shared_default_port():
    result = toy().other_engine_result(["neighbour"])
    assert result == ProbeResult(
        running=True, healthy=False,
        error=f"the server at {URL} is Neighbour, not Toy Server (Toy Server and Neighbour both default "
              f"to port 7001; point TOY_URL at Toy Server)")


def test_other_engine_result_on_another_port_and_when_no_engine_is_named():
    assert toy().other_engine_result(["faraway"]).error == (
        f"the server at {URL} is toyfaraway, not Toy Server (point TOY_URL at Toy Server)")
    assert toy().other_engine_result(["system"]) is None


def test_a_probe_using_the_helpers():
    listing = {"data": [{"id": "m", "owned_by": "neighbour"}]}
    result = run(toy().probe(mock_http({"/v1/models": (200, listing)})))
    assert result.running and not result.healthy and "is Neighbour, not Toy Server" in result.error
    listing = {"data": [{"id": "m", "owned_by": "system"}]}
    assert run(toy().probe(mock_http({"/v1/models": (200, listing)}))).healthy
    assert not run(toy().probe(mock_http(raising(httpx.ConnectError)))).running


# -- error_message ---------------------------------------------------------------------
@pytest.mark.parametrize("body,message", [
    ({"error": "a"}, "a"),
    ({"error": {"message": "b"}}, "b"),
    ({"message": "c"}, "c"),
    ({"detail": "d"}, "d"),                                  # FastAPI's HTTPException
    ({"error": "a", "detail": "d"}, "a"),
    ({"message": "c", "detail": "d"}, "c"),
    ({"error": {"code": 1}, "detail": "d"}, "d"),
    ({"detail": [{"loc": ["body", "messages"], "msg": "Field required"}]}, None),
    ({"detail": None}, None), ({}, None), (None, None), ([{"error": "a"}], None), ("a", None),
])
def test_error_message_shapes(body, message):
    assert error_message(body) == message


# -- testing aids ----------------------------------------------------------------------
def test_mock_http_routes():
    seen = []
    reusable = httpx.Response(201, json={"ok": True})
    http = mock_http({"/a": reusable, "/b": lambda request: answer(202, request.url.path),
                      "/c": (200, "text")}, missing=(410, {"gone": 1}), seen=seen)

    async def go():
        return [await http.get(URL + p) for p in ("/a", "/a", "/b", "/c", "/nowhere")]

    a1, a2, b, c, gone = run(go())
    assert (a1.status_code, a1.json(), a2.json()) == (201, {"ok": True}, {"ok": True})
    assert (b.status_code, b.text, c.text) == (202, "/b", "text")
    assert (gone.status_code, gone.json()) == (410, {"gone": 1})
    assert [r.url.path for r in seen] == ["/a", "/a", "/b", "/c", "/nowhere"]


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=8)


@given(_JSON, _JSON)
def test_is_final_frame_answers_any_frame_and_never_raises(choices, finish):
    """Issue 16: a chunk whose ``choices`` was an object raised KeyError in the relay's pump."""
    frame = json.dumps({"choices": choices, "finish_reason": finish, "done": finish}).encode()
    for dialect in (OPENAI, NATIVE):
        assert Engine.is_final_frame(None, dialect, frame) in (True, False)  # type: ignore[arg-type]
    if not isinstance(choices, list):
        assert Engine.is_final_frame(None, OPENAI, frame) is False  # type: ignore[arg-type]
