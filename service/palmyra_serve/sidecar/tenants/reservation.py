"""What a generation reserves against its tenant's tokens per minute before its usage is known.

The sidecar has no tokenizer, so the reservation is an estimate (core/prompt.py for the prompt),
corrected when the request ends by the engine's own usage report (quota.Quotas.settle). The
completion part covers everything that makes the engine generate, read as vLLM reads it:

- per sequence: max_tokens (or max_completion_tokens, or the Responses API's max_output_tokens)
  when set, else PALMYRA_QUOTA_RESERVE_TOKENS;
  at least min_tokens (the engine may not stop before it); with ignore_eos and no max_tokens, the
  whole cap (the engine generates until max-model-len);
- sequences: the larger of n and best_of, times every prompt of a list.

Reserving the cap for every request that sets no max_tokens would throttle a tenant far below its
limit; the correction at the end makes the total exact either way (docs/tenants.md says how far a
minute can overshoot meanwhile).

For a stream, the relay asks the engine for its usage report however the client spelled `stream`
(stream_options.include_usage) and removes that one extra event before the client sees it
(relay/usage_event.py): the client gets exactly the stream it asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from palmyra_serve.sidecar.core.lax import as_bool, as_int
from palmyra_serve.sidecar.core.prompt import completion_prompt, prompt_estimate
from palmyra_serve.sidecar.core.routes import Api

# The field that caps a sequence's tokens, by API (chat: max_completion_tokens first).
_CAP_FIELDS = {
    Api.COMPLETIONS: ("max_tokens",),
    Api.CHAT: ("max_completion_tokens", "max_tokens"),
    Api.RESPONSES: ("max_output_tokens",),
    Api.MESSAGES: ("max_tokens",),
}


@dataclass(frozen=True, slots=True)
class Demand:
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def demand(payload: dict[str, Any], api: Api, reserve_tokens: int, cap: int, extra_prompt_bytes: int = 0) -> Demand:
    """The tokens to reserve for a generation request whose fields policy/ already checked."""
    prompt = prompt_estimate(payload, api, extra_prompt_bytes)
    prompts = completion_prompt(payload.get("prompt"))[1] if api is Api.COMPLETIONS else 1
    asked = None
    for field in _CAP_FIELDS[api]:
        if (asked := as_int(payload, field)) is not None:
            break
    # ignore_eos without max_tokens: the engine generates up to max-model-len.
    unset = cap if as_bool(payload, "ignore_eos") else reserve_tokens
    per_sequence = unset if asked is None else asked
    per_sequence = min(cap, max(per_sequence, as_int(payload, "min_tokens") or 0))
    choices = max(1, as_int(payload, "n") or 1, as_int(payload, "best_of") or 1)
    return Demand(prompt, per_sequence * choices * prompts)
