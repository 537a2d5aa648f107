"""Which translator carries a request to an engine that does not serve its dialect, and the
one interface every translator has (so the attempt and the pump need not know which)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from hubpool_core.engine import COUNT_TOKENS, MESSAGES, NATIVE, RESPONSES
from hubpool_core.proxy.translate import NativeToOpenAI
from hubpool_core.proxy.translate_messages import MessagesToChat
from hubpool_core.proxy.translate_responses import ResponsesToChat

#: the dialects a request can be translated from, to the engine's chat completions
TRANSLATED: dict[str, Any] = {NATIVE: NativeToOpenAI, MESSAGES: MessagesToChat, COUNT_TOKENS: MessagesToChat,
              RESPONSES: ResponsesToChat}


class Translator(Protocol):
    """One translated exchange: the request as the engine's OpenAI dialect, then its answer
    back in the app's (a whole body, or a stream fed chunk by chunk and ended)."""

    upstream_route: str
    upstream_body: dict[str, Any]
    stream_content_type: bytes

    def whole(self, status: int, raw: bytes) -> bytes: ...

    def feed(self, chunk: bytes) -> Iterable[bytes]: ...

    def end(self) -> Iterable[bytes]: ...


def translator_for(dialect: str, route: str, body: dict[str, Any], stream: bool) -> Translator | None:
    """The translator for a request in ``dialect``, or None when there is none (rerank:
    only an engine that reranks can answer it)."""
    cls = TRANSLATED.get(dialect)
    translator: Translator | None = cls(route, body, stream) if cls is not None else None
    return translator
