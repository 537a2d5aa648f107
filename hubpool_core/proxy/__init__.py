"""The proxy: carry one placed request to its candidates and the answer back to the app.

- ``plan.py``: the plan a route handler builds, its budgets, and the headers every part states.
- ``walk.py``: the ASGI response and the failover walk, one attempt per candidate in order.
- ``attempt.py``: one upstream attempt: open, send within the budget, the one keep-alive retry.
- ``connector.py``: the aiohttp connector that says whether a request reused a pooled connection.
- ``hangup.py``: watching the app's connection, and awaiting upstream work a hang-up stops.
- ``verdicts.py``: an engine's 500 that is a verdict on the request: read, settled, sent.
- ``failover.py``: which statuses fail over, the passed-over record, the 502 when all failed.
- ``pump.py``: holding a stream to its first real content, committing to an answer and
  passing its bytes as they arrive.
- ``content.py``: what a stream's frames say: real content or not, keep-alives, generated text.
- ``front.py``: the app's side of a waiting stream: keep-alives, and the dialect's error event.
- ``watch.py``, ``loops.py``: a committed stream's stall timer and loop rule, and its ending.
- ``resume.py``: continuing a cut stream on the next candidate, spliced into the same stream.
- ``judge.py``: what a judged answer does to its engine's withhold, and throughput samples.
- ``output_check.py``: judging a 200 that may not be an answer.
- ``translate.py``: the translator interface and which one a request needs; native (NDJSON)
  requests served by an OpenAI-only engine.
- ``translate_chat.py``: reading an engine's chat-completions answer for the two below.
- ``translate_messages.py``, ``translate_responses.py``: Anthropic Messages (and
  count_tokens) and OpenAI Responses requests served by a chat-completions engine.
- ``response_homes.py``: which node and engine hold each stored Responses answer.

The rest of the core uses the names below, and telemetry the fault names of ``output_check``.
"""

from hubpool_core.proxy.connector import ReuseAwareConnector
from hubpool_core.proxy.plan import LOCAL_PREFIX, Budgets, RelayPlan
from hubpool_core.proxy.walk import RelayResponse

__all__ = ["LOCAL_PREFIX", "Budgets", "RelayPlan", "RelayResponse", "ReuseAwareConnector"]
