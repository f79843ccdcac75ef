"""A request's prompt in tokens, estimated without a tokenizer (the sidecar has none).

A list of token ids counts exactly; text counts one token per 4 bytes of UTF-8, rounded up
(English text runs about 4 characters a token for Qwen2's tokenizer), plus 4 per chat message for
its role and template; tools and documents, which the chat template renders into the prompt,
count by their bytes the same way. The Responses API's `instructions` and `input` items, and the
Messages API's `system` and content blocks, count their text the same way; their structured parts
(tool calls' inputs, tool results that are not text) are counted by policy/checks.py as extra
bytes. The shapes walked are the ones policy/checks.py let through (nothing nested deeper than
vLLM's own models allow), so no walk here recurses.
"""

from __future__ import annotations

import math
from typing import Any

from palmyra_serve.sidecar.core.routes import Api

BYTES_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", "replace")) / BYTES_PER_TOKEN)


def completion_prompt(prompt: Any) -> tuple[int, int]:
    """(estimated tokens, number of prompts) of a completions `prompt`."""
    if isinstance(prompt, str):
        return text_tokens(prompt), 1
    if not isinstance(prompt, list) or not prompt:
        return 0, 1
    if all(type(t) is int for t in prompt):
        return len(prompt), 1
    total = 0
    for one in prompt:
        if isinstance(one, str):
            total += text_tokens(one)
        elif isinstance(one, list):
            total += len(one)
        else:
            total += 1
    return total, len(prompt)


def content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return text_tokens(content)
    if isinstance(content, list):  # content parts: the text ones count
        return sum(text_tokens(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def chat_prompt(messages: Any) -> int:
    return sum(
        TOKENS_PER_MESSAGE + content_tokens(m.get("content"))
        for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, dict)
    )


def _strings(item: dict[str, Any], keys: tuple[str, ...]) -> int:
    return sum(text_tokens(v) for k in keys if isinstance(v := item.get(k), str))


# The text a Responses input item carries, by key: a message's content, a function call's name and
# arguments, a tool's output, a reasoning item's summary or content parts (walked as content).
_ITEM_TEXT = ("arguments", "output", "name")
_ITEM_PARTS = ("content", "summary")


def responses_prompt(payload: dict[str, Any]) -> int:
    """`instructions` and `input`: a string, or a list of items (messages, function calls and outputs)."""
    total = text_tokens(i) if isinstance(i := payload.get("instructions"), str) else 0
    given = payload.get("input")
    if isinstance(given, str):
        return total + TOKENS_PER_MESSAGE + text_tokens(given)
    for item in given if isinstance(given, list) else []:
        if isinstance(item, dict):
            total += TOKENS_PER_MESSAGE + _strings(item, _ITEM_TEXT)
            total += sum(content_tokens(item.get(k)) for k in _ITEM_PARTS)
    return total


def messages_prompt(payload: dict[str, Any]) -> int:
    """Anthropic's `system` (a string or text blocks) and `messages` (content a string or blocks; a
    tool result's text counts here, its other blocks as extra bytes)."""
    total = content_tokens(payload.get("system"))
    messages = payload.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        total += TOKENS_PER_MESSAGE + content_tokens(content)
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict):
                total += content_tokens(block.get("content")) + _strings(block, ("thinking", "name"))
    return total


def prompt_estimate(payload: dict[str, Any], api: Api, extra_bytes: int = 0) -> int:
    """The prompt's estimated tokens over all its prompts (extra_bytes: tools, documents, structured
    content blocks)."""
    if api is Api.CHAT:
        base = chat_prompt(payload.get("messages"))
    elif api is Api.RESPONSES:
        base = responses_prompt(payload)
    elif api is Api.MESSAGES:
        base = messages_prompt(payload)
    else:
        base = completion_prompt(payload.get("prompt"))[0]
    return base + math.ceil(extra_bytes / BYTES_PER_TOKEN)
