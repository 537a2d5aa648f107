"""The plugin host: discovery (stevedore), registration and calls (pluggy).

Discovery lists the ``hubpool.plugins`` entry points *without importing them*, drops the
disabled names, and only then lets stevedore import the rest, so a disabled plugin is
never imported. A plugin whose import raises, or whose hooks break the contract, is
recorded as inactive with the error and never stops the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy
from stevedore import NamedExtensionManager

from hubpool_core import hookspecs
from hubpool_core.directory import Directory
from hubpool_core.engine import Engine
from hubpool_core.pressure import PressureSource
from hubpool_core.stage import Stage

log = logging.getLogger("hubpool.plugins")

ENTRY_POINT_GROUP = "hubpool.plugins"

#: how an engine finds its agent dialects, as `hubpool plugins` says it
AGENT_DIALECTS_BY = {"version": "by version", "probe": "by probe", "none": "translated"}

#: hook name -> (plugin kind shown in `hubpool plugins`, base class registered objects must subclass)
REGISTRATION_HOOKS: dict[str, tuple[str, type | None]] = {
    "hubpool_register_engines": ("engine", Engine),
    "hubpool_register_directories": ("directory", Directory),
    "hubpool_register_pressure_sources": ("pressure", PressureSource),
    "hubpool_register_stages": ("stage", Stage),
    "hubpool_register_container_stats": ("container-stats", None),
    "hubpool_register_doctor_checks": ("doctor", None),
}


@dataclass
class PluginRecord:
    """One row of `hubpool plugins`."""

    name: str
    distribution: str | None
    version: str | None
    kinds: list[str] = field(default_factory=list)
    active: bool = False
    reason: str | None = None  # why not active
    order: int | None = None  # stage or pressure-source order, where it has one
    registered: list[str] = field(default_factory=list)
    #: for engine plugins: each engine's native dialects and how its agent dialects are found
    dialects: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": ",".join(self.kinds) or None,
            "distribution": self.distribution,
            "version": self.version,
            "active": self.active,
            "reason": self.reason,
            "order": self.order,
            "registered": self.registered,
            "dialects": self.dialects,
        }


@dataclass
class PluginHost:
    """Everything plugins registered, in the order the core uses it."""

    manager: pluggy.PluginManager
    records: list[PluginRecord]
    engines: list[type[Engine]] = field(default_factory=list)
    directories: list[type[Directory]] = field(default_factory=list)
    pressure_sources: list[type[PressureSource]] = field(default_factory=list)
    stages: list[type[Stage]] = field(default_factory=list)
    container_stats: list[Callable[[], Any]] = field(default_factory=list)
    doctor_checks: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def broadcast_request_finished(self, row: dict[str, Any]) -> None:
        """Tell observers a row settled; one raising observer never hides the row from others."""
        for impl in self.manager.hook.hubpool_request_finished.get_hookimpls():
            try:
                impl.function(row=row)
            except Exception:  # noqa: BLE001 - an observer must not break the relay
                log.exception("plugin %s failed in hubpool_request_finished", impl.plugin_name)

    def add_cli_commands(self, app: Any) -> None:
        for impl in self.manager.hook.hubpool_register_cli_commands.get_hookimpls():
            try:
                impl.function(app=app)
            except Exception as exc:  # noqa: BLE001
                log.warning("plugin %s could not add CLI commands: %s", impl.plugin_name, exc)


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def load_plugins(
    disabled_by_env: Iterable[str] = (),
    disabled_by_setting: Iterable[str] = (),
    extra_modules: Iterable[tuple[str, Any]] = (),
) -> PluginHost:
    """Discover, select, import and register plugins, then collect their registrations.

    ``extra_modules`` registers in-process plugin modules as ``(name, module)``; tests use
    it for a fake engine so core tests run with zero installed plugins.
    """
    env_off, setting_off = set(disabled_by_env), set(disabled_by_setting)
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    records: dict[str, PluginRecord] = {}
    wanted: list[str] = []
    for ep in _entry_points():
        dist = getattr(ep, "dist", None)
        rec = PluginRecord(ep.name, dist.name if dist else None, dist.version if dist else None)
        if ep.name in records:
            rec.reason = f"duplicate entry point name (also in {records[ep.name].distribution})"
            log.warning("plugin %s: %s", ep.name, rec.reason)
            continue
        records[ep.name] = rec
        if ep.name in env_off:
            rec.reason = "disabled by HUB_POOL_PLUGINS_DISABLED"
        elif ep.name in setting_off:
            rec.reason = "disabled by setting pluginsDisabled"
        else:
            wanted.append(ep.name)

    def on_failure(_mgr: Any, ep: Any, exc: BaseException) -> None:
        rec = records.get(ep.name)
        if rec is not None:
            rec.reason = f"import failed: {type(exc).__name__}: {exc}"
        log.warning("plugin %s failed to import and is inactive: %s: %s", ep.name, type(exc).__name__, exc)

    def on_missing(names: Iterable[str]) -> None:
        for name in names:
            if name in records and records[name].reason is None:  # an import failure already said why
                records[name].reason = "listed but not loadable (installed while this process ran? restart it)"

    modules: list[tuple[str, Any]] = []
    if wanted:
        extensions = NamedExtensionManager(
            ENTRY_POINT_GROUP,
            names=wanted,
            invoke_on_load=False,
            on_load_failure_callback=on_failure,
            on_missing_entrypoints_callback=on_missing,
            name_order=True,
        )
        modules.extend((ext.name, ext.plugin) for ext in extensions)
    for name, module in extra_modules:
        records[name] = PluginRecord(name, None, None)
        modules.append((name, module))

    for name, module in modules:
        rec = records[name]
        try:
            manager.register(module, name=name)
        except Exception as exc:  # noqa: BLE001 - pluggy's contract check: one bad plugin only
            rec.reason = f"contract check failed: {exc}"
            log.warning("plugin %s breaks the hook contract and is inactive: %s", name, exc)
            continue
        rec.active = True
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        bad = getattr(exc, "plugin", None)
        bad_name = manager.get_name(bad) if bad is not None else None
        if bad_name in records:
            records[bad_name].active = False
            records[bad_name].reason = f"contract check failed: {exc}"
            manager.unregister(name=bad_name)
        log.warning("plugin contract check failed: %s", exc)

    host = PluginHost(manager=manager, records=list(records.values()))
    _collect(host, records)
    return host


def _pair_appender(got: list[Any]) -> Callable[[str, Any], None]:
    """``register(check_id, fn)`` for the doctor-check hook, bound to this plugin's list."""
    return lambda check_id, fn: got.append((check_id, fn))


def _collect(host: PluginHost, records: dict[str, PluginRecord]) -> None:
    """Call every registration hook, one plugin at a time, so a raising or misbehaving
    plugin is reported on its own row and the rest still register."""
    engine_kinds: dict[str, str] = {}
    for hook_name, (kind, base) in REGISTRATION_HOOKS.items():
        for impl in getattr(host.manager.hook, hook_name).get_hookimpls():
            rec = records.get(impl.plugin_name)
            if rec is None or not rec.active:
                continue
            got: list[Any] = []
            try:
                if hook_name == "hubpool_register_doctor_checks":
                    impl.function(register=_pair_appender(got))
                else:
                    impl.function(register=got.append)
                for obj in got:
                    if base is not None and not (isinstance(obj, type) and issubclass(obj, base)):
                        raise TypeError(f"{hook_name} registered {obj!r}, which is not a subclass of {base.__name__}")
                    if base is Engine and obj.kind in engine_kinds:
                        raise TypeError(f"engine kind {obj.kind!r} is already registered by {engine_kinds[obj.kind]}")
            except Exception as exc:  # noqa: BLE001
                rec.active = False
                rec.reason = f"{hook_name} failed: {type(exc).__name__}: {exc}"
                log.warning("plugin %s is inactive: %s", rec.name, rec.reason)
                continue
            if got and kind not in rec.kinds:
                rec.kinds.append(kind)
            for obj in got:
                if base is Engine:
                    engine_kinds[obj.kind] = rec.name
                    host.engines.append(obj)
                    rec.registered.append(obj.kind)
                    rec.dialects.append(f"{','.join(sorted(obj.dialects))} · agent "
                                        f"{AGENT_DIALECTS_BY.get(obj.agent_dialects_by, obj.agent_dialects_by)}")
                elif base is Directory:
                    host.directories.append(obj)
                    rec.registered.append(obj.name)
                elif base is PressureSource:
                    host.pressure_sources.append(obj)
                    rec.registered.append(obj.name)
                    rec.order = obj.order
                elif base is Stage:
                    host.stages.append(obj)
                    rec.registered.append(obj.name)
                    rec.order = obj.order
                elif kind == "doctor":
                    host.doctor_checks[obj[0]] = obj[1]
                    rec.registered.append(obj[0])
                else:
                    host.container_stats.append(obj)
    for impl in host.manager.hook.hubpool_register_cli_commands.get_hookimpls():
        rec = records.get(impl.plugin_name)
        if rec is not None and rec.active and "cli" not in rec.kinds:
            rec.kinds.append("cli")
    for impl in host.manager.hook.hubpool_request_finished.get_hookimpls():
        rec = records.get(impl.plugin_name)
        if rec is not None and rec.active and "observer" not in rec.kinds:
            rec.kinds.append("observer")
    # order is data: sort once, here
    host.pressure_sources.sort(key=lambda cls: cls.order)
    host.stages.sort(key=lambda cls: cls.order)
