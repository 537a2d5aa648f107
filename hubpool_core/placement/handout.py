"""The handout: what a client should be configured with to use the pool (spec: Context caps,
the handout half; The auto alias). Pure functions over the node's snapshot."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hubpool_core.models_ids import same_model
from hubpool_core.placement.aliases import alias_target
from hubpool_core.placement.auto import choose_auto_model


def effective_ceiling(env: Any, settings: Any) -> tuple[int | None, str | None]:
    """(maxPromptTokens, setBy): HUB_POOL_MAX_PROMPT_TOKENS wins when it is a whole number
    in 1024..1048576; anything else is ignored rather than guessed at."""
    from hubpool_core.config import env_int

    from_env = env_int(env.max_prompt_tokens, minimum=1024, maximum=1_048_576)
    if from_env is not None:
        return from_env, "env"
    if settings.poolMaxPromptTokens is not None:
        return settings.poolMaxPromptTokens, "setting"
    return None, None


@dataclass(frozen=True)
class DirectEngine:
    """A local engine an app may be pointed at directly: its OpenAI base URL, its native one
    (None when it speaks no native dialect), its product name and whether it wants a key."""

    openai_url: str
    native_url: str | None
    product: str
    needs_key: bool


def build_handout(*, base_url: str, offers: dict[str, set[str]], windows: dict[str, int],
                  caps: dict[str, int | None], preferred: str | None, tools: bool, min_context: int | None,
                  direct: dict[str, DirectEngine] | None = None) -> dict[str, Any]:
    """``offers``: model → nodes serving it; ``windows``: model → a window an engine states;
    ``caps``: node → its advertised maxNumCtx (None: takes any window; a node absent from the
    map is one this node knows nothing about, and is treated as uncapped too). ``direct``:
    model → the local engine serving it, given only when apps are not routed through the
    pool (poolRouteAppsAlways off and no connected peer); None: the pool's URLs."""
    warnings: list[str] = []
    eligible = dict(offers)
    if min_context:
        eligible = {m: n for m, n in offers.items() if windows.get(m) is None or windows[m] >= min_context}
    model = choose_auto_model(eligible, preferred)
    if tools:
        warnings.append("tool calling is not known for any model in the pool yet; the choice assumes it works")
    if model is None:
        return {"model": None, "numCtx": None, "servedBy": [], "warnings": warnings + [
            "no chat model in the pool fits: load a chat model on any node, or lower minContext"],
            "openaiBaseUrl": base_url + "/v1", "nativeBaseUrl": base_url, "anthropicBaseUrl": base_url,
            "env": {}, "routedThroughPool": True}
    nodes = sorted(offers[model])
    node_caps = [caps.get(n) for n in nodes]
    stated = [c for c in node_caps if c is not None]
    # the largest cap among the nodes that serve the model, and none when any node has none
    cap = max(stated) if len(stated) == len(node_caps) else None
    window = next((w for m, w in windows.items() if same_model(m, model)), None)
    candidates = [v for v in (window, cap) if v]
    num_ctx = min(candidates) if candidates else None
    if cap is not None and min_context and cap < min_context:
        warnings.append(f"every node serving {model} caps the window at {cap}, below this client's floor of "
                        f"{min_context}: raise the engine's context and the cap together, or keep this client "
                        "off those nodes")
    openai_url = base_url + "/v1"
    native_url: str | None = base_url
    engine = next((e for m, e in (direct or {}).items() if same_model(m, model)), None)
    if engine is not None:
        openai_url, native_url = engine.openai_url, engine.native_url
        warnings.append(f"poolRouteAppsAlways is off and no peer is connected: this client is pointed at the local "
                        f"{engine.product} directly ({openai_url}), not at the pool; it moves to the pool once a peer "
                        "connects (or turn poolRouteAppsAlways on)"
                        + (f". The {engine.product} wants its own API key" if engine.needs_key else ""))
    # agents: Claude Code reads ANTHROPIC_BASE_URL (it appends /v1/messages) and ANTHROPIC_MODEL; it stays
    # this node even when apps go direct, since the local engine may not speak Messages (the node translates)
    env = {"OPENAI_BASE_URL": openai_url, "OPENAI_API_BASE": openai_url, "CI_LLM_BASE_URL": openai_url,
           "CI_LLM_MODEL": model, "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_MODEL": model}
    if native_url is not None:
        env["OLLAMA_HOST"] = native_url
    if num_ctx:
        env["CI_LLM_NUM_CTX"] = str(num_ctx)
    return {"openaiBaseUrl": openai_url, "nativeBaseUrl": native_url, "anthropicBaseUrl": base_url, "model": model,
            "numCtx": num_ctx, "servedBy": nodes, "warnings": warnings, "env": env,
            "routedThroughPool": engine is None}


# -- coding agents: `hubpool handout --agent` ----------------------------------------------

#: the agents `hubpool handout --agent` configures, as the CLI spells them
AGENTS = ("claude-code", "codex", "opencode")
#: the window an agent is handed a model for unless the operator says otherwise: a coding
#: agent's first turn is 16-20k tokens of system prompt and tool schemas before any work
AGENT_MIN_CONTEXT = 32768
#: the word an agent sends as its key inside the tailnet, where the node asks for none: each
#: agent refuses to start without some credential (Claude Code would ask to sign in)
INSIDE_KEY = "hubpool"
#: an agent's answer budget when the window is known: agents ask for 32000 tokens, which an
#: engine that counts the budget against the window (vLLM) refuses on a 32k model
_OUTPUT_SHARE = 4
_AGENT_MAX_OUTPUT = 32000
#: the names Claude Code asks for on its own (background work, sub-agents, its default model)
_CLAUDE_NAMES = ("claude-haiku-4-5", "claude-sonnet-4-5", "claude-opus-4-1")
_CLAUDE_MODEL_VARS = ("ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                      "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")


def _toml(value: str) -> str:
    # a JSON string is a valid TOML basic string for everything a URL or model id holds
    return json.dumps(value)


def agent_setup(agent: str, handout: dict[str, Any], aliases: Iterable[str] = ()) -> dict[str, Any]:
    """What one coding agent needs to use the pool, from ``handout`` (build_handout's answer,
    asked with tools and the agent's floor) and the pool's model ``aliases`` (the names and
    patterns of poolModelAliases, as /v1/models lists them): ``{"agent", "model", "baseUrl",
    "env": {NAME: value}, "files": [{"path", "content"}], "run", "notes", "warnings"}``. Paths
    start with ``~``: the agent's home. Agents always go through the node (never an engine
    directly, even when apps do): the node speaks their dialect when the engine does not."""
    if agent not in AGENTS:
        raise ValueError(f"unknown agent {agent!r}: choose one of {', '.join(AGENTS)}")
    base = handout["anthropicBaseUrl"]
    openai_url = base + "/v1"
    model = handout.get("model") or "auto"
    window = handout.get("numCtx")
    output = min(_AGENT_MAX_OUTPUT, window // _OUTPUT_SHARE) if window else None
    key_note = (f"{INSIDE_KEY!r} stands for the key: inside the tailnet the node asks for none, and any word will "
                "do; from outside, an inference key (`hubpool api-key create --scope inference`)")
    env: dict[str, str]
    files: list[dict[str, str]] = []
    if agent == "claude-code":
        env = {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_AUTH_TOKEN": INSIDE_KEY, "ANTHROPIC_MODEL": model}
        notes = [key_note]
        table = {name: "" for name in aliases}
        caught = [found[1] for name in _CLAUDE_NAMES if (found := alias_target(table, name, lambda _m: False))]
        if len(caught) == len(_CLAUDE_NAMES):
            notes.append(f"Claude Code's own model names (claude-haiku-… for background work, sub-agents) resolve "
                         f"through the pool's alias {caught[0]!r}: no model variable beyond ANTHROPIC_MODEL")
        else:
            # the background and sub-agent models: Claude Code asks for claude-haiku-… otherwise
            env.update(dict.fromkeys(_CLAUDE_MODEL_VARS, model))
        # telemetry, error reports and update checks would go to Anthropic
        env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
        if output:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(output)
        run = "claude"
    elif agent == "codex":
        env = {"HUBPOOL_API_KEY": INSIDE_KEY}
        lines = [f"# Codex through hubpool at {base}: top-level keys before the first table",
                 f"model = {_toml(model)}", 'model_provider = "hubpool"']
        if window:
            lines.append(f"model_context_window = {window}")
        lines += ["check_for_update_on_startup = false", "",
                  "[model_providers.hubpool]", 'name = "hubpool"', f"base_url = {_toml(openai_url)}",
                  'env_key = "HUBPOOL_API_KEY"', 'wire_api = "responses"', "",
                  "# usage analytics (to OpenAI) and the plugin catalogue (from GitHub): a pool needs neither",
                  "[analytics]", "enabled = false", "", "[features]", "plugins = false", ""]
        files.append({"path": "~/.codex/config.toml", "content": "\n".join(lines)})
        run, notes = "codex", [key_note, "merge into an existing ~/.codex/config.toml rather than replace it"]
    else:
        limits = {"limit": {"context": window, "output": output}} if window and output else {}
        config = {"$schema": "https://opencode.ai/config.json",
                  "provider": {"hubpool": {"npm": "@ai-sdk/openai-compatible", "name": "hubpool",
                                           "options": {"baseURL": openai_url, "apiKey": "{env:HUBPOOL_API_KEY}"},
                                           "models": {model: {"name": model, **limits}}}},
                  "model": f"hubpool/{model}", "small_model": f"hubpool/{model}",
                  "autoupdate": False, "share": "disabled"}
        files.append({"path": "~/.config/opencode/opencode.json", "content": json.dumps(config, indent=2) + "\n"})
        # the catalogue of hosted models, fetched from models.dev at every start: a pool needs none
        env = {"HUBPOOL_API_KEY": INSIDE_KEY, "OPENCODE_DISABLE_MODELS_FETCH": "1"}
        run, notes = "opencode", [key_note, "or put the same file in a project as ./opencode.json"]
    return {"agent": agent, "model": model, "baseUrl": base, "env": env, "files": files, "run": run,
            "notes": notes, "warnings": list(handout.get("warnings") or []), "servedBy": handout.get("servedBy") or []}
