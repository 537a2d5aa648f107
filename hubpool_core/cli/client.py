"""How the CLI reaches its own node: the node's address and operator key from this
machine's environment and data directory. httpx is fine here: this is off the hot path."""

from __future__ import annotations

from typing import Any

import httpx

from hubpool_core.access.credentials import read_operator_key
from hubpool_core.config import EnvSettings

GET_TIMEOUT_S = 10
WRITE_TIMEOUT_S = 30


class NodeError(Exception):
    """A sentence for the operator."""


class NodeClient:
    def __init__(self, base_url: str, key: str | None):
        self.base_url = base_url.rstrip("/")
        self.key = key

    @classmethod
    def from_environment(cls, url: str | None = None) -> NodeClient:
        env = EnvSettings()
        key = env.operator_key or read_operator_key(env.data_dir)
        return cls(url or env.base_url, key)

    def _headers(self) -> dict[str, str]:
        if not self.key:
            raise NodeError(
                "no operator key found: start the node once with `hubpool serve` (it writes operator.key to "
                "its data directory), run the CLI with the same HUB_POOL_DATA_DIR, or set HUB_POOL_OPERATOR_KEY"
            )
        return {"Authorization": f"Bearer {self.key}"}

    def request(self, method: str, path: str, body: Any = None) -> Any:
        timeout = GET_TIMEOUT_S if method == "GET" else WRITE_TIMEOUT_S
        try:
            answer = httpx.request(method, self.base_url + path, json=body, headers=self._headers(),
                                   timeout=timeout, trust_env=False)
        except httpx.ConnectError:
            raise NodeError(f"no node answers at {self.base_url}: is `hubpool serve` running here, with the same "
                            "HUB_POOL_LISTEN? (or pass --url)") from None
        except httpx.HTTPError as exc:
            raise NodeError(f"{self.base_url} did not answer: {type(exc).__name__}") from None
        try:
            data = answer.json()
        except ValueError:
            data = None
        if answer.status_code >= 400:
            message = data.get("error") if isinstance(data, dict) else None
            if isinstance(message, dict):
                message = message.get("message")
            raise NodeError(f"the node answered {answer.status_code}: {message or answer.text[:300]}")
        return data

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)
