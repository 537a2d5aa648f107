"""The relay's parts that touch the wire, each driven alone with a fake upstream and a
recording ASGI ``send``: the hang-up watch (hangup.py), one attempt and its keep-alive
retry (attempt.py), reading and sending a verdict (verdicts.py), and committing to an
answer and pumping its bytes (pump.py)."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from types import SimpleNamespace

import aiohttp
import pytest
from multidict import CIMultiDict
from test_proxy_parts import MODEL, OwnTemplateEngine, PoolTemplateEngine, Recorder, engine, fake_node, local, peer

from hubpool_core.engine import NATIVE, OPENAI
from hubpool_core.peering.client import PeerAuthError
from hubpool_core.placement.quarantine import DROPPED
from hubpool_core.proxy import LOCAL_PREFIX
from hubpool_core.proxy.attempt import Failed, open_request, send_attempt
from hubpool_core.proxy.connector import SEND_STATE
from hubpool_core.proxy.hangup import ClientGone, Hangup
from hubpool_core.proxy.output_check import TRUNCATED, StreamJudge
from hubpool_core.proxy.plan import RelayPlan
from hubpool_core.proxy.pump import commit, pump, relay_translated
from hubpool_core.proxy.translate import NativeToOpenAI
from hubpool_core.proxy.verdicts import Verdict, read_verdict, send_verdict


class FakeContent:
    """An upstream body: ``chunks`` in order, then ``error`` (if any), then the end. With
    ``hold`` it waits after the chunks until the response is closed."""

    def __init__(self, chunks=(), error=None, hold=False):
        self.chunks, self.error, self.hold = list(chunks), error, hold
        self.eof = False
        self.closed = asyncio.Event() if hold else None

    async def readany(self):
        if self.chunks:
            return self.chunks.pop(0)
        if self.closed is not None:
            await self.closed.wait()
            raise aiohttp.ClientConnectionError("Connection closed")
        if self.error is not None:
            raise self.error
        self.eof = True
        return b""

    async def read(self, n=-1):
        data = b"".join(self.chunks)
        taken, rest = (data, b"") if n < 0 else (data[:n], data[n:])
        self.chunks = [rest] if rest else []
        self.eof = not rest
        return taken

    def at_eof(self):
        return self.eof


class FakeUpstream:
    def __init__(self, status=200, headers=(), **content):
        self.status = status
        self.raw_headers = tuple((k.encode(), v.encode()) for k, v in headers)
        self.headers = CIMultiDict(headers)
        self.content = FakeContent(**content)
        self.released = self.closed = False

    async def read(self):
        return await self.content.read()

    def release(self):
        self.released = True

    def close(self):
        self.closed = True
        if self.content.closed is not None:
            self.content.closed.set()


class Sent(list):
    async def __call__(self, message):
        self.append(message)

    def bodies(self):
        return [(m["body"], m.get("more_body", False)) for m in self if m["type"] == "http.response.body"]


def make_plan(node, candidates=(), **kw):
    row = node.routing_log.open(direction="app", path="/v1/chat/completions", model=MODEL)
    fields = dict(route="/v1/chat/completions", dialect=OPENAI, body={"model": MODEL}, raw=b'{"model": "m"}',
                  model=MODEL, stream=True, candidates=list(candidates), row=row, budget_ms=1000)
    return RelayPlan(**(fields | kw))


SSE = "text/event-stream"
FINAL = b'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
PARTIAL = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'


# -- hangup: awaiting while watching the app -------------------------------------------------
def disconnect_after(event):
    async def receive():
        await event.wait()
        return {"type": "http.disconnect"}
    return receive


def test_until_gives_the_awaited_value_or_a_timeout():
    async def main():
        hangup = Hangup(asyncio.current_task())
        assert await hangup.until(asyncio.sleep(0, "value"), None) == "value"
        with pytest.raises(TimeoutError):
            await hangup.until(asyncio.sleep(5), 0.01)
        assert hangup.waiting is False
    asyncio.run(main())


def test_after_a_hang_up_until_closes_the_work_unstarted():
    async def main():
        hangup = Hangup(asyncio.current_task())
        hangup.gone.set()
        work = asyncio.sleep(5)
        with pytest.raises(ClientGone):
            await hangup.until(work, None)
        assert inspect.getcoroutinestate(work) == inspect.CORO_CLOSED  # never "never awaited"
    asyncio.run(main())


def test_a_hang_up_during_a_wait_cancels_it_and_leaves_the_task_uncancelled():
    async def main():
        hangup = Hangup(asyncio.current_task())
        hang_up = asyncio.Event()
        live = FakeUpstream(hold=True)
        hangup.live = live
        watcher = asyncio.ensure_future(hangup.watch(disconnect_after(hang_up)))
        asyncio.get_running_loop().call_later(0.01, hang_up.set)
        with pytest.raises(ClientGone):
            await hangup.until(asyncio.sleep(5), None)
        await watcher
        assert hangup.gone.is_set() and live.closed
        assert asyncio.current_task().cancelling() == 0 and not hangup.hung_up
    asyncio.run(main())


def test_a_server_cancelling_the_request_is_not_taken_for_a_hang_up():
    async def main():
        hangup = Hangup(None)

        async def waits():
            hangup.task = asyncio.current_task()
            await hangup.until(asyncio.sleep(5), None)

        task = asyncio.ensure_future(waits())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())


def test_the_watch_reads_past_other_messages_until_the_disconnect():
    async def main():
        messages = [{"type": "http.request", "body": b""}, {"type": "http.disconnect"}]

        async def receive():
            return messages.pop(0)

        hangup = Hangup(None)
        await hangup.watch(receive)
        assert hangup.gone.is_set() and messages == []
    asyncio.run(main())


# -- attempt: one candidate, one request -----------------------------------------------------
class Session:
    """node.session: records each post; ``answers`` are what each one's await does in turn."""

    def __init__(self, *answers):
        self.answers, self.posts = list(answers), []

    def post(self, url, data, headers, skip_auto_headers):
        self.posts.append((url, data, headers))
        answer = self.answers.pop(0) if self.answers else None

        async def request():
            return answer(SEND_STATE.get()) if callable(answer) else answer
        return request()


def wire_node(session, auth=None):
    node = fake_node()
    node.session = session

    async def auth_headers(peer, method, path, body):
        if isinstance(auth, Exception):
            raise auth
        return auth or {}

    node.peer_client = SimpleNamespace(auth_headers=auth_headers, base_url=lambda name: f"https://{name}:8443")
    return node


def test_a_local_engine_speaking_the_dialect_gets_the_request_as_sent():
    node = wire_node(Session())
    eng = engine(PoolTemplateEngine)
    plan = make_plan(node, extra_headers={"X-Trace": "t"})
    request, translator = asyncio.run(open_request(node, plan, local(eng), None))
    request.close()
    assert translator is None
    assert node.session.posts == [("http://127.0.0.1:9/v1/chat/completions", plan.raw,
                                   {"Content-Type": "application/json", "X-Trace": "t"})]


def test_a_native_request_to_an_openai_only_engine_is_translated():
    node = wire_node(Session())
    plan = make_plan(node, route="/api/chat", dialect=NATIVE, stream=False,
                     body={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    request, translator = asyncio.run(open_request(node, plan, local(engine()), None))
    request.close()
    assert isinstance(translator, NativeToOpenAI)
    ((url, data, _),) = node.session.posts
    assert url == "http://127.0.0.1:9/v1/chat/completions"
    assert json.loads(data)["messages"] == [{"role": "user", "content": "hi"}]


def test_a_peer_gets_a_signed_forward_naming_the_engine_model_and_request():
    node = wire_node(Session(), auth={"X-Hub-Pool-Signature": "sig"})
    plan = make_plan(node)
    request, translator = asyncio.run(open_request(node, plan, peer("hub-b", "owntmpl"), None))
    request.close()
    ((url, data, headers),) = node.session.posts
    assert url == "https://hub-b:8443" + LOCAL_PREFIX + "/v1/chat/completions" and data == plan.raw
    assert headers == {"Content-Type": "application/json", "X-Hub-Pool-Signature": "sig",
                       "X-Hub-Pool-Backend": "owntmpl", "X-Hub-Pool-Model": MODEL,
                       "X-Hub-Pool-Request-Id": plan.row["id"]}


def test_a_peer_this_node_cannot_sign_for_fails_the_attempt():
    node = wire_node(Session(), auth=PeerAuthError(409, "hub-b is not paired"))
    with pytest.raises(Failed) as failed:
        asyncio.run(open_request(node, make_plan(node), peer("hub-b", "owntmpl"), None))
    assert failed.value.status is None and failed.value.reason == "hub-b is not paired"


def lost_race(state):
    state.reused = True  # as the connector does for a pooled connection
    raise aiohttp.ServerDisconnectedError()


def attempt(node, started=None):
    async def main():
        return await send_attempt(node, make_plan(node), local(engine()), Hangup(asyncio.current_task()),
                                  time.monotonic() if started is None else started, None)
    return asyncio.run(main())


def test_a_kept_alive_connection_closed_as_it_was_reused_is_sent_once_more_on_a_fresh_one(caplog):
    fresh = []
    node = wire_node(Session(lost_race, lambda state: fresh.append(state.fresh) or "answer"))
    with caplog.at_level(logging.INFO, logger="hubpool.relay"):
        assert attempt(node) == ("answer", None)
    assert len(node.session.posts) == 2 and fresh == [True]
    assert caplog.messages == ["local closed a kept-alive connection as it was reused (ServerDisconnectedError): "
                               "sending again on a fresh one"]


def test_a_fresh_connection_closed_before_an_answer_is_not_retried():
    def closed(state):
        raise aiohttp.ServerDisconnectedError()
    node = wire_node(Session(closed))
    with pytest.raises(aiohttp.ServerDisconnectedError):
        attempt(node)
    assert len(node.session.posts) == 1


def test_when_the_retry_fails_too_the_attempt_fails_with_what_happened_first():
    def refused(state):
        raise aiohttp.ClientOSError(111, "Connection refused")
    node = wire_node(Session(lost_race, refused))
    with pytest.raises(aiohttp.ServerDisconnectedError):
        attempt(node)


def test_no_retry_once_the_budget_is_spent():
    node = wire_node(Session(lost_race, "answer"))
    with pytest.raises(TimeoutError):
        attempt(node, started=time.monotonic() - 2)  # the plan's budget is 1 s
    assert len(node.session.posts) == 1


# -- verdicts: reading an engine's 500 and sending it back -----------------------------------
def read(node, cand, body, headers=(("Content-Type", "application/json"),)):
    upstream = FakeUpstream(500, headers, chunks=[body])

    async def main():
        return await read_verdict(node, make_plan(node), cand, upstream, Hangup(asyncio.current_task()))
    return asyncio.run(main())


def test_a_500_naming_a_request_error_is_read_into_a_verdict():
    node = fake_node()
    cand = local(engine(), window=8192)
    body = b'{"error": "the prompt exceeds the context window"}'
    v = read(node, cand, body, headers=(("Content-Type", "application/json"), ("X-Request-Id", "r1")))
    assert v == Verdict("context-length", cand, 500, body,
                        [(b"content-type", b"application/json"), (b"x-request-id", b"r1")], 8192,
                        refused_kinds=frozenset({"pooltmpl"}))


def test_a_template_refusal_from_the_local_engine_also_strikes_its_copy_of_the_model():
    node = fake_node()
    node.unservable = Recorder()
    v = read(node, local(engine(OwnTemplateEngine)), b'{"error": "cannot render the template"}')
    assert v.signature == "chat-template" and v.refused_kinds == {"owntmpl"}
    assert node.unservable.calls == [("strike", (("local", "owntmpl", "qwen3:8b"), "chat-template"), {})]


@pytest.mark.parametrize("body", [b'{"error": "out of memory"}', b"not json", b"[1, 2]",
                                  b'{"error": "' + b"x" * (64 * 1024) + b'"}'])
def test_a_500_that_is_no_verdict_on_the_request_is_none(body):
    assert read(fake_node(), local(engine()), body) is None


def test_a_peer_whose_engine_this_node_does_not_know_gives_no_verdict():
    assert read(fake_node(), peer("hub-b", "unknown"), b'{"error": "no user query"}') is None


@pytest.mark.parametrize(("signature", "status"), [("context-length", 400), ("chat-template", 500)])
def test_a_verdict_goes_back_as_the_engines_own_body_under_this_nodes_attribution(signature, status):
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand])
    v = Verdict(signature, cand, 500, b'{"error": "no"}', [(b"content-type", b"text/plain"), (b"x-id", b"1")],
                None)
    sent = Sent()
    asyncio.run(send_verdict(node, plan, sent, v, "confirmed", "hub-a", time.monotonic()))
    start, body = sent
    assert start["status"] == status and body["body"] == b'{"error": "no"}'
    expected = [(b"x-id", b"1"), (b"content-type", b"application/json"), (b"x-hub-pool-served-by", b"hub-b"),
                (b"x-hub-pool-backend", b"pooltmpl"), (b"x-hub-pool-model", MODEL.encode()),
                (b"x-hub-pool-request-id", plan.row["id"].encode())]
    if status == 400:
        expected.append((b"x-hub-pool-upstream-status", b"500"))
    assert start["headers"] == expected
    assert plan.row["outcome"] == "failed" and plan.row["status"] == 500
    assert plan.row["requestError"] == {"signature": signature, "basis": "confirmed", "confirms": "hub-a"}


# -- commit and the pump ------------------------------------------------------------------
def run(coro_fn):
    async def main():
        return await coro_fn(Hangup(asyncio.current_task()))
    return asyncio.run(main())


def test_a_held_answer_goes_back_in_one_body_message_with_only_the_end_to_end_headers():
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand], stream=False)
    plan.context = SimpleNamespace(response_headers={"X-Hub-Pool-Affinity": "hit"})
    upstream = FakeUpstream(200, [("Content-Type", "application/json"), ("Content-Length", "2"), ("Date", "now"),
                                  ("X-Hub-Pool-Served-By", "spoofed"), ("X-Upstream", "1")], chunks=[b"{}"])
    upstream.content.eof = True  # the held body was all of it
    sent = Sent()
    run(lambda hangup: commit(node, plan, hangup, sent, upstream, cand, None, time.monotonic(), held=b"{}"))
    assert sent[0]["headers"] == [(b"content-type", b"application/json"), (b"x-upstream", b"1"),
                                  (b"x-hub-pool-served-by", b"hub-b"), (b"x-hub-pool-backend", b"pooltmpl"),
                                  (b"x-hub-pool-model", MODEL.encode()),
                                  (b"x-hub-pool-request-id", plan.row["id"].encode()),
                                  (b"x-hub-pool-affinity", b"hit")]
    assert sent.bodies() == [(b"{}", False)]
    assert plan.row["outcome"] == "served" and plan.row["status"] == 200 and plan.row["totalMs"] is not None
    assert upstream.released and not upstream.closed


def test_a_committed_client_error_is_recorded_as_the_requests_own():
    node = fake_node()
    cand = local(engine())
    plan = make_plan(node, [cand])
    upstream = FakeUpstream(404, [("Content-Type", "application/json")], chunks=[b'{"error": "no model"}'])
    sent = Sent()
    run(lambda hangup: commit(node, plan, hangup, sent, upstream, cand, None, time.monotonic()))
    assert sent[0]["status"] == 404 and b"".join(b for b, _ in sent.bodies()) == b'{"error": "no model"}'
    assert plan.row["outcome"] == "failed" and plan.row["reason"] == "HTTP 404"
    assert plan.row["requestError"] == {"signature": "client-error", "basis": "status", "confirms": None}


def test_a_peer_relaying_its_engine_marks_the_answer_with_the_engine_only():
    from hubpool_core.placement import Load

    node = fake_node()
    node.load = Load()
    node.load.local = 2  # this one and another the serving node runs
    cand = local(engine())
    plan = make_plan(node, [cand], inbound_from="hub-a", row_fault=TRUNCATED)
    upstream = FakeUpstream(200, [("Content-Type", SSE)], chunks=[PARTIAL])
    sent = Sent()
    run(lambda hangup: commit(node, plan, hangup, sent, upstream, cand, None, time.monotonic()))
    # the engine's mark, and (hubpool's additive header, docs/placement.md) this node's own load
    # for the sender's view of it: never a served-by or request id, which are the entry node's
    assert sent[0]["headers"] == [(b"content-type", SSE.encode()), (b"x-hub-pool-backend", b"pooltmpl"),
                                  (b"x-hub-pool-in-flight", str(node.load.local).encode())]
    assert plan.row["outcome"] == "failed" and plan.row["reason"] == TRUNCATED  # the fault found before commit


def test_a_judged_stream_is_pumped_chunk_by_chunk_and_its_judge_returned():
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand])
    upstream = FakeUpstream(200, [("Content-Type", SSE)], chunks=[PARTIAL, FINAL])
    sent = Sent()
    judge = run(lambda hangup: commit(node, plan, hangup, sent, upstream, cand, None, time.monotonic(),
                                      judged=True))
    assert isinstance(judge, StreamJudge) and judge.verdict() is None
    assert sent.bodies() == [(PARTIAL, True), (FINAL, True), (b"", False)]
    assert plan.row["outcome"] == "served" and upstream.released


def test_a_translated_stream_goes_back_as_ndjson():
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand], route="/api/chat", dialect=NATIVE)
    translator = NativeToOpenAI("/api/chat", {"model": MODEL, "messages": []}, True)
    upstream = FakeUpstream(200, [("Content-Type", SSE)], chunks=[PARTIAL, FINAL])
    sent = Sent()
    run(lambda hangup: relay_translated(node, plan, hangup, sent, upstream, cand, translator, True, [], None,
                                       None))
    assert sent[0]["headers"] == [(b"content-type", b"application/x-ndjson")]
    lines = [json.loads(body) for body, more in sent.bodies() if body]
    assert [(line["message"]["content"], line["done"]) for line in lines] == [("hi", False), ("hi", False),
                                                                              ("", True)]
    assert sent.bodies()[-1] == (b"", False)


def test_an_app_hanging_up_mid_stream_stops_the_pump_where_it_is():
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand])
    upstream = FakeUpstream(200, [("Content-Type", SSE)], chunks=[PARTIAL], hold=True)
    sent = Sent()

    async def main(hangup):
        hang_up = asyncio.Event()

        async def send(message):
            await sent(message)
            hang_up.set()  # the app leaves once it has the first chunk

        watcher = asyncio.ensure_future(hangup.watch(disconnect_after(hang_up)))
        await pump(node, plan, hangup, send, upstream, lambda chunk: (chunk,), cand=cand)
        await watcher

    run(main)
    assert sent.bodies() == [(PARTIAL, True)]  # no end of body for an app that is gone
    assert upstream.closed  # the watcher closed the upstream, which woke the pump's read
    assert plan.row["clientClosed"] is True and plan.row["reason"] == "the app closed its connection mid-response"


def test_a_stream_cut_mid_way_is_recorded_truncated_and_strikes_the_engine():
    node = fake_node()
    node.output_quarantine = Recorder()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand])
    upstream = FakeUpstream(chunks=[PARTIAL], error=aiohttp.ClientPayloadError("Response payload is not completed"))
    sent = Sent()
    run(lambda hangup: pump(node, plan, hangup, sent, upstream, lambda chunk: (chunk,), cand=cand))
    assert sent.bodies() == [(PARTIAL, True), (b"", False)]
    assert plan.row["outcome"] == "failed" and plan.row["reason"] == f"{TRUNCATED} (ClientPayloadError)"
    assert node.output_quarantine.calls == [("strike", (("hub-b", "pooltmpl", "qwen3:8b"),
                                                         f"{TRUNCATED} ({DROPPED})"), {})]


def test_a_stream_cut_after_its_final_frame_was_whole(caplog):
    node = fake_node()
    cand = peer("hub-b", "pooltmpl")
    plan = make_plan(node, [cand])
    node.output_quarantine.strike(("hub-b", "pooltmpl", "qwen3:8b"), TRUNCATED)
    upstream = FakeUpstream(chunks=[FINAL], error=aiohttp.ClientPayloadError("cut"))
    judge = StreamJudge(OPENAI, engine().is_final_frame)
    with caplog.at_level(logging.DEBUG, logger="hubpool.relay"):
        run(lambda hangup: pump(node, plan, hangup, Sent(), upstream, lambda chunk: (chunk,), judge=judge,
                                cand=cand))
    assert plan.row["outcome"] == "pending"  # nothing failed: the app got all of it
    assert caplog.messages == [f"{MODEL} closed after the final frame of {plan.row['id']} (ClientPayloadError)",
                               f"hub-b's pooltmpl answers {MODEL} cleanly again"]
