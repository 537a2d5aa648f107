"""Configuration: the environment (read once at start) and the persisted pool settings.

Environment variables keep the spec's names exactly. A few are documented as "read per
request" by the spec; those are read through :func:`env_flag_off` and friends at the
point of use, not cached here.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Annotated, Any, cast

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORT = 5002
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024

log = logging.getLogger("hubpool.config")


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "hubpool"


def _alias(name: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(name))


class EnvSettings(BaseSettings):
    """Every environment variable hubpool reads, under the spec's names."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    data_dir: Path = Field(default_factory=_default_data_dir, validation_alias="HUB_POOL_DATA_DIR")
    database_url: str | None = _alias("HUB_POOL_DATABASE_URL")
    listen: str = Field(default=f"127.0.0.1:{DEFAULT_PORT}", validation_alias="HUB_POOL_LISTEN")
    operator_key: str | None = _alias("HUB_POOL_OPERATOR_KEY")
    plugins_disabled: str = Field(default="", validation_alias="HUB_POOL_PLUGINS_DISABLED")
    peer_urls: str | None = _alias("HUB_POOL_PEER_URLS")
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, validation_alias="HUB_POOL_MAX_BODY_BYTES")

    # kill switches: only the literal string "true" counts, as in the spec
    user_disabled: str | None = _alias("HUB_POOL_USER_DISABLED")
    outbound_disabled: str | None = _alias("HUB_POOL_OUTBOUND_DISABLED")
    inbound_disabled: str | None = _alias("HUB_POOL_INBOUND_DISABLED")

    # raw strings: the spec says a malformed value is ignored, never guessed at
    max_prompt_tokens: str | None = _alias("HUB_POOL_MAX_PROMPT_TOKENS")
    first_byte_timeout_ms: str | None = _alias("HUB_POOL_FIRST_BYTE_TIMEOUT_MS")
    completion_timeout_ms: str | None = _alias("HUB_POOL_COMPLETION_TIMEOUT_MS")
    min_prefill_tokens_per_sec: str | None = _alias("HUB_POOL_MIN_PREFILL_TOKENS_PER_SEC")
    routing_log_size: str | None = _alias("HUB_POOL_ROUTING_LOG_SIZE")
    # routing history (docs/history.md): off unless set; `sqlite` (history.db in the data
    # directory) or a database URL; rows older than the retention are pruned
    history: str | None = _alias("HUB_POOL_HISTORY")
    history_retention_days: str | None = _alias("HUB_POOL_HISTORY_RETENTION_DAYS")
    history_flush_ms: str | None = _alias("HUB_POOL_HISTORY_FLUSH_MS")
    # test rigs only (docs/reliability.md): the fault suite needs 1 s polls and header budgets
    # of a second or two, below what the persisted setting (10 s) and the 15 s floor allow
    dev_health_poll_seconds: str | None = _alias("HUB_POOL_DEV_HEALTH_POLL_SECONDS")
    # the busy load poll's interval for test and bench rigs whose clock runs faster (50-10000 ms)
    dev_load_poll_ms: str | None = _alias("HUB_POOL_DEV_LOAD_POLL_MS")
    dev_first_byte_floor_ms: str | None = _alias("HUB_POOL_DEV_FIRST_BYTE_FLOOR_MS")
    # bench rigs whose simulated engines run this many times faster than the wall (1-100) and
    # report durations on their own clock: the admission queue counts its waits on that clock
    dev_clock_speedup: str | None = _alias("HUB_POOL_DEV_CLOCK_SPEEDUP")
    # ... and nodes whose clocks disagree: shifts the clock this node signs peer requests by and
    # judges theirs against (milliseconds, ±1 day; negative lags behind)
    dev_clock_offset_ms: str | None = _alias("HUB_POOL_DEV_CLOCK_OFFSET_MS")
    # read per request by placement (see env_flag_off); listed here so every name is in one place
    throughput_placement: str | None = _alias("HUB_POOL_THROUGHPUT_PLACEMENT")
    contention_placement: str | None = _alias("HUB_POOL_CONTENTION_PLACEMENT")
    slower_placement_ratio: str | None = _alias("HUB_POOL_SLOWER_PLACEMENT_RATIO")
    slower_placement_floor_ms: str | None = _alias("HUB_POOL_SLOWER_PLACEMENT_FLOOR_MS")
    prefix_affinity_ttl_ms: str | None = _alias("HUB_POOL_PREFIX_AFFINITY_TTL_MS")

    # directories, pressure and transport
    tailscale_cli: str = Field(default="tailscale", validation_alias="HUB_POOL_TAILSCALE_CLI")
    tailscale_oauth_client_id: str | None = _alias("TAILSCALE_OAUTH_CLIENT_ID")
    tailscale_oauth_client_secret: str | None = _alias("TAILSCALE_OAUTH_CLIENT_SECRET")
    tailscale_api_url: str = Field(default="https://api.tailscale.com", validation_alias="HUB_POOL_TAILSCALE_API_URL")
    portal_url: str | None = _alias("HUB_POOL_PORTAL_URL")
    amd_drm_root: str = Field(default="/sys/class/drm", validation_alias="HUB_POOL_AMD_DRM_ROOT")
    pressure_host_file: str | None = _alias("HUB_POOL_PRESSURE_HOST_FILE")
    hardware_tier: str | None = _alias("HUB_POOL_HARDWARE_TIER")
    trust_proxy: str | None = _alias("HUB_TRUST_PROXY")

    _environ: dict[str, str] = PrivateAttr(default_factory=lambda: dict(os.environ))

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> EnvSettings:
        """Settings from an explicit mapping instead of the process environment (several
        nodes in one test process each get their own)."""
        # every alias is a name or _alias()'s AliasChoices of one name
        aliases = {f.validation_alias if isinstance(f.validation_alias, str)
                   else cast(AliasChoices, f.validation_alias).choices[0]
                   for f in cls.model_fields.values() if f.validation_alias is not None}
        # raw strings, validated and coerced by pydantic as the process environment is
        values: dict[str, Any] = {k: v for k, v in environ.items() if k in aliases}
        # _env_file is BaseSettings.__init__'s own argument, which its typed __init__ (the fields) omits
        settings = cls(_env_file=None, **values)  # type: ignore[call-arg]
        settings._environ = dict(environ)
        return settings

    def environ(self) -> dict[str, str]:
        return self._environ

    @field_validator("max_body_bytes", mode="before")
    @classmethod
    def _strict_body_limit(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        value = whole_in_range(raw, 1, None)
        if value is None:
            refuse_once("HUB_POOL_MAX_BODY_BYTES", raw, "a whole number of bytes from 1")
            return DEFAULT_MAX_BODY_BYTES
        return value

    @model_validator(mode="after")
    def _strict_numbers(self) -> EnvSettings:
        """Every numeric variable through one strict parser: a value it refuses is logged once
        and dropped here, so each reader sees it unset and uses its default."""
        for name, (minimum, maximum) in WHOLE_NUMBER_ENV.items():
            raw = getattr(self, name)
            if raw is not None and raw.strip() and whole_in_range(raw, minimum, maximum) is None:
                refuse_once(env_variable(name), raw, _whole_range_words(minimum, maximum))
                setattr(self, name, None)
        if _listen_port(self.listen) is None:
            refuse_once("HUB_POOL_LISTEN", self.listen, "host:port with a port from 0 to 65535 (or a bare port)")
            self.listen = f"127.0.0.1:{DEFAULT_PORT}"
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        """``HUB_POOL_LISTEN`` as (host, port); a bare port binds loopback."""
        return listen_host_port(self.listen)

    @property
    def base_url(self) -> str:
        return local_base_url(self.listen)

    @property
    def disabled_plugin_names(self) -> set[str]:
        return {n.strip() for n in self.plugins_disabled.split(",") if n.strip()}

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'hubpool.db'}"

    def resolved_history_url(self) -> str | None:
        """Where routing history goes, or None when it is off (HUB_POOL_HISTORY unset or empty)."""
        raw = (self.history or "").strip()
        if not raw or raw.lower() in ("off", "false", "0", "no"):
            return None
        if raw.lower() in ("sqlite", "on", "true", "1", "yes"):
            return f"sqlite:///{self.data_dir / 'history.db'}"
        return raw



# -- numbers from the environment, query strings and the command line ---------------------

#: a whole number as an operator types one: ASCII digits after at most one minus. ``str.isdigit``
#: and ``int`` also take "²", "٣" or "１２" (and isdigit then int raises); 18 digits keep int()
#: far from its length limit
_WHOLE = re.compile(r"-?[0-9]{1,18}")
_DECIMAL = re.compile(r"-?[0-9]{1,18}(?:\.[0-9]{1,18})?")

#: every whole-number variable read from the environment: field -> (minimum, maximum). A value
#: outside, or not a whole number at all, is logged once and ignored (the default applies), as
#: the spec says of HUB_POOL_MAX_PROMPT_TOKENS: "ignored rather than guessed at".
WHOLE_NUMBER_ENV: dict[str, tuple[int, int | None]] = {
    "max_prompt_tokens": (1024, 1_048_576),
    "first_byte_timeout_ms": (1, None),
    "completion_timeout_ms": (1, None),
    "min_prefill_tokens_per_sec": (1, None),
    "routing_log_size": (0, None),  # then held to 200-10,000 where the ring is built
    "history_flush_ms": (50, 60_000),
    "dev_health_poll_seconds": (1, 300),
    "dev_first_byte_floor_ms": (100, 15_000),
    "dev_clock_offset_ms": (-86_400_000, 86_400_000),
}


def parse_whole(raw: str | None) -> int | None:
    """``raw`` as a whole number (ASCII digits, one optional leading minus, blanks around
    ignored), or None when it is not one: never an exception."""
    if raw is None:
        return None
    text = raw.strip()
    return int(text) if _WHOLE.fullmatch(text) else None


def parse_decimal(raw: str | None) -> float | None:
    """``raw`` as a number with an optional fraction (``1.5``), by the same ASCII rule; no
    exponent, ``inf`` or ``nan``."""
    if raw is None:
        return None
    text = raw.strip()
    return float(text) if _DECIMAL.fullmatch(text) else None


def whole_in_range(raw: str | None, minimum: int | None, maximum: int | None) -> int | None:
    """:func:`parse_whole`, and None as well when the number is outside the bounds given."""
    value = parse_whole(raw)
    if value is None or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        return None
    return value


def env_int(raw: str | None, *, minimum: int, maximum: int | None = None) -> int | None:
    """Parse an integer environment value, ``None`` when absent, malformed or out of range."""
    return whole_in_range(raw, minimum, maximum)


def _whole_range_words(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"a whole number from {minimum} to {maximum}"
    return f"a whole number from {minimum}" if minimum is not None else "a whole number"


def env_variable(field: str) -> str:
    """The environment variable an :class:`EnvSettings` field is read from."""
    alias = EnvSettings.model_fields[field].validation_alias
    return alias if isinstance(alias, str) else cast(AliasChoices, alias).choices[0]  # type: ignore[return-value]


#: (variable, value) pairs already said: each refused value is logged once per process
_REFUSED: set[tuple[str, str]] = set()


def refuse_once(variable: str, raw: str, expected: str) -> None:
    """Say once that ``variable`` holds a value that is ignored (and its default used)."""
    key = (variable, raw)
    if key in _REFUSED:
        return
    if len(_REFUSED) < 1024:  # a bound, though a process meets only a few variables
        _REFUSED.add(key)
    log.warning("%s=%r is not %s: it is ignored rather than guessed at, and the default applies",
                variable, raw[:80], expected)


def _listen_port(listen: str) -> int | None:
    value = listen.strip()
    port = value if ":" not in value else value.rpartition(":")[2]
    return whole_in_range(port, 0, 65_535) if port else DEFAULT_PORT


def listen_host_port(listen: str) -> tuple[str, int]:
    """``HUB_POOL_LISTEN`` as (host, port); a bare port binds loopback."""
    value = listen.strip()
    if ":" not in value:
        return "127.0.0.1", _listen_port(value) or DEFAULT_PORT
    host, _, _ = value.rpartition(":")
    return (host.strip("[]") or "127.0.0.1"), _listen_port(value) or DEFAULT_PORT


def local_base_url(listen: str) -> str:
    """Where a process on this machine reaches a node listening on ``listen``: a wildcard
    address is dialled on loopback, an IPv6 one in brackets. The CLI, `hubpool service` and
    doctor's fix for C2 (the `tailscale serve` line) all use this one mapping."""
    host, port = listen_host_port(listen)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def tailscale_serve_line(listen: str) -> str:
    """The command that publishes the node at https://<this machine's tailnet name>."""
    return f"tailscale serve --bg --https=443 {local_base_url(listen)}"


def env_flag_off(name: str) -> bool:
    """``off``, ``0`` or ``false`` in ``name`` turns a placement rule off (read per request)."""
    return os.environ.get(name, "").strip().lower() in ("off", "0", "false")


# -- persisted settings ---------------------------------------------------------------

MAX_PINS = 64


class Pin(BaseModel):
    """One operator routing pin (spec: Manual routing pins)."""

    model_config = ConfigDict(extra="forbid")

    scope: str = Field(pattern="^(default|model)$")
    model: str | None = Field(default=None, max_length=200)
    targetKind: str = Field(pattern="^(local|peer)$")
    targetPeerId: str | None = None
    mode: str = Field(default="prefer", pattern="^prefer$")


#: poolSessionSources' default, first match wins (placement/sessions.py reads them): hubpool's
#: header; Claude Code's session header and metadata.user_id; Codex's session-id header and
#: prompt_cache_key; OpenCode's x-session-id and x-session-affinity
DEFAULT_SESSION_SOURCES = (
    "header:X-Hub-Pool-Session",
    "header:X-Claude-Code-Session-Id",
    "body:metadata.user_id",
    "header:session-id",
    "body:prompt_cache_key",
    "header:x-session-id",
    "header:x-session-affinity",
)
#: the default before the agents' own ids were read: a settings file that holds exactly this
#: was never edited (settings are written whole), so it takes the new default at load
LEGACY_DEFAULT_SESSION_SOURCES = ["header:X-Hub-Pool-Session", "body:metadata.user_id", "header:session_id"]
#: poolModelAliases' default: Claude Code's background model (claude-haiku-…) and any other
#: Claude name no node serves go to the pool's `auto` model
DEFAULT_MODEL_ALIASES = {"claude-*": "auto"}
MAX_MODEL_ALIASES = 50
#: a model name or pattern: 1-200 printable characters, no spaces
MODEL_NAME_PATTERN = r"^[!-~]{1,200}$"
SESSION_SOURCE_PATTERN = r"^(header:[A-Za-z0-9_-]{1,64}|body:[A-Za-z0-9_]{1,64}(\.[A-Za-z0-9_]{1,64}){0,3})$"


class PoolSettings(BaseModel):
    """settings.json: the spec's persisted pool settings, plus hubpool's plugin switch."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)

    poolEnabled: bool = True
    poolOutboundEnabled: bool = True
    poolInboundEnabled: bool = True
    poolLocalAffinity: int = Field(default=1, ge=0, le=20)
    poolHealthPollSeconds: int = Field(default=30, ge=10, le=300)
    poolPins: list[Pin] = Field(default_factory=list, max_length=MAX_PINS)
    poolRequireSignedPeers: bool = False
    poolShareContainerStats: bool = True
    poolPressureWeight: int = Field(default=0, ge=0, le=3)
    poolMaxPromptTokens: int | None = Field(default=None, ge=1024, le=1_048_576)
    poolProbeSnapshotTtlMs: int = Field(default=0, ge=0, le=300_000)
    poolPrefixAffinityMaxInFlight: int = Field(default=0, ge=0, le=20)
    poolPrefixAffinityMargin: int = Field(default=0, ge=0, le=20)
    poolSlotAwareness: int = Field(default=0, ge=0, le=1)
    #: hubpool's own: where a request's session id is read from for prefix affinity, first
    #: match wins ("header:<name>", "body:<dotted.path>"); see placement/sessions.py
    poolSessionSources: list[Annotated[str, StringConstraints(pattern=SESSION_SOURCE_PATTERN)]] = Field(
        default_factory=lambda: list(DEFAULT_SESSION_SOURCES), max_length=16)
    #: hubpool's own, beyond the spec: 1 adds what a local engine itself reports running
    #: or waiting beyond this node's own requests (for engines whose plugin can read such a
    #: figure) to that candidate's queue depth; 0 (the default, until measured) ranks on the
    #: proxy's own count alone, as the spec says. See docs/engines.md.
    poolEngineQueueDepth: int = Field(default=0, ge=0, le=1)
    #: hubpool's own, beyond the spec: 1 orders the candidates that have evidence by predicted
    #: time to first token (queue wait, prefill of what the engine does not hold, model load);
    #: 0 is the spec's queue-depth ranking exactly. See docs/placement.md.
    poolTtftRanking: int = Field(default=1, ge=0, le=1)
    #: hubpool's own, with poolTtftRanking (issue 27; docs/placement.md): 1 prices every
    #: candidate's cached prefix from a block-hash index of the prompts this node sent each
    #: engine (a fleet's shared system prompt included); 0 counts only the engine that last
    #: took the session, as before
    poolPrefixIndex: int = Field(default=1, ge=0, le=1)
    #: hubpool's own, with poolTtftRanking: 1 sends a request whose best predictions tie to the
    #: engine holding the fewest sessions (a local head start no longer piles sessions on the
    #: entry node); 0 leaves ties in queue-depth order, as before
    poolSessionSpread: int = Field(default=1, ge=0, le=1)
    #: hubpool's own (issue 27; docs/placement.md): while this node has work in flight or placed
    #: some in the last two seconds, it asks each connected peer's in-flight count this often (ms),
    #: fresher than the health poll; 0 turns it off (the poll and forwarded answers alone, as
    #: before). Values under 100 are read as 100.
    poolLoadPollMs: int = Field(default=500, ge=0, le=10_000)
    #: hubpool's own: the pool-wide admission queue's size; 0 (the default) is off, and a
    #: request is sent at once whatever its candidates' load, as the spec places. See
    #: docs/placement.md.
    poolAdmissionQueue: int = Field(default=0, ge=0, le=1024)
    #: hubpool's own (issue 27; docs/placement.md): the first-token time the admission queue
    #: aims for (ms). While requests wait, the ones that can still get a first token within it
    #: go before the ones that cannot; 0 (the default) keeps arrival order
    poolAdmissionTargetMs: int = Field(default=0, ge=0, le=600_000)
    #: hubpool's own: ids of inference keys whose queued requests are batch work (they wait
    #: behind every interactive one)
    poolAdmissionBatchKeys: list[str] = Field(default_factory=list, max_length=100)
    poolRouteAppsAlways: bool = True
    #: hubpool's own, issue 28 and 25 (docs/reliability.md, "Streams that stop"): 1 commits a
    #: stream to the app at its first real content, not at its engine's headers, so one that
    #: sends headers and a role chunk and then nothing fails over within the first-byte budget;
    #: 0 commits at the headers, as the spec does
    poolStreamFirstToken: int = Field(default=1, ge=0, le=1)
    #: a streamed Messages, Responses or OpenAI request with no content yet is committed to the
    #: app after this long and kept alive at this cadence (Claude Code and Codex give up on a
    #: stream silent for 300 s); 0 is off
    poolStreamKeepAliveMs: int = Field(default=15_000, ge=0, le=290_000)
    #: a committed stream with no new content for this long ends as `stalled` (the dialect's
    #: error event; struck like an output fault). 120 s: over the longest silence a healthy
    #: engine keeps mid-answer on a slow box (docs/reliability.md), under the agents' 300 s; 0 is off
    poolStreamStallMs: int = Field(default=120_000, ge=0, le=3_600_000)
    #: 1 ends a stream whose text loops (proxy/loops.py) as `degenerate-loop`; 0 is off
    poolStreamLoopGuard: int = Field(default=1, ge=0, le=1)
    #: 1 continues a stream cut mid-answer (its node gone, stalled, looping) on the next
    #: candidate, spliced into the same stream; 0 (the default, as the spec has it) never moves
    #: an answer that has started
    poolStreamResume: int = Field(default=0, ge=0, le=1)
    #: inference preferences (PATCH /api/inference/preferences): this node's context cap and
    #: its statement of the engine's parallel slots; None is "not stated", never unlimited
    maxNumCtx: int | None = Field(default=None, ge=256, le=1_048_576)
    ollamaSlots: int | None = Field(default=None, ge=1, le=256)
    #: hubpool's own: the model `auto` prefers, wherever in the pool it is served (Settings → Inference)
    inferenceModel: str | None = Field(default=None, max_length=200)
    #: hubpool's own: model name or glob pattern -> a pool model or "auto", for names no node
    #: serves (Claude Code's background claude-haiku-…, a client's default model); see
    #: placement/aliases.py
    poolModelAliases: dict[Annotated[str, StringConstraints(pattern=MODEL_NAME_PATTERN)],
                           Annotated[str, StringConstraints(pattern=MODEL_NAME_PATTERN)]] = Field(
        default_factory=lambda: dict(DEFAULT_MODEL_ALIASES), max_length=MAX_MODEL_ALIASES)
    #: hubpool's own: plugins switched off by name (takes effect at the next start)
    pluginsDisabled: list[str] = Field(default_factory=list, max_length=100)


#: Keys that PATCH /settings may not write (pins have their own routes).
NOT_PATCHABLE = {"poolPins", "maxNumCtx", "ollamaSlots"}
PREFERENCE_KEYS = ("maxNumCtx", "ollamaSlots")


def describe_range(key: str) -> str:
    """'0–20', '1024–1048576, or null', 'true or false' — for 422 messages."""
    field = PoolSettings.model_fields[key]
    lo = hi = None
    for meta in field.metadata:
        lo = getattr(meta, "ge", lo)
        hi = getattr(meta, "le", hi)
    if field.annotation is bool:
        return "true or false"
    if lo is not None and hi is not None:
        suffix = ", or null" if field.default is None else ""
        return f"{lo}–{hi}{suffix}"
    return SHAPES.get(key, str(field.annotation))


#: what a setting that is not a number or a switch must be, in words (422 messages, the web UI)
SHAPES = {
    "poolModelAliases": (f'an object of at most {MAX_MODEL_ALIASES} model names or glob patterns (printable, '
                         'no spaces), each mapped to a pool model or "auto"'),
    "poolSessionSources": 'a list of at most 16 "header:<name>" or "body:<dotted.path>" strings',
    "poolAdmissionBatchKeys": "a list of at most 100 inference key ids",
}


class SettingsError(ValueError):
    """A PATCH the store refused; ``errors`` names each key and its range."""

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__("; ".join(e["message"] for e in errors))
        self.errors = errors


class SettingsStore:
    """settings.json in the data directory: validated on every write, read from memory.

    Writes go to a temporary file that replaces the old one, so a crash leaves either
    the old or the new settings, never half of each. An out-of-range value found in the
    file falls back to its default at load (the spec: bounds are enforced on write).
    """

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.current = self._load()

    def _load(self) -> PoolSettings:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return PoolSettings()
        except (OSError, ValueError):
            return PoolSettings()
        if not isinstance(raw, dict):
            return PoolSettings()
        good: dict[str, Any] = {}
        if raw.get("poolSessionSources") == LEGACY_DEFAULT_SESSION_SOURCES:
            del raw["poolSessionSources"]
        for key, value in raw.items():
            if key not in PoolSettings.model_fields:
                continue
            try:
                PoolSettings(**{key: value})
            except ValidationError:
                continue
            good[key] = value
        return PoolSettings(**good)

    def patch(self, changes: dict[str, Any], allowed: tuple[str, ...] | None = None) -> PoolSettings:
        """Validate every key first, then write all of them or none. ``allowed`` narrows the
        keys (the preferences route writes only its own)."""
        errors: list[dict[str, Any]] = []
        for key, value in changes.items():
            refused = key not in allowed if allowed is not None else (key in NOT_PATCHABLE)
            if key not in PoolSettings.model_fields or refused:
                hint = ""
                if key == "poolPins":
                    hint = " (pins are written through /api/inference/pool/pins)"
                elif key in PREFERENCE_KEYS:
                    hint = " (write it through PATCH /api/inference/preferences)"
                errors.append({"key": key, "message": f"{key} is not a setting this route writes{hint}"})
                continue
            try:
                PoolSettings(**{key: value})
            except ValidationError:
                errors.append(
                    {"key": key, "range": describe_range(key),
                     "message": f"{key} must be {describe_range(key)} (got {json.dumps(value)})"}
                )
        if errors:
            raise SettingsError(errors)
        with self._lock:
            merged = self.current.model_dump() | changes
            updated = PoolSettings(**merged)
            self._write(updated)
            self.current = updated
        return updated

    def replace_pins(self, pins: list[Pin]) -> PoolSettings:
        with self._lock:
            updated = self.current.model_copy(update={"poolPins": pins})
            PoolSettings(**updated.model_dump())  # re-validate the bound on pin count
            self._write(updated)
            self.current = updated
        return updated

    def _write(self, settings: PoolSettings) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        data = json.dumps(settings.model_dump(), indent=2, sort_keys=True)
        try:
            with open(tmp, "w") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError:
            # a full disk fails the write or the fsync: the old file stays whole and in force
            # (the caller keeps its settings), and no partial temporary is left behind
            tmp.unlink(missing_ok=True)
            raise
