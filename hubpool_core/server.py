"""Running a node under uvicorn (uvloop and httptools, as measured in perf-baseline)."""

from __future__ import annotations

import logging
import sys

import uvicorn

from hubpool_core.app import create_app
from hubpool_core.config import EnvSettings
from hubpool_core.node import Node

#: seconds a stopping node lets in-flight streams finish before closing them
GRACEFUL_SHUTDOWN_S = 30
#: seconds an idle keep-alive connection stays open. Longer than aiohttp's client keep-alive
#: (15 s) on purpose: when the server closes first, a peer that reuses the connection at that
#: instant gets a reset (ClientOSError) and the forward fails before it was sent; uvicorn's
#: default is 5 s. Measured: 2 resets in 24 reuses at the server's timeout, none beyond it.
KEEP_ALIVE_S = 75


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def make_config(env: EnvSettings, node: Node | None = None, log_level: str = "info") -> uvicorn.Config:
    node = node or Node(env)
    host, port = env.host_port
    return uvicorn.Config(
        create_app(node), host=host, port=port, loop="uvloop", http="httptools",
        log_level=log_level.lower(), access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        lifespan="on",
        # The guards read forwarded headers themselves (and trust them only under
        # HUB_TRUST_PROXY); uvicorn must not rewrite the client address or scheme first.
        proxy_headers=False,
    )


def run_node(env: EnvSettings, log_level: str = "info") -> None:
    configure_logging(log_level)
    node = Node(env)
    logging.getLogger("hubpool").info("node listening on %s (data in %s)", env.base_url, env.data_dir)
    uvicorn.Server(make_config(env, node, log_level)).run()
