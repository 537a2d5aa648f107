"""What a resumed stream must look like to its app (issue 28 item 4): one answer, whichever
engines wrote it. Shared by the resume tests that run whole processes (tests/fault/F14) and
real llama-servers (tests/real_engine/test_resume_real.py)."""

from __future__ import annotations

import json

from streams import events


def one_stream(dialect: str, raw: bytes, text: str, tokens: int) -> None:
    """``raw`` (the app's stream of ``dialect``, whose answer is ``text``) is one answer: one
    opening (role chunk, ``message_start``, ``response.created``), one id, content-block index 0
    throughout, sequence numbers 0…n where the engine numbers them, one ending, and usage
    summed to the whole answer's ``tokens``."""
    if dialect == "native":
        lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        assert [line.get("done") for line in lines].count(True) == 1 and lines[-1]["done"] is True, lines[-2:]
        assert lines[-1]["eval_count"] == tokens, lines[-1]
        return
    seen = events(raw)
    if dialect == "openai":
        chunks = [d for _n, d in seen if isinstance(d, dict)]
        assert seen[-1][1] == "[DONE]"
        assert len({c["id"] for c in chunks}) == 1
        assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 1
        assert sum(bool(c["choices"] and c["choices"][0]["finish_reason"]) for c in chunks) == 1
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert len(usage) == 1 and usage[0]["completion_tokens"] == tokens, usage
    elif dialect == "messages":
        names = [n for n, _d in seen]
        assert names.count("message_start") == 1 and names[-1] == "message_stop", names
        assert [d["index"] for n, d in seen if n == "content_block_start"] == [0]
        assert {d["index"] for n, d in seen if n in ("content_block_delta", "content_block_stop")} == {0}
        assert names.count("content_block_stop") == 1
        [delta] = [d for n, d in seen if n == "message_delta"]
        assert delta["usage"]["output_tokens"] == tokens, delta
    else:
        names = [d["type"] for _n, d in seen]
        assert names.count("response.created") == 1, names
        assert names[-1] in ("response.completed", "response.incomplete"), names[-3:]
        numbers = [d["sequence_number"] for _n, d in seen if "sequence_number" in d]
        assert numbers in ([], list(range(len(seen)))), numbers
        first, final = seen[0][1]["response"], seen[-1][1]["response"]
        assert final["id"] == first["id"]
        assert len({d["item_id"] for _n, d in seen if "item_id" in d}) == 1
        assert final["output"][0]["content"][0]["text"] == text
        assert final["usage"]["output_tokens"] == tokens, final["usage"]
