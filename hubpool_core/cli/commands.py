"""The `hubpool` command line: every command, on typer (hubpool_core.cli.main is the entry point).

The CLI manages only the node on the machine where it runs: it finds that node through
the same environment as `hubpool serve` (HUB_POOL_DATA_DIR and HUB_POOL_LISTEN), or
--url, and reads the operator key from the data directory (or HUB_POOL_OPERATOR_KEY).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hubpool_core.cli.client import NodeClient, NodeError
from hubpool_core.config import EnvSettings, parse_whole

app = typer.Typer(
    name="hubpool",
    help="Pool the LLM inference machines on your tailnet into one. "
         "Each command manages the node on this machine.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
api_key_app = typer.Typer(help="Create, list and revoke API keys for apps, monitoring and automation.",
                          no_args_is_help=True)
app.add_typer(api_key_app, name="api-key")

out = Console()
err = Console(stderr=True)

UrlOption = typer.Option(None, "--url", help="The node's base URL (default: from HUB_POOL_LISTEN).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of text.")


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", is_eager=True,
                                 help="Print the version of hubpool and of each installed plugin distribution."),
) -> None:
    # main.py answers a bare `--version` itself; this is the path for `--version` with other words
    # after it, and puts the option in `hubpool --help`
    if version:
        from hubpool_core.cli.version import version_text

        print(version_text())
        raise typer.Exit(0)


def _fail(message: str, code: int = 1) -> None:
    # not wrapped: a sentence may end in a path or a command to paste as it stands
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def whole_number(text: str | int) -> int:
    """A command-line number, by the node's own rule (ASCII digits only: no "--5", no "²")."""
    if isinstance(text, int):  # an option's default comes through the parser as it stands
        return text
    value = parse_whole(text)
    if value is None:
        raise typer.BadParameter(f"{text!r} is not a whole number")
    return value


def _client(url: str | None) -> NodeClient:
    try:
        return NodeClient.from_environment(url)
    except NodeError as exc:
        _fail(str(exc))
        raise  # unreachable


@app.command()
def serve(
    listen: str | None = typer.Option(None, "--listen", help="host:port to listen on (default HUB_POOL_LISTEN, "
                                                                "127.0.0.1:5002)."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Run this machine's node in the foreground (logs go to stderr)."""
    from hubpool_core.node.server import run_node
    from hubpool_core.store.db import DatabaseUrlError, SchemaTooNew

    if listen:
        os.environ["HUB_POOL_LISTEN"] = listen
    try:
        run_node(EnvSettings(), log_level=log_level)
    except (SchemaTooNew, DatabaseUrlError) as exc:  # a downgrade, a mistyped URL: a sentence, not a traceback
        _fail(str(exc))


@app.command()
def plugins(as_json: bool = JsonOption) -> None:
    """List installed plugins: kind, distribution, version, active or why not, and order."""
    from hubpool_core.config import SettingsStore
    from hubpool_core.plugins import load_plugins

    logging.getLogger("hubpool.plugins").setLevel(logging.ERROR)
    env = EnvSettings()
    setting = SettingsStore(env.data_dir / "settings.json").current.pluginsDisabled
    host = load_plugins(env.disabled_plugin_names, setting)
    rows = [r.as_json() for r in host.records]
    if as_json:
        print(json.dumps({"plugins": rows}, indent=2))
        return
    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "KIND", "DISTRIBUTION", "VERSION", "STATE", "ORDER", "DIALECTS"):
        table.add_column(col)
    for r in rows:
        state = "active" if r["active"] else f"inactive: {r['reason']}"
        table.add_row(r["name"], r["kind"] or "-", r["distribution"] or "-", r["version"] or "-", state,
                      "" if r["order"] is None else str(r["order"]), " | ".join(r["dialects"]))
    out.print(table)


@app.command("settings")
def settings_cmd(
    changes: list[str] = typer.Argument(None, help="KEY=VALUE pairs to change, e.g. poolLocalAffinity=2. "
                                                   "Values are JSON (true, 3, null)."),
    url: str | None = UrlOption,
) -> None:
    """Show the pool settings, or change some: hubpool settings poolHealthPollSeconds=60."""
    client = _client(url)
    try:
        if not changes:
            data = client.get("/api/inference/pool/settings")
        else:
            patch: dict[str, Any] = {}
            for item in changes:
                key, sep, value = item.partition("=")
                if not sep:
                    _fail(f"{item!r} is not KEY=VALUE")
                try:
                    patch[key] = json.loads(value)
                except ValueError:
                    patch[key] = value
            data = client.patch("/api/inference/pool/settings", patch)
            status = client.get("/api/inference/pool/status")
    except NodeError as exc:
        _fail(str(exc))
    print(json.dumps(data, indent=2))
    if changes:
        from hubpool_core.cli.format import override_lines

        for line in override_lines(status, list(patch)):  # stderr: stdout stays the JSON it was
            err.print(line, highlight=False, soft_wrap=True)


# -- api keys (local: they live in this machine's store) ------------------------------

def _keystore():  # noqa: ANN202
    """This machine's key store, only where a node keeps its data: a key minted into a store no
    node reads is valid nowhere, so a data directory no node uses is refused with where to look."""
    from sqlalchemy import text

    from hubpool_core.access.credentials import KeyStore
    from hubpool_core.store import Database

    env = EnvSettings()
    where = env.data_dir
    if env.database_url is None:  # SQLite in the data directory (the default)
        if not where.is_dir():
            _no_node_here(env, f"{where} does not exist")
        if not (where / "hubpool.db").is_file():
            _no_node_here(env, f"{where} holds no hubpool database (hubpool.db)")
    _refuse_a_data_dir_the_node_does_not_use(env)
    db = Database(env.resolved_database_url())
    with db.engine.connect() as conn:  # an unreachable server says so here (main: exit 69)
        conn.execute(text("SELECT 1"))
    if db.current_revision() is None:
        _no_node_here(env, f"no node has set up the database at {_redacted(db.url)} (it has no hubpool schema)")
    if not where.is_dir():
        _no_node_here(env, f"{where} does not exist")
    db.migrate()
    return KeyStore(db, where, env.operator_key)


def _redacted(url: str) -> str:
    from hubpool_core.store.db import redacted

    return redacted(url)


def _service_hint(env: EnvSettings) -> str:
    """Where the service installed on this machine keeps its data, and the command to run there."""
    import shlex

    from hubpool_core.cli.service_files import installed_data_dirs

    hints = []
    for data_dir, source, run_as in installed_data_dirs():
        if data_dir == env.data_dir:
            continue
        who = f"sudo -u {shlex.quote(run_as)} " if run_as else ""
        hints.append(f"The hubpool service installed here keeps its data in {data_dir} ({source}): run "
                     f"`{who}env HUB_POOL_DATA_DIR={shlex.quote(str(data_dir))} hubpool api-key …` instead.")
    if hints:
        return " ".join(hints)
    return ("Point HUB_POOL_DATA_DIR at the data directory of the node the key is for (the one its `hubpool serve` "
            "reads), or start a node here first with `hubpool serve`.")


def _no_node_here(env: EnvSettings, why: str) -> None:
    _fail(f"no node data here: {why}, so a key made here would be valid on no node. {_service_hint(env)}")


def _refuse_a_data_dir_the_node_does_not_use(env: EnvSettings) -> None:
    """The data directory exists and holds a store, but is not the running node's: the default
    one while the installed service keeps its data elsewhere, or one whose operator key the
    node answering at HUB_POOL_LISTEN refuses."""
    import httpx

    from hubpool_core.access.credentials import read_operator_key
    from hubpool_core.cli.service_files import installed_data_dirs

    if "HUB_POOL_DATA_DIR" not in os.environ:  # the default directory is only a guess
        elsewhere = [d for d, _, _ in installed_data_dirs() if d != env.data_dir]
        if elsewhere:
            _fail(f"this command read the default data directory {env.data_dir} (HUB_POOL_DATA_DIR is not set), "
                  f"which the service installed on this machine does not use. {_service_hint(env)}")
    key = read_operator_key(env.data_dir)
    if key is None:
        return
    try:
        answer = httpx.get(env.base_url + "/api/inference/pool/settings", headers={"Authorization": f"Bearer {key}"},
                           timeout=3, trust_env=False)
    except httpx.HTTPError:
        return  # no node answers there now: the directory may well be a stopped node's
    if answer.status_code in (401, 403):
        _fail(f"the node answering at {env.base_url} does not use the data directory {env.data_dir} (it refuses "
              f"that directory's operator key), so a key made here would not be valid on it. {_service_hint(env)}")


@api_key_app.command("create")
def api_key_create(
    scope: str = typer.Option(..., "--scope", help="operator, inference (apps and editors) or qa:read "
                                                   "(status and routing log only)."),
    name: str | None = typer.Option(None, "--name", help="A label to recognise the key by."),
) -> None:
    """Mint a key; it is printed once and only its hash is kept."""
    from hubpool_core.access.credentials import SCOPES

    if scope not in SCOPES:
        _fail(f"--scope must be one of {', '.join(SCOPES)}")
    row, key = _keystore().create(name or scope, scope)
    err.print(f"Created {scope} key {row.id[:8]} ({row.name}). Copy it now; it is not shown again:")
    print(key)


@api_key_app.command("list")
def api_key_list(as_json: bool = JsonOption) -> None:
    """List keys (never the keys themselves)."""
    from hubpool_core.access.credentials import public_key_row

    rows = [public_key_row(r) for r in _keystore().list()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(box=None, pad_edge=False)
    for col in ("ID", "NAME", "SCOPE", "PREFIX", "CREATED", "LAST USED", "REVOKED"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"][:8], r["name"], r["scope"], r["prefix"] + "…", r["createdAt"] or "-",
                      r["lastUsedAt"] or "-", r["revokedAt"] or "-")
    out.print(table)


@api_key_app.command("revoke")
def api_key_revoke(key_id: str = typer.Argument(..., help="The key's id, id prefix or name.")) -> None:
    """Revoke a key; requests carrying it are refused from then on."""
    try:
        row = _keystore().revoke(key_id)
    except LookupError as exc:
        _fail(str(exc))
    if row is None:
        _fail(f"no active key matches {key_id!r} (see `hubpool api-key list`)")
    err.print(f"Revoked {row.scope} key {row.id[:8]} ({row.name}).")


def main() -> None:
    """Run the typer command line (plugins add their commands first)."""
    for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show ✓ gets '?', never a traceback
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        from hubpool_core.plugins import load_plugins

        logging.getLogger("hubpool.plugins").setLevel(logging.ERROR)
        from hubpool_core.config import SettingsStore

        env = EnvSettings()
        setting = SettingsStore(env.data_dir / "settings.json").current.pluginsDisabled
        load_plugins(env.disabled_plugin_names, setting).add_cli_commands(app)
    except Exception:  # noqa: BLE001 - plugin commands are optional; the core CLI must still work
        pass
    try:
        app()
    except Exception as exc:
        message, code = _store_failure(exc)
        if message is None:
            raise
        err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        raise SystemExit(code) from None


def _store_failure(exc: BaseException) -> tuple[str | None, int]:
    """What a command that opens this machine's store directly (api-key create, list, revoke)
    tells the operator when the store fails it, and its exit code; (None, 0) for anything else.

    A sentence, never a traceback, and a code a script can act on: 75 try again later (busy
    lock), 74 I/O (full disk), 69 the database is unreachable, 1 a schema from a newer release."""
    from hubpool_core.store import storage_refusal
    from hubpool_core.store.db import DatabaseUrlError, SchemaTooNew, describe, redacted

    if isinstance(exc, (SchemaTooNew, DatabaseUrlError)):
        return str(exc), 1
    env = EnvSettings()
    refused = storage_refusal(exc, env.data_dir)
    if refused is not None:
        return refused.message, 75 if refused.status == 503 else 74
    if type(exc).__name__ == "OperationalError":  # SQLAlchemy's: the server is down or refuses us
        url = redacted(env.resolved_database_url())
        return (f"cannot reach the database at {url} ({describe(exc)}). Start it, or check "
                "HUB_POOL_DATABASE_URL, then run the command again."), 69
    return None, 0


# the other verbs live in their own modules; importing them registers them on `app`
from hubpool_core.cli import status_commands, log_commands, pin_commands, pairing_commands  # noqa: E402,F401,I001
from hubpool_core.cli import advice_commands  # noqa: E402,F401
from hubpool_core.cli import bench_commands  # noqa: E402,F401
from hubpool_core.cli import alias_commands  # noqa: E402,F401
from hubpool_core.cli import service_commands  # noqa: E402,F401
