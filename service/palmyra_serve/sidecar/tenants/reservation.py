"""What a generation reserves against its tenant's tokens per minute before its usage is known.

The sidecar has no tokenizer, so the reservation is an estimate, corrected when the request ends
by the engine's own usage report (quota.Quotas.settle):

- prompt: a list of token ids counts exactly; text counts one token per 4 bytes of UTF-8, rounded
  up (English text runs about 4 characters a token for Qwen2's tokenizer), plus 4 per chat
  message for its role and template;
- completion: max_tokens (or max_completion_tokens) when set, else PALMYRA_QUOTA_RESERVE_TOKENS,
  times the sequences generated (n, and every prompt of a list). Reserving max-model-len for a
  request that sets no max_tokens would throttle a tenant far below its limit; the correction at
  the end makes the total exact either way.

For a stream that did not ask for usage, the engine reports none, so the relay asks for it
(stream_options.include_usage) and removes that one extra event before the client sees it
(relay/usage_event.py): the client gets exactly the stream it asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from palmyra_serve.sidecar.relay.cost import as_int

BYTES_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


@dataclass(frozen=True, slots=True)
class Demand:
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", "replace")) / BYTES_PER_TOKEN)


def _prompt_tokens(prompt: Any) -> tuple[int, int]:
    """(estimated tokens, number of prompts) of a completions `prompt`."""
    if isinstance(prompt, str):
        return _text_tokens(prompt), 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return len(prompt), 1
        total = 0
        for one in prompt:
            total += _prompt_tokens(one)[0]
        return total, len(prompt)
    return 0, 1


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return _text_tokens(content)
    if isinstance(content, list):  # content parts: the text ones count
        return sum(_text_tokens(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def demand(payload: dict[str, Any], chat: bool, reserve_tokens: int) -> Demand:
    """The tokens to reserve for a generation request whose cost relay/cost.py already checked."""
    if chat:
        messages = payload.get("messages")
        prompt = sum(
            TOKENS_PER_MESSAGE + _content_tokens(m.get("content"))
            for m in (messages if isinstance(messages, list) else [])
            if isinstance(m, dict)
        )
        prompts = 1
    else:
        prompt, prompts = _prompt_tokens(payload.get("prompt"))
    asked = as_int(payload, "max_completion_tokens") if chat else None
    if asked is None:
        asked = as_int(payload, "max_tokens")
    per_sequence = reserve_tokens if asked is None else asked
    choices = max(1, as_int(payload, "n") or 1)
    return Demand(prompt, per_sequence * choices * prompts)


def wants_usage(payload: dict[str, Any]) -> bool:
    """The client asked for a streamed usage report (so the relay must not remove it)."""
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def streams(payload: dict[str, Any]) -> bool:
    return payload.get("stream") is True
