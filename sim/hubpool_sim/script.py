"""A scripted model: the tool calls a test names, then a short answer (``SimConfig.tool_script``).

The default model (hubpool_sim/tools.py) calls the first two tools it is offered with
placeholder arguments, which suits a test that sends its own two tools. A real agent offers
ten to twenty (spawn a sub-agent, run a shell, write a file), so a test driving one names
the calls instead. A script is a list of steps; the step a request gets is the number of
tool results its conversation already holds, in any dialect (Messages ``tool_result``
blocks, Responses ``function_call_output`` items, chat ``role: "tool"`` messages), so it
needs no memory between requests and any engine of a pool answers a turn alike. A step
maps tool names to their arguments; the first name the request offers as a tool is called
(one call), which lets one script serve clients that name the same tool differently:

    [{"Read": {"file_path": "/w/notes.txt"},        # Claude Code
      "read": {"filePath": "/w/notes.txt"},         # OpenCode
      "exec_command": {"cmd": "cat notes.txt"}}]    # Codex

A request past the last step, offering none of the step's tools, or offering no tools at
all, is answered with text. A scripted model also ends its text on its own: ``tokens``
tokens and a natural stop, whatever ``max_tokens`` the client asked for (agents ask for
32000, which the default model would spend in full). ``tool_script=[]`` is a model that
never calls a tool.
"""

from __future__ import annotations

from typing import Any

from hubpool_sim.config import SimConfig
from hubpool_sim.tools import ToolCall, planned_calls

_RESULT_ITEMS = ("function_call_output", "custom_tool_call_output")


def tool_results(turns: Any) -> int:
    """How many tool results a conversation holds: ``turns`` is a request's messages (chat,
    Messages) or its input items (Responses)."""
    if not isinstance(turns, list):
        return 0
    count = 0
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        if turn.get("role") == "tool" or turn.get("type") in _RESULT_ITEMS:
            count += 1
        elif isinstance(turn.get("content"), list):
            count += sum(1 for b in turn["content"] if isinstance(b, dict) and b.get("type") == "tool_result")
    return count


def _offered(tools: Any) -> set[str]:
    names = set()
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict):
            fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            if isinstance(fn.get("name"), str):
                names.add(fn["name"])
    return names


def calls_for(config: SimConfig, tools: Any, turns: Any, last_is_tool_result: bool) -> list[ToolCall]:
    """The calls the model makes for this request: the default model's without a script,
    else the script's step for this conversation (see the module docstring)."""
    if config.tool_script is None:
        return planned_calls(tools, last_is_tool_result)
    step = tool_results(turns)
    if step >= len(config.tool_script):
        return []
    offered = _offered(tools)
    for name, arguments in config.tool_script[step].items():
        if name in offered:
            return [ToolCall(name, dict(arguments))]
    return []


def answer_limit(config: SimConfig, max_tokens: int | None) -> int | None:
    """The ``max_tokens`` a generation runs to: a scripted model stops on its own."""
    return None if config.tool_script is not None else max_tokens
