"""CLI verbs that advise and state preferences: doctor, handout, ceiling, context-cap, slots."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import typer

from hubpool_core.cli.client import NodeError
from hubpool_core.cli.commands import JsonOption, UrlOption, _client, _fail, app, out, whole_number
from hubpool_core.cli.format import override_lines
from hubpool_core.config import parse_whole
from hubpool_core.placement.handout import AGENT_MIN_CONTEXT, AGENTS, agent_setup

#: how /v1/models marks a model alias (api/inference.py)
ALIAS_OWNER = "hub-pool-alias"

MARK = {"ready": "✓", "warning": "!", "needs action": "✗"}


@app.command()
def doctor(url: str | None = UrlOption, as_json: bool = JsonOption) -> None:
    """Check whether this node can pool and peers will reach it; exits 1 when something needs action."""
    try:
        data = _client(url).get("/api/inference/pool/doctor")
    except NodeError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        for c in data["checks"]:
            out.print(f"{MARK.get(c['verdict'], '?')} {c['id']:<3} {c['title']}: {c['detail']}", highlight=False)
            if c.get("fix") and c["verdict"] != "ready":
                out.print(f"      fix: {c['fix']}", highlight=False)
    if not data["ok"]:
        raise typer.Exit(1)


@app.command()
def handout(tools: bool = typer.Option(False, "--tools", help="The client needs tool calling."),
            min_context: int | None = typer.Option(None, "--min-context", min=1, parser=whole_number,
                                                      help="The smallest context window the client accepts."),
            env_lines: bool = typer.Option(False, "--env", help="Print only KEY=VALUE lines for a .env file."),
            agent: str | None = typer.Option(None, "--agent", metavar="|".join(AGENTS),
                                             help="A coding agent: the environment and config files it needs."),
            url: str | None = UrlOption, as_json: bool = JsonOption) -> None:
    """Say what a client should be configured with: base URLs, the model, and num_ctx."""
    if agent is not None and agent not in AGENTS:
        _fail(f"--agent takes one of {', '.join(AGENTS)}, not {agent!r}")
    if agent is not None:
        # an agent calls tools, and its first turn alone is 16-20k tokens
        tools, min_context = True, min_context or AGENT_MIN_CONTEXT
    query = {"tools": "true"} if tools else {}
    if min_context:
        query["minContext"] = str(min_context)
    try:
        data = _client(url).get("/api/inference/pool/handout" + ("?" + urlencode(query) if query else ""))
    except NodeError as exc:
        _fail(str(exc))
    if agent is not None:
        _print_agent(agent_setup(agent, data, _alias_names(url)), as_json=as_json, env_lines=env_lines)
        return
    if _printed_raw(data, as_json=as_json, env_lines=env_lines):
        return
    native = data["nativeBaseUrl"] or "- (the engine speaks only the OpenAI dialect)"
    out.print(f"OpenAI base URL  {data['openaiBaseUrl']}\nNative base URL  {native}", highlight=False)
    if data.get("anthropicBaseUrl"):  # a node before the agent routes sends none
        out.print(f"Anthropic URL    {data['anthropicBaseUrl']}  (Claude Code: ANTHROPIC_BASE_URL; from outside, "
                  "an inference key as ANTHROPIC_AUTH_TOKEN)", highlight=False)
    out.print(f"Model            {data['model'] or '-'}  (served by {', '.join(data['servedBy']) or 'nobody'})",
              highlight=False)
    out.print(f"num_ctx          {data['numCtx'] or 'the engine default (no window known, no cap)'}", highlight=False)
    for w in data["warnings"]:
        out.print(f"warning: {w}", highlight=False)
    out.print("\n" + "\n".join(f"{k}={v}" for k, v in data["env"].items()), highlight=False)


def _alias_names(url: str | None) -> list[str]:
    """The pool's model aliases as /v1/models lists them (the inference guard, as the handout):
    none when the listing cannot be read, and the handout then names every model itself."""
    try:
        listed = _client(url).get("/v1/models")
    except NodeError:
        return []
    return [m["id"] for m in listed.get("data") or [] if isinstance(m, dict) and m.get("owned_by") == ALIAS_OWNER]


_AGENT_NAMES = {"claude-code": "Claude Code", "codex": "Codex", "opencode": "OpenCode"}


def _printed_raw(data: dict, *, as_json: bool, env_lines: bool) -> bool:
    """--json prints the whole answer, --env its KEY=VALUE lines; False when neither was asked."""
    if as_json:
        print(json.dumps(data, indent=2))
    elif env_lines:
        for key, value in data["env"].items():
            print(f"{key}={value}")
    return as_json or env_lines


def _print_agent(setup: dict, *, as_json: bool, env_lines: bool) -> None:
    if _printed_raw(setup, as_json=as_json, env_lines=env_lines):
        return
    served = ", ".join(setup["servedBy"]) or "nobody yet"
    lines = [f"# {_AGENT_NAMES[setup['agent']]} through hubpool at {setup['baseUrl']}: model {setup['model']} "
             f"(served by {served})", ""]
    for file in setup["files"]:
        lines += [f"# {file['path']}", file["content"].rstrip("\n"), ""]
    lines += [f"export {key}={value}" for key, value in setup["env"].items()]
    lines += ["", "# then start it:", setup["run"], ""]
    lines += [f"# note: {n}" for n in setup["notes"]] + [f"# warning: {w}" for w in setup["warnings"]]
    out.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)


def _state(url: str | None, value: str, what: str, path: str, key: str, label: str, absent: str) -> None:
    """Write one number-or-clear statement and print what the node now holds, with a warning
    when the node's environment overrides the setting (HUB_POOL_MAX_PROMPT_TOKENS for the ceiling)."""
    number = None if value == "clear" else parse_whole(value)
    if number is None and value != "clear":
        _fail(f"{what} takes a whole number or `clear` (not {value!r})")
    client = _client(url)
    try:
        data = client.patch(path, {key: number})
        status = client.get("/api/inference/pool/status")
    except NodeError as exc:
        _fail(str(exc))
    out.print(f"{label}: {data[key] or absent}", highlight=False)
    for line in override_lines(status, [key]):
        out.print(line, highlight=False)


@app.command()
def ceiling(value: str = typer.Argument(..., help="Largest estimated prompt in tokens (1024–1048576), or `clear`."),
            url: str | None = UrlOption) -> None:
    """Set this node's prompt ceiling (poolMaxPromptTokens): longer prompts go elsewhere first."""
    _state(url, value, "ceiling", "/api/inference/pool/settings", "poolMaxPromptTokens", "Prompt ceiling", "none")


@app.command("context-cap")
def context_cap(value: str = typer.Argument(..., help="The engine's context length (num_ctx), or `clear`."),
                url: str | None = UrlOption) -> None:
    """State this node's context cap (maxNumCtx): the window its engine runs without reloading."""
    _state(url, value, "context-cap", "/api/inference/preferences", "maxNumCtx", "Context cap", "none")


@app.command()
def slots(value: str = typer.Argument(..., help="Requests the engine runs at once (its parallel-slots setting), "
                                                "or `clear`."),
          url: str | None = UrlOption) -> None:
    """State how many requests this node's engine runs at once (ollamaSlots)."""
    _state(url, value, "slots", "/api/inference/preferences", "ollamaSlots", "Slots", "not stated")
