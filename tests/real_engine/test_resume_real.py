"""Resume on two real llama-servers under greedy decoding (issue 28 item 4's must-show).

hub-a and hub-b each run beside their own llama-server on the same generated model (the
``aligned`` model of resume_rig.py: printable ASCII without the letters any merge needs, so a
text it wrote tokenises back into the tokens it generated, and every streamed frame is one
token). hub-a has poolStreamResume 1 and is pinned to its own engine.

What is reliably true, and asserted here:

- stalled (SIGSTOP) or killed (SIGKILL) mid-answer, for OpenAI chat, Ollama native (translated
  to chat completions), Anthropic Messages and Responses, the app gets one well-formed answer:
  the text it had before the cut, then hub-b's continuation, never that text twice (llama-server
  sends the partial text back at the start of its continuation where it cannot be told not to),
  the whole answer's length in tokens, usage summed;
- cut on a token boundary the test places (a few tokens in, where the continuation has no
  near tie for rounding to flip), the resumed answer equals the uninterrupted one byte for byte.

Whether a resumed answer equals the uninterrupted one in general is measured, not asserted:
tests/real_engine/measure_resume.py, and docs/reliability.md ("Resume") for the figure and why.
"""

from __future__ import annotations

import pytest
from harness import fqdn
from real_engine import resume_rig
from stream_shapes import one_stream
from streams import error_of

from hubpool_core.engine import MESSAGES, NATIVE, OPENAI, RESPONSES

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(180)]

DIALECTS = (OPENAI, NATIVE, MESSAGES, RESPONSES)
TOKENS = 1000
#: a SIGSTOP or SIGKILL can land after a fast engine has finished: tries before giving up
TRIES = 4
#: the controlled cut: a short answer, and the cut this many tokens in
SHORT, CUT_FRAMES = 200, 8
#: the smallest gap between the two likeliest tokens the controlled cut accepts after the cut.
#: Prefilling a partial answer in one batch rounds differently from generating it token by
#: token: measured on this model, the two passes' log-probabilities differ by at most 2e-4 for
#: a partial answer of 20 tokens (3e-3 at 150, 6e-3 at 300), so a gap fifty times that is safe
SAFE_GAP = 0.01


@pytest.fixture(scope="module")
def aligned(llama_server_binary, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume-real")
    return llama_server_binary, resume_rig.write_model(root / "aligned.gguf", "aligned"), root


@pytest.fixture(scope="module")
def pool(aligned):
    binary, model, root = aligned
    (root / "pool").mkdir()
    started = resume_rig.start_pool(root / "pool", binary, model, stall_ms=2000)
    yield started
    started.close()


@pytest.fixture(scope="module")
def cut_pool(aligned):
    binary, model, root = aligned
    (root / "cut").mkdir()
    started = resume_rig.start_pool(root / "cut", binary, model, stall_ms=1500, proxy=True)
    yield started
    started.close()


@pytest.mark.parametrize("how", ["stall", "kill"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_real_engine_stalled_or_killed_mid_answer_resumes_one_answer(pool, dialect, how):
    for _ in range(TRIES):
        run = resume_rig.resumed_run(pool, dialect, TOKENS, after_chars=20, how=how)
        if run.cut_at is not None:
            break
    else:
        pytest.fail(f"hub-a's llama-server finished all {TRIES} answers before it was {how}ed")
    assert error_of(dialect, run.raw) is None, run.raw[-400:]
    cut = run.cut_at
    assert 0 < cut < len(run.whole)
    # the text the app had before the cut, then the rest: never that text again
    assert run.resumed[:cut] == run.whole[:cut]
    assert len(run.resumed) == len(run.whole) == TOKENS  # one character a token on this model
    one_stream(dialect, run.raw, run.resumed, TOKENS)
    assert run.row["outcome"] == "served" and run.row["node"] == fqdn("hub-b"), run.row
    [where] = run.row["resumedFrom"]
    assert where["node"] == "local" and where["backend"] == "llamacpp" and where["atChars"] == cut
    assert where["reason"].startswith("stalled (" if how == "stall" else "truncated-upstream ("), where


#: every dialect cut after CUT_FRAMES tokens; chat completions also after the first and the
#: twelfth (the proxy keeps a response's first 4 KB, which is where a cut can be placed)
CUTS = [(dialect, CUT_FRAMES) for dialect in DIALECTS] + [(OPENAI, 1), (OPENAI, 12)]


@pytest.mark.parametrize("dialect,frames", CUTS, ids=[f"{d}-{f}" for d, f in CUTS])
def test_a_cut_on_a_token_boundary_resumes_byte_for_byte(cut_pool, dialect, frames):
    expected, gap = resume_rig.smallest_gap_after(cut_pool.servers["hub-b"], SHORT, frames)
    assert gap > SAFE_GAP, f"the model's answer has a near tie ({gap:.2g}) after token {frames}: ask another question"
    run = resume_rig.cut_run(cut_pool, dialect, SHORT, frames)
    assert run.whole == expected  # the uninterrupted answer, through the pool, is the engine's own
    assert run.cut_at == frames, run.row  # one character, one token, one frame
    assert run.row["resumedFrom"][0]["reason"].startswith("stalled (")
    assert run.resumed == run.whole
    one_stream(dialect, run.raw, run.resumed, SHORT)
