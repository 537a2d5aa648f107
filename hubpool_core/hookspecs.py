"""The whole plugin contract of hubpool, one hook per section.

Every hook runs **once, at start-up**, to register things; the core then calls what
was registered directly. pluggy has no async and a raising hookimpl stops the whole
hook call, so nothing on the request path goes through a hook. Each hook receives a
``register`` callable; calling it more than once registers several things.

Plugins are found through the ``hubpool.plugins`` entry-point group. The value of an
entry point is a module holding ``@hookimpl`` functions; its name is the plugin name
used everywhere (``HUB_POOL_PLUGINS_DISABLED``, ``hubpool plugins``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "hubpool"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def hubpool_register_engines(register: Callable[[type], None]) -> None:
    """Register :class:`hubpool_core.engine.Engine` subclasses, one per kind of engine.

    The core builds one instance per base URL (``<Engine>.env_var`` or
    ``<Engine>.default_url``) and calls it for health probes, model inventory,
    residency, timings and cache counts, final-frame recognition and error verdicts.
    Two engines registering the same ``kind`` is a load error for the second.
    """


@hookspec
def hubpool_register_directories(register: Callable[[type], None]) -> None:
    """Register :class:`hubpool_core.directory.Directory` subclasses.

    Directories name unpaired pairing candidates and, for the tailnet's own daemon,
    this node's tailnet status (``Directory.tailnet_status``). A directory that is not
    configured must make no network call.
    """


@hookspec
def hubpool_register_pressure_sources(register: Callable[[type], None]) -> None:
    """Register :class:`hubpool_core.pressure.PressureSource` subclasses.

    Sources are tried in ``order`` by the GPU-pressure sampler; ``read()`` returns a busy
    fraction in 0..1 or ``None`` for "cannot measure here" (never idle).
    """


@hookspec
def hubpool_register_stages(register: Callable[[type], None]) -> None:
    """Register :class:`hubpool_core.stage.Stage` subclasses, the placement rules.

    The pipeline sorts them by ``order`` once; each writes its own routing-log section
    and is skipped entirely while its knob is off.
    """


@hookspec
def hubpool_register_container_stats(register: Callable[[Callable[[], Any]], None]) -> None:
    """Register a zero-argument callable returning container counts
    ``{running, stopped, total, cpuPercent, memoryBytes}`` or ``None`` when it cannot
    say — or a class, which the node instantiates once with its environment settings (as
    directories and pressure sources are) and then calls. Called in a worker thread off
    the poll path by a sampler, every 60 s; ``docker_stats`` is the first-party source."""


@hookspec
def hubpool_register_cli_commands(app: Any) -> None:
    """Add commands to the ``hubpool`` CLI. ``app`` is the root ``typer.Typer``; add
    commands or sub-apps to it. Runs when the CLI starts, not in ``hubpool serve``."""


@hookspec
def hubpool_register_doctor_checks(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register ``hubpool doctor`` checks as ``register(check_id, check)``. ``check`` takes
    the running node (read it, never change it: its ``settings.current``, ``peers.all()``,
    ``local.engines``) and returns ``(level, message)`` with level one of ``ok``, ``warn`` or
    ``fail``; the message says what to do next. A raising check is reported as a warning."""


@hookspec
def hubpool_request_finished(row: dict[str, Any]) -> None:
    """Broadcast: a routing-log row settled. ``row`` is the row as the routing log
    serves it (metadata only, never a prompt). Called off the relay's hot path after the
    response ended; a raising observer is logged and ignored."""
