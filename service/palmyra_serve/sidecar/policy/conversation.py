"""The checks behind the `bounded` decisions of the Responses and Messages APIs' own fields
(fields.py): their input items and content blocks, their tools, and the small objects both echo.

What they hold to: text in, text out (this model reads no images, files or audio); only function
tools (the APIs' built-in tools, such as web search, code interpreter, MCP or the Anthropic server
tools, need tool servers this service does not run); nothing that reads a stored response (this
service keeps none). What a structured part costs the prompt (a tool call's input, a tool result
that is not text) is counted by its bytes into the reservation, as chat's tools are (checks.tools).
"""

from __future__ import annotations

from typing import Any

import orjson

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.policy import checks

# Responses input items this service serves: messages, function calls and their outputs, and the
# model's own reasoning items a client sends back. `item_reference` reads a stored item; the rest
# (web search, file search, computer, MCP, code interpreter, image generation, shell calls) are
# records of built-in tools this service does not run.
RESPONSES_ITEMS = frozenset({"message", "function_call", "function_call_output", "reasoning"})
RESPONSES_ROLES = frozenset({"user", "assistant", "system", "developer"})
# Content parts that carry text (input and output); input_image, input_file and input_audio do not.
RESPONSES_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"})
# Anthropic content blocks this service serves: text, tool calls and results, and thinking blocks
# sent back; image, document, search_result and the server tools' blocks are refused.
MESSAGES_BLOCKS = frozenset({"text", "tool_use", "tool_result", "thinking", "redacted_thinking"})
MAX_INCLUDE = 16
MAX_INCLUDE_CHARS = 100
# OpenAI's own limits on metadata: 16 pairs, keys of at most 64 characters, values of at most 512.
MAX_METADATA = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MAX_STOP_SEQUENCES = 16


def _text_only(param: str, kind: Any) -> errors.ApiError:
    shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
    return errors.unsupported_parameter(param, f"content of type {shown!r}: this model reads text only.")


def _structured_bytes(value: Any, seen: checks.Seen, param: str) -> None:
    """A structured part's bytes count into the prompt's reservation; a value nested past what JSON
    encoding allows is the client's 400."""
    try:
        seen.extra_prompt_bytes += len(orjson.dumps(value))
    except orjson.JSONEncodeError:
        raise errors.invalid_parameter(param, f"{param} is nested too deeply.") from None


def responses_input(value: Any, seen: checks.Seen) -> Any:
    """A string, or a list of input items, each a message (text parts only), a function call, a
    function call's output or a reasoning item."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise errors.invalid_parameter("input", "input must be a string or a list of input items.")
    for item in value:
        if not isinstance(item, dict):
            raise errors.invalid_parameter("input", "input must be a string or a list of input items.")
        kind = item.get("type", "message")
        if kind not in RESPONSES_ITEMS:
            shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
            why = (
                "it reads a stored item, and this service stores none: send the item itself"
                if kind == "item_reference"
                else "this service runs function tools only"
            )
            raise errors.unsupported_parameter("input", f"input items of type {shown!r}: {why}.")
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in RESPONSES_ROLES:
                raise errors.invalid_role(role, ", ".join(sorted(RESPONSES_ROLES)))
        for key in ("content", "summary"):
            parts = item.get(key)
            for part in parts if isinstance(parts, list) else []:
                part_kind = part.get("type") if isinstance(part, dict) else None
                if part_kind not in RESPONSES_TEXT_PARTS:
                    raise _text_only("input", part_kind)
    return value


def responses_tools(value: Any, seen: checks.Seen) -> Any:
    """Function tools only; their parameter schemas bounded as chat's tools are."""
    if value is None:
        return value
    if not isinstance(value, list):
        raise errors.invalid_parameter("tools", "tools must be a list.")
    for tool in value:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            shown = kind[:40] if isinstance(kind, str) else type(tool).__name__
            raise errors.unsupported_parameter(
                "tools", f"tools of type {shown!r}: built-in tools need tool servers this service does not run."
            )
    return checks.tools(value, seen)


def messages_tools(value: Any, seen: checks.Seen) -> Any:
    """Client tools only (a name, a description, an input schema); the Anthropic server tools (web
    search, code execution, bash, text editor, computer) are refused."""
    if value is None:
        return value
    if not isinstance(value, list):
        raise errors.invalid_parameter("tools", "tools must be a list.")
    for tool in value:
        if not isinstance(tool, dict):
            raise errors.invalid_parameter("tools", "each tool must be an object.")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
            raise errors.unsupported_parameter(
                "tools", f"tools of type {shown!r}: server tools need tool servers this service does not run."
            )
    return checks.tools(value, seen)


def messages_system(value: Any, seen: checks.Seen) -> Any:
    """A string or a list of text blocks."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise errors.invalid_parameter("system", "system must be a string or a list of text blocks.")
    for block in value:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise _text_only("system", kind)
    return value


def messages_content(value: Any, seen: checks.Seen) -> Any:
    """Roles are checked with the cost (policy/cost.py); here each message's content: a string, or
    text, tool-use, tool-result and thinking blocks (a tool result's own content: a string or text
    blocks). A tool call's input counts into the reservation by its bytes."""
    if not isinstance(value, list):
        return value  # cost.check answers it
    for message in value:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in MESSAGES_BLOCKS:
                raise _text_only("messages", kind)
            assert isinstance(block, dict)
            if kind == "tool_use":
                _structured_bytes(block.get("input"), seen, "messages")
            elif kind == "tool_result":
                inner = block.get("content")
                for part in inner if isinstance(inner, list) else []:
                    part_kind = part.get("type") if isinstance(part, dict) else None
                    if part_kind != "text":
                        raise _text_only("messages", part_kind)
    return value


def include(value: Any, seen: checks.Seen) -> Any:
    if value is None:
        return value
    if (
        not isinstance(value, list)
        or len(value) > MAX_INCLUDE
        or not all(isinstance(v, str) and len(v) <= MAX_INCLUDE_CHARS for v in value)
    ):
        raise errors.invalid_parameter(
            "include", f"include must be a list of at most {MAX_INCLUDE} names of what to include."
        )
    return value


def metadata(value: Any, seen: checks.Seen) -> Any:
    """Echoed in the response: at most OpenAI's own 16 short string pairs."""
    if value is None:
        return value
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise errors.invalid_parameter("metadata", f"metadata must be an object of at most {MAX_METADATA} entries.")
    for key, one in value.items():
        if len(key) > MAX_METADATA_KEY or not (
            one is None or (isinstance(one, str) and len(one) <= MAX_METADATA_VALUE)
        ):
            raise errors.invalid_parameter(
                "metadata",
                f"metadata keys must be at most {MAX_METADATA_KEY} characters and values strings of at most "
                f"{MAX_METADATA_VALUE}.",
            )
    return value


def stop_sequences(value: Any, seen: checks.Seen) -> Any:
    if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
        raise errors.parameter_too_large("stop_sequences", len(value), MAX_STOP_SEQUENCES)
    return checks.stop(value, seen)


def thinking(value: Any, seen: checks.Seen) -> Any:
    """Extended thinking's budget: at most the max_tokens cap (its tokens are generated tokens)."""
    if isinstance(value, dict) and "budget_tokens" in value:
        checks.thinking_budget(value["budget_tokens"], seen)
    return value
