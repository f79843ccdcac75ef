"""A request's prompt in tokens, estimated without a tokenizer (the sidecar has none).

A list of token ids counts exactly; text counts one token per 4 bytes of UTF-8, rounded up
(English text runs about 4 characters a token for Qwen2's tokenizer), plus 4 per chat message for
its role and template; tools and documents, which the chat template renders into the prompt,
count by their bytes the same way. The shapes walked are the ones policy/checks.py let through
(nothing nested deeper than vLLM's own models allow), so no walk here recurses.
"""

from __future__ import annotations

import math
from typing import Any

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


def prompt_estimate(payload: dict[str, Any], chat: bool, extra_bytes: int = 0) -> int:
    """The prompt's estimated tokens over all its prompts (extra_bytes: tools and documents)."""
    base = chat_prompt(payload.get("messages")) if chat else completion_prompt(payload.get("prompt"))[0]
    return base + math.ceil(extra_bytes / BYTES_PER_TOKEN)
