"""CLI verbs that advise and state preferences: doctor, handout, ceiling, context-cap, slots."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import typer

from hubpool_core.cli.client import NodeError
from hubpool_core.cli.commands import JsonOption, UrlOption, _client, _fail, app, out, whole_number
from hubpool_core.cli.format import override_lines
from hubpool_core.config import parse_whole

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
            url: str | None = UrlOption, as_json: bool = JsonOption) -> None:
    """Say what a client should be configured with: base URLs, the model, and num_ctx."""
    query = {"tools": "true"} if tools else {}
    if min_context:
        query["minContext"] = str(min_context)
    try:
        data = _client(url).get("/api/inference/pool/handout" + ("?" + urlencode(query) if query else ""))
    except NodeError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(data, indent=2))
        return
    if env_lines:
        for key, value in data["env"].items():
            print(f"{key}={value}")
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
