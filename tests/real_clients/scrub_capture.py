"""Turn one captured request of a real agent client into a fixture we may commit.

    uv run python tests/real_clients/scrub_capture.py RAW.json OUT.json [--agent NAME --version V]
        [--keep "the test's own prompt"]

RAW is what tests/real_clients/capture.py records: ``{"method", "path", "headers", "body"}``
with the body as the exact text sent. The fixture keeps the request's shape and nothing of
the client's prose or anyone's identity:

- keys are removed (``Authorization``, ``x-api-key``), and so are the transport's own
  headers (``Host``, ``Content-Length``: a replay sets its own);
- every id that names a person, a machine or a session (UUIDs, long hex strings, in headers,
  body fields and JSON inside strings alike) becomes a stand-in of the same shape, the same
  stand-in wherever the same id appeared, so "the session header equals prompt_cache_key"
  still holds;
- the clients' own prompt and tool-description text (every string under ``text``,
  ``description``, ``content``, ``instructions``, ``output``, ``prompt``, and any other long
  string of words) is replaced by filler of the same length: the same characters count and
  the same whitespace, every other character a letter. The test's own prompt (``--keep``)
  stays as it was.

Everything structural stays: field names, roles, types, tool names and schemas, betas,
``max_tokens``, flags. The scrub is deterministic: the same capture gives the same fixture.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

DROP_HEADERS = {"authorization", "x-api-key", "host", "content-length"}
PROSE_KEYS = {"text", "description", "content", "instructions", "output", "prompt"}
#: a string this long with spaces in it is prose wherever it sits
PROSE_LENGTH = 80
FILLER = "loremipsumdolorsitametconsecteturadipiscingelitseddoeiusmodtemporincididuntutlaboreetdolore"
UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
LONG_HEX = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{32,}(?![0-9a-fA-F])")


class Scrubber:
    def __init__(self, keep: tuple[str, ...] = ()) -> None:
        self.keep = set(keep)
        self.ids: dict[str, str] = {}

    def _stand_in(self, value: str) -> str:
        if value not in self.ids:
            digest = hashlib.sha256(f"hubpool-fixture-{len(self.ids)}".encode()).hexdigest()
            digest = (digest * (len(value) // len(digest) + 1))[: len(value)]
            # the same shape: dashes where the id had them, hex digits elsewhere
            self.ids[value] = "".join("-" if c == "-" else d for c, d in zip(value, digest, strict=True))
        return self.ids[value]

    def ids_in(self, text: str) -> str:
        """Every id in ``text`` replaced by its stand-in."""
        text = UUID.sub(lambda m: self._stand_in(m.group(0).lower()), text)
        return LONG_HEX.sub(lambda m: self._stand_in(m.group(0).lower()), text)

    @staticmethod
    def filler(text: str) -> str:
        """``text`` with every non-whitespace character a letter: same length, same lines."""
        out, i = [], 0
        for c in text:
            if c.isspace():
                out.append(c)
            else:
                out.append(FILLER[i % len(FILLER)])
                i += 1
        return "".join(out)

    def value(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {k: self.value(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v, key) for v in value]
        if not isinstance(value, str) or value in self.keep:
            return value
        if _is_json_object(value):  # JSON inside a string (metadata.user_id): ids only
            return self.ids_in(value)
        if (key in PROSE_KEYS and value.strip()) or (len(value) >= PROSE_LENGTH and " " in value.strip()):
            return self.filler(value)
        return self.ids_in(value)

    def headers(self, headers: dict[str, str]) -> dict[str, str]:
        return {k: self.ids_in(v) for k, v in headers.items() if k.lower() not in DROP_HEADERS}


def _is_json_object(text: str) -> bool:
    if not text.startswith("{"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def scrub(raw: dict[str, Any], *, agent: str, version: str, keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fixture for one raw capture (see the module docstring)."""
    s = Scrubber(keep)
    body = json.loads(raw["body"])
    return {"agent": agent, "version": version, "method": raw["method"], "path": s.ids_in(raw["path"]),
            "capturedBytes": len(raw["body"].encode()), "headers": s.headers(raw["headers"]), "body": s.value(body)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--agent", default="unknown")
    parser.add_argument("--version", default="unknown")
    parser.add_argument("--keep", action="append", default=[], help="a string to keep as it is (the test's prompt)")
    args = parser.parse_args(argv)
    fixture = scrub(json.loads(args.raw.read_text()), agent=args.agent, version=args.version, keep=tuple(args.keep))
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out} ({len(json.dumps(fixture['body']))} bytes of body)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
