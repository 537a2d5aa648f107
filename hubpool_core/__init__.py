"""hubpool's core and its plugin API.

Plugins import what they implement from here::

    from hubpool_core import hookimpl, Engine, ProbeResult, ModelInfo

The top level holds that API and the foundations every room shares: ``hookspecs.py`` (the
plugin contract), ``engine.py``, ``directory.py``, ``pressure.py`` and ``stage.py`` (the
ABCs), ``plugins.py`` (the plugin host), ``config.py`` (environment and pool settings),
``models_ids.py``, ``periodic.py`` and ``testing.py`` (aids for plugin tests). The rooms are
subpackages; ARCHITECTURE.md maps them.
"""

import sys as _sys

# httpx imports its own command line (click, rich, pygments: about 8 MB resident) as it is
# imported; nothing that imports hubpool_core runs it. A None entry makes that one import fail,
# which httpx handles (its `main` then asks for httpx[cli]); the `httpx` command is unaffected.
if "httpx" not in _sys.modules:
    _sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

from hubpool_core.directory import Directory, DirectoryCandidate, TailnetStatus  # noqa: E402
from hubpool_core.engine import (
    AGENT_DIALECTS,
    COUNT_TOKENS,
    MESSAGES,
    NATIVE,
    OPENAI,
    REQUEST_ERROR_SIGNATURES,
    RERANK,
    RESPONSES,
    Engine,
    EngineConfig,
    JsonAnswer,
    ModelInfo,
    ProbeResult,
    ResidentModel,
    Timings,
    error_message,
)
from hubpool_core.hookspecs import hookimpl
from hubpool_core.pressure import PressureSource
from hubpool_core.stage import Stage

__version__ = "0.1.0"

__all__ = [
    "AGENT_DIALECTS",
    "COUNT_TOKENS",
    "MESSAGES",
    "NATIVE",
    "OPENAI",
    "REQUEST_ERROR_SIGNATURES",
    "RERANK",
    "RESPONSES",
    "Directory",
    "DirectoryCandidate",
    "Engine",
    "EngineConfig",
    "JsonAnswer",
    "ModelInfo",
    "PressureSource",
    "ProbeResult",
    "ResidentModel",
    "Stage",
    "TailnetStatus",
    "Timings",
    "error_message",
    "hookimpl",
]
