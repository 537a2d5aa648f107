"""The relay's decisions, each driven alone with no walk, no server and no socket: whether a
verdict stands (verdicts.py), which statuses fail over (failover.py), the window a candidate
runs at, what a judged answer does to its engine's withhold and the throughput sample it
gives (judge.py), and how a transport error is named (attempt.py, connector.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from types import SimpleNamespace

import aiohttp
import pytest
from fake_engine import FakeEngine
from multidict import CIMultiDict

from hubpool_core.config import PoolSettings
from hubpool_core.engine import OPENAI, EngineConfig, ModelInfo, ProbeResult, Timings
from hubpool_core.placement import Candidate
from hubpool_core.placement.quarantine import DROPPED, Quarantine
from hubpool_core.placement.slot_clock import SlotClock
from hubpool_core.placement.throughput import MIN_PROMPT_TOKENS
from hubpool_core.proxy import failover
from hubpool_core.proxy.attempt import Failed, transport_code
from hubpool_core.proxy.connector import reset_before_answer
from hubpool_core.proxy.failover import exhausted, fails_over, passed_over
from hubpool_core.proxy.judge import clean, final_frame_check, output_fault, sample, stream_ended, unservable
from hubpool_core.proxy.output_check import TRUNCATED, StreamJudge
from hubpool_core.proxy.plan import RelayPlan
from hubpool_core.proxy.verdicts import Verdict, carry, settle_at_end, settle_verdict, window_of
from hubpool_core.signals.local_engines import LocalBackend, Snapshot
from hubpool_core.telemetry.routing_log import RoutingLog

MODEL = "qwen3:8b"


class PoolTemplateEngine(FakeEngine):
    """Renders nothing itself: the chat template is the pool's (the OpenAI server's) own."""

    kind = "pooltmpl"
    request_errors = (("no-user-query", r"no user query"), ("context-length", r"exceeds the context"),
                      ("chat-template", r"template"))


class OwnTemplateEngine(PoolTemplateEngine):
    kind = "owntmpl"
    renders_own_template = True


class TimedEngine(PoolTemplateEngine):
    """Reports how long the prompt and the generation took, as some engines do."""

    kind = "timed"

    def timings(self, body):
        return Timings(prompt_tokens=900, cached_tokens=100, prefill_ms=120.0, decode_tokens=40, decode_ms=400.0)


def engine(cls=PoolTemplateEngine):
    return cls(EngineConfig(base_url="http://127.0.0.1:9"))


def local(eng, window=8192):
    result = ProbeResult(running=True, healthy=True, models=(ModelInfo(MODEL, context_window=window),))
    return Candidate(node="local", backend=eng.kind, local=LocalBackend(eng, Snapshot(result, time.monotonic())))


def peer(name, kind, caps=None):
    return Candidate(node=name, backend=kind, peer=SimpleNamespace(id=f"id-{name}", last_capabilities=caps))


class Recorder:
    """Records every call made on it, by method name."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def fake_node(max_num_ctx=4096):
    return SimpleNamespace(
        routing_log=RoutingLog(), output_quarantine=Quarantine(), unservable=Quarantine(), local=Recorder(),
        peers=Recorder(), throughput=Recorder(), slot_clock=SlotClock(),
        settings=SimpleNamespace(current=PoolSettings(maxNumCtx=max_num_ctx)),  # every other setting at its default
        engine_by_kind={cls.kind: engine(cls) for cls in (PoolTemplateEngine, OwnTemplateEngine, TimedEngine)})


def make_plan(node, candidates, **kw):
    row = node.routing_log.open(direction="app", path="/v1/chat/completions", model=MODEL)
    fields = dict(route="/v1/chat/completions", dialect=OPENAI, body={}, raw=b"{}", model=MODEL, stream=False,
                  candidates=candidates, row=row, budget_ms=1000)
    return RelayPlan(**(fields | kw))


def verdict(signature, cand, window=None):
    return Verdict(signature, cand, 500, b'{"error": "x"}', [], window, refused_kinds=frozenset({cand.backend}))


def settle(node, plan, *verdicts):
    """The walk's reading of these verdicts, one per attempt in order: (the node whose verdict
    stands, basis, confirms) after the last one, or None while the walk goes on."""
    pending = None
    for v in verdicts:
        pending = carry(pending, v)
    settled = settle_verdict(node, plan, pending, len(verdicts))
    return None if settled is None else (settled[0].cand.node, *settled[1:])


# -- verdicts: does one engine's refusal speak for the pool? --------------------------------
def test_a_definitive_verdict_stands_from_the_first_engine_that_gives_it():
    node = fake_node()
    a, b = peer("hub-a", "pooltmpl"), peer("hub-b", "pooltmpl")
    plan = make_plan(node, [a, b])
    v = verdict("no-user-query", a)
    assert settle(node, plan, v) == ("hub-a", "definitive", None)


def test_a_first_refusal_waits_for_a_second_engine_to_give_the_same_one():
    node = fake_node()
    a, b, c = (peer(n, "owntmpl", {"maxNumCtx": 8192}) for n in ("hub-a", "hub-b", "hub-c"))
    plan = make_plan(node, [a, b, c])
    assert settle(node, plan, verdict("context-length", a, 8192)) is None
    # a second engine refusing for another reason confirms nothing
    assert settle(node, plan, verdict("chat-template", a), verdict("context-length", b, 8192)) is None


def test_context_length_stands_once_confirmed_and_no_candidate_ahead_runs_a_larger_window():
    node = fake_node()
    a, b = peer("hub-a", "owntmpl", {"maxNumCtx": 8192}), peer("hub-b", "owntmpl", {"maxNumCtx": 8192})
    smaller = peer("hub-c", "owntmpl", {"maxNumCtx": 4096})
    plan = make_plan(node, [a, b, smaller])
    first, second = verdict("context-length", a, 8192), verdict("context-length", b, 8192)
    assert settle(node, plan, first, second) == ("hub-b", "confirmed", "hub-a")


@pytest.mark.parametrize("ahead", [peer("hub-c", "owntmpl", {"maxNumCtx": 32768}),  # a larger window
                                   peer("hub-c", "pooltmpl"),  # a window this node cannot see
                                   peer("hub-c", "owntmpl", {})])
def test_context_length_waits_while_a_candidate_ahead_might_fit_the_prompt(ahead):
    node = fake_node()
    a, b = peer("hub-a", "owntmpl", {"maxNumCtx": 8192}), peer("hub-b", "owntmpl", {"maxNumCtx": 8192})
    plan = make_plan(node, [a, b, ahead])
    assert settle(node, plan, verdict("context-length", a, 8192), verdict("context-length", b, 8192)) is None


def test_context_length_from_two_different_windows_confirms_nothing():
    node = fake_node()
    a, b = peer("hub-a", "owntmpl", {"maxNumCtx": 4096}), peer("hub-b", "owntmpl", {"maxNumCtx": 8192})
    plan = make_plan(node, [a, b])
    assert settle(node, plan, verdict("context-length", a, 4096), verdict("context-length", b, 8192)) is None
    assert settle(node, plan, verdict("context-length", a, None), verdict("context-length", b, None)) is None


@pytest.mark.parametrize(("ahead_kind", "stands"), [("pooltmpl", True), ("owntmpl", False), ("unknown", False),
                                                    ("timed", False)])  # same flag, another engine: issue 16.6
def test_a_template_refusal_stands_only_when_every_engine_ahead_is_a_kind_that_refused(ahead_kind, stands):
    node = fake_node()
    a, b, c = peer("hub-a", "pooltmpl"), peer("hub-b", "pooltmpl"), peer("hub-c", ahead_kind)
    plan = make_plan(node, [a, b, c])
    first, second = verdict("chat-template", a), verdict("chat-template", b)
    settled = settle(node, plan, first, second)
    assert settled == (("hub-b", "confirmed", "hub-a") if stands else None)


def test_every_kind_that_refused_counts_and_a_new_signature_starts_over():
    node = fake_node()
    a, b, c, d = peer("hub-a", "pooltmpl"), peer("hub-b", "timed"), peer("hub-c", "owntmpl"), peer("hub-d", "timed")
    plan = make_plan(node, [a, b, c, d])
    first, second, third = verdict("invalid-message", a), verdict("invalid-message", b), verdict("invalid-message", c)
    assert settle(node, plan, first, second, third) == ("hub-c", "confirmed", "hub-b")  # hub-d's kind refused
    assert settle(node, plan, first, verdict("context-length", b), third) is None  # replaced: third stands alone


def test_the_last_candidates_verdict_is_confirmed_only_by_an_earlier_one_like_it():
    a, b = peer("hub-a", "pooltmpl"), peer("hub-b", "pooltmpl")

    def at_end(*verdicts):
        pending = None
        for v in verdicts:
            pending = carry(pending, v)
        return settle_at_end(pending)

    assert at_end(verdict("context-length", a, 8192), verdict("context-length", b, 8192)) == ("confirmed", "hub-a")
    assert at_end(verdict("context-length", a, 8192), verdict("context-length", b, 16384)) == ("last-candidate", None)
    assert at_end(verdict("context-length", a), verdict("context-length", b)) == ("last-candidate", None)
    assert at_end(verdict("chat-template", a), verdict("context-length", b)) == ("last-candidate", None)
    assert at_end(verdict("invalid-message", a), verdict("invalid-message", b)) == ("confirmed", "hub-a")
    assert at_end(verdict("invalid-message", a), verdict("chat-template", b),
                  verdict("invalid-message", b)) == ("last-candidate", None)  # a new signature replaced it
    assert at_end(verdict("context-length", b)) == ("last-candidate", None)


def test_the_window_a_candidate_runs_at():
    node = fake_node(max_num_ctx=6144)
    own, pool = engine(OwnTemplateEngine), engine(PoolTemplateEngine)
    plan = make_plan(node, [])
    assert window_of(node, plan, local(own)) == 6144  # the node's own setting
    assert window_of(node, make_plan(node, [], num_ctx=2048), local(own)) == 2048  # the request's num_ctx
    assert window_of(node, plan, peer("hub-b", "owntmpl", {"maxNumCtx": 12288})) == 12288
    assert window_of(node, plan, peer("hub-b", "owntmpl", {"maxNumCtx": "big"})) is None
    assert window_of(node, plan, local(pool, window=16384)) == 16384  # the model's listed window
    assert window_of(node, plan, peer("hub-b", "pooltmpl")) is None


# -- failover: which answers send the walk on ------------------------------------------------
def answer(status, **headers):
    return SimpleNamespace(status=status, headers=CIMultiDict(headers))


@pytest.mark.parametrize(("status", "moves_on"), [(500, True), (503, True), (429, True), (408, True),
                                                  (400, False), (401, False), (404, False), (200, False)])
def test_a_local_engine_fails_over_on_5xx_and_queue_statuses_only(status, moves_on):
    node = fake_node()
    cand = local(engine())
    assert fails_over(node, make_plan(node, [cand]), cand, answer(status), last=False) is moves_on


def test_a_forwarded_request_never_fails_over_here():
    node = fake_node()
    cand = local(engine())
    plan = make_plan(node, [cand], inbound_from="hub-a")
    assert fails_over(node, plan, cand, answer(503), last=False) is False


def test_a_peer_refusing_the_pairing_fails_over_and_drops_its_capabilities(caplog):
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    with caplog.at_level(logging.WARNING, logger="hubpool.relay"):
        assert fails_over(node, make_plan(node, [cand]), cand, answer(403), last=True) is True
    # try_update: on the request path a database that is down must not turn the failover into an error
    assert node.peers.calls == [("try_update", ("id-hub-b",), {"last_capabilities": None})]
    assert "hub-b refused this node (403)" in caplog.text


def test_an_engine_behind_a_peer_refusing_its_key_warns_once_and_the_last_one_goes_back(caplog, monkeypatch):
    monkeypatch.setattr(failover, "_refusal_warned", {})
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand])
    marked = answer(401, **{"X-Hub-Pool-Backend": "owntmpl"})
    with caplog.at_level(logging.DEBUG, logger="hubpool.relay"):
        assert fails_over(node, plan, cand, marked, last=False) is True
        assert fails_over(node, plan, cand, marked, last=True) is False  # the engine's own answer
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [("WARNING", "hub-b's owntmpl answered 401: check the API key that peer holds for it"),
                      ("DEBUG", "hub-b's owntmpl answered 401 again")]
    assert node.peers.calls == []  # the pairing itself is fine


def test_a_passed_over_candidate_is_recorded_on_the_row():
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand])
    passed_over(plan, cand, Failed(503, "HTTP 503 " + "x" * 300))
    assert plan.row["failedOverFrom"] == ["hub-b"]
    (attempt,) = plan.row["attempts"]
    assert attempt["status"] == 503 and attempt["backend"] == "pooltmpl" and len(attempt["reason"]) == 200


def run_exhausted(plan, failures, node):
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(exhausted(node, plan, send, failures, time.monotonic()))
    return sent


def test_when_every_candidate_failed_the_app_gets_a_502_naming_the_last_reason():
    node = fake_node()
    plan = make_plan(node, [peer("hub-b", "pooltmpl"), peer("hub-c", "pooltmpl")], pin_note="(pinned to hub-b)")
    plan.context = SimpleNamespace(response_headers={"X-Hub-Pool-Affinity": "miss"})
    start, body = run_exhausted(plan, [Failed(503, "HTTP 503"), Failed(None, "fetch failed (ECONNREFUSED)")], node)
    assert start["status"] == 502
    assert start["headers"] == [(b"content-type", b"application/json"),
                                (b"x-hub-pool-request-id", plan.row["id"].encode()),
                                (b"x-hub-pool-affinity", b"miss")]
    assert json.loads(body["body"]) == {
        "error": f'All 2 pool candidates for model "{MODEL}" failed: fetch failed (ECONNREFUSED) (pinned to hub-b)'}
    assert plan.row["status"] == 502 and plan.row["reason"] == "fetch failed (ECONNREFUSED)"


def test_when_every_candidate_missed_its_deadline_the_502_says_it_was_a_deadline():
    node = fake_node()
    plan = make_plan(node, [peer("hub-b", "pooltmpl")])
    _, body = run_exhausted(plan, [Failed(None, "No response headers within 1000ms", deadline=True)], node)
    message = json.loads(body["body"])["error"]
    assert message.startswith(f'No pool candidate answered for model "{MODEL}" within its deadline (1 candidate '
                              "tried; 1000 ms each).")


# -- the judge: withholds, clean answers, samples ----------------------------------------------
def test_two_output_faults_withhold_the_engine_and_one_clean_answer_ends_it(caplog):
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    key = ("hub-b", "pooltmpl", "qwen3:8b")
    with caplog.at_level(logging.INFO, logger="hubpool.relay"):
        output_fault(node, MODEL, cand, TRUNCATED)
        assert not node.output_quarantine.withheld(key)
        output_fault(node, MODEL, cand, TRUNCATED)
        assert node.output_quarantine.withheld(key)
        clean(node, MODEL, cand)
    assert not node.output_quarantine.withheld(key)
    assert [r.getMessage() for r in caplog.records] == [
        f"withholding hub-b's pooltmpl for {MODEL}: {TRUNCATED} twice within five minutes",
        f"hub-b's pooltmpl answers {MODEL} cleanly again"]


def test_a_clean_answer_releases_a_local_unservable_withhold_at_once():
    node = fake_node()
    eng = engine()
    cand = local(eng)
    unservable(node, MODEL, cand, "HTTP 500")
    unservable(node, MODEL, cand, "HTTP 500")
    assert node.unservable.withheld(("local", "pooltmpl", "qwen3:8b"))
    clean(node, MODEL, cand)
    assert not node.unservable.withheld(("local", "pooltmpl", "qwen3:8b"))
    assert node.local.calls == [("invalidate", (eng,), {})]  # the next request sees the release


def judged(frames, dialect=OPENAI):
    judge = StreamJudge(dialect, engine().is_final_frame)
    for frame in frames:
        judge.feed(frame)
    return judge


FINAL = b'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'


def test_a_stream_that_ended_with_its_final_frame_clears_the_engine(caplog):
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    node.output_quarantine.strike(("hub-b", "pooltmpl", "qwen3:8b"), TRUNCATED)
    plan = make_plan(node, [cand])
    with caplog.at_level(logging.INFO, logger="hubpool.relay"):
        stream_ended(node, plan, cand, judged([FINAL]), dropped=False)
    assert caplog.messages == [f"hub-b's pooltmpl answers {MODEL} cleanly again"]
    assert plan.row["outcome"] == "pending"  # nothing to record against the answer


def test_a_stream_cut_before_its_final_frame_is_recorded_and_struck():
    node = fake_node()
    node.output_quarantine = Recorder()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand])
    stream_ended(node, plan, cand, judged([b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n']), dropped=False)
    assert plan.row["outcome"] == "failed" and plan.row["reason"] == TRUNCATED
    assert plan.row["requestError"] == {"signature": TRUNCATED, "basis": "node", "confirms": None}
    assert node.output_quarantine.calls == [("strike", (("hub-b", "pooltmpl", "qwen3:8b"), TRUNCATED), {})]


def test_a_dropped_stream_strikes_as_a_dropped_connection_with_or_without_a_judge():
    for judge in (None, judged([b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'])):
        node = fake_node()
        node.output_quarantine = Recorder()
        cand = peer("hub-b", "pooltmpl")
        plan = make_plan(node, [cand])
        stream_ended(node, plan, cand, judge, dropped=True)
        assert node.output_quarantine.calls == [
            ("strike", (("hub-b", "pooltmpl", "qwen3:8b"), f"{TRUNCATED} ({DROPPED})"), {})]
        assert plan.row["outcome"] == "pending"  # the pump records the drop itself


def test_final_frames_are_told_by_the_candidates_engine_or_the_base_rules():
    node = fake_node()
    assert final_frame_check(node, peer("hub-b", "pooltmpl"))(OPENAI, b"[DONE]")
    unknown = final_frame_check(node, peer("hub-b", "unknown"))
    assert unknown(OPENAI, b"[DONE]") and not unknown(OPENAI, b'{"choices": [{"delta": {}}]}')


def test_a_sample_uses_the_engines_timings_when_it_reports_them():
    node = fake_node()
    cand = peer("hub-b", "timed")
    plan = make_plan(node, [cand], estimated_tokens=MIN_PROMPT_TOKENS)
    sample(node, plan, cand, time.monotonic(), b'{"usage": {}}', None)
    assert node.throughput.calls == [
        ("record_prefill", ("hub-b", "timed", "qwen3:8b", MIN_PROMPT_TOKENS, 120.0), {"prompt_tokens": 900, "cached_tokens": 100}),
        ("record_decode", ("hub-b", "timed", "qwen3:8b", 40, 400.0), {})]


def test_a_sample_from_a_stream_without_timings_is_its_wait_for_the_first_byte():
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand], estimated_tokens=MIN_PROMPT_TOKENS)
    judge = judged([FINAL])
    sample(node, plan, cand, judge.first_chunk_at - 0.25, None, judge)
    ((name, args, kwargs),) = node.throughput.calls
    assert name == "record_prefill" and args[:4] == ("hub-b", "pooltmpl", "qwen3:8b", MIN_PROMPT_TOKENS)
    assert args[4] == pytest.approx(250.0) and kwargs["first_byte"] is True


def test_a_short_prompt_gives_no_sample():
    node = fake_node()
    cand = peer("hub-b", "timed")
    sample(node, make_plan(node, [cand], estimated_tokens=MIN_PROMPT_TOKENS - 1), cand, time.monotonic(), b'{"usage": {}}', None)
    assert node.throughput.calls == []


# -- naming what happened on the wire --------------------------------------------------------
def test_transport_errors_are_named_by_their_errno_anywhere_in_the_chain():
    assert transport_code(aiohttp.ClientOSError(111, "Connection refused")) == "ECONNREFUSED"
    assert transport_code(aiohttp.ClientConnectorError(None, ConnectionRefusedError(111, "refused"))) == "ECONNREFUSED"
    wrapped = aiohttp.ClientPayloadError("Response payload is not completed")
    wrapped.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    assert transport_code(wrapped) == "ECONNRESET"
    assert transport_code(aiohttp.ServerDisconnectedError()) == "ServerDisconnectedError"
    looped = aiohttp.ClientPayloadError("cut")
    looped.__cause__ = looped
    assert transport_code(looped) == "ClientPayloadError"  # a cycle ends the search


def test_only_a_close_or_reset_before_any_byte_counts_as_the_keep_alive_race():
    from aiohttp.http_parser import RawResponseMessage

    assert reset_before_answer(aiohttp.ServerDisconnectedError())
    partial = RawResponseMessage(version=(1, 1), code=200, reason="OK", headers=CIMultiDict(), raw_headers=(),
                                 should_close=False, compression=None, upgrade=False, chunked=False)
    assert not reset_before_answer(aiohttp.ServerDisconnectedError(partial))  # the status line had arrived
    assert reset_before_answer(aiohttp.ClientOSError(104, "Connection reset by peer"))
    assert not reset_before_answer(aiohttp.ClientConnectorError(None, ConnectionRefusedError(111, "refused")))
    assert not reset_before_answer(aiohttp.ClientPayloadError("cut"))
