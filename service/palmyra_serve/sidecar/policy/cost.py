"""What a generation request will cost the engine, checked on the values vLLM will actually use
(read laxly, core/lax.py), before it takes an admission slot.

Checked (vLLM 0.32's CompletionRequest / ChatCompletionRequest / ResponsesRequest /
AnthropicMessagesRequest fields):
- max_tokens, max_completion_tokens, min_tokens, max_output_tokens: at most the cap (default
  max-model-len).
- n, best_of (older vLLM; harmless when ignored): 1..max_choices; beam search's width is n.
- completions' prompt as a list: each element is one request inside the engine, so prompts × n
  (the sequences generated) is at most max_choices.
- logprobs (completions: an int), top_logprobs (chat), prompt_logprobs: 0..max_logprobs, and
  the length of logprob_token_ids: per generated token work.
- chat message roles: only OpenAI's chat schema (vLLM accepts any role as a custom message); the
  Messages API's roles: user and assistant (its system prompt has a field of its own).
Every other field has its own decision in policy/fields.py.
"""

from __future__ import annotations

from typing import Any, Protocol

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.lax import as_int
from palmyra_serve.sidecar.core.routes import Api

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_ROLES_TEXT = ", ".join(sorted(CHAT_ROLES))
MESSAGES_ROLES = frozenset({"user", "assistant"})
_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens", "max_output_tokens")
_LOGPROB_FIELDS = ("logprobs", "top_logprobs", "prompt_logprobs")


class CostLimits:
    __slots__ = ("max_choices", "max_logprobs", "max_tokens")

    def __init__(self, max_tokens: int, max_choices: int, max_logprobs: int) -> None:
        self.max_tokens = max_tokens
        self.max_choices = max_choices
        self.max_logprobs = max_logprobs


class CostBounds(Protocol):
    max_tokens: int
    max_choices: int
    max_logprobs: int


def check(payload: Any, limits: CostBounds, api: Api) -> None:
    """Raise an ApiError (400) when the request asks for more than the limits allow."""
    if not isinstance(payload, dict):
        # vLLM 0.32 answers an array or null body with a 400, vLLM 0.18 (the Ascend image's) with
        # a 500: refused here, the same on both.
        raise errors.not_a_json_object()
    for param in _TOKEN_FIELDS:
        asked = as_int(payload, param)
        if asked is None:
            continue
        if asked > limits.max_tokens:
            raise errors.max_tokens_too_large(asked, limits.max_tokens, param)
        if asked < 0:
            raise errors.invalid_parameter(param, f"{param} must not be negative.")
    choices = 1
    for param in ("n", "best_of"):
        asked = as_int(payload, param)
        if asked is None:
            continue
        if asked < 1:
            raise errors.invalid_parameter(param, f"{param} must be at least 1.")
        if asked > limits.max_choices:
            raise errors.parameter_too_large(param, asked, limits.max_choices)
        choices = max(choices, asked)
    for param in _LOGPROB_FIELDS:
        if api is not Api.COMPLETIONS and param == "logprobs":
            continue  # a boolean in chat; top_logprobs carries the size
        asked = as_int(payload, param)
        if asked is None:
            continue
        if asked < 0:  # vLLM reads -1 as "the whole vocabulary"
            raise errors.invalid_parameter(param, f"{param} must be between 0 and {limits.max_logprobs}.")
        if asked > limits.max_logprobs:
            raise errors.parameter_too_large(param, asked, limits.max_logprobs)
    ids = payload.get("logprob_token_ids")
    if isinstance(ids, list) and len(ids) > limits.max_logprobs:
        raise errors.parameter_too_large("logprob_token_ids", len(ids), limits.max_logprobs)
    if api is Api.CHAT:
        _check_roles(payload.get("messages"), CHAT_ROLES, _ROLES_TEXT)
    elif api is Api.MESSAGES:
        _check_roles(payload.get("messages"), MESSAGES_ROLES, "user, assistant")
    elif api is Api.COMPLETIONS:
        prompts = _prompt_count(payload.get("prompt"))
        if prompts * choices > limits.max_choices:
            raise errors.parameter_too_large("prompt", prompts * choices, limits.max_choices)


def _prompt_count(prompt: object) -> int:
    """Completions take one prompt (a string or a list of token ids) or a list of them."""
    if not isinstance(prompt, list) or not prompt or isinstance(prompt[0], int):
        return 1
    return len(prompt)


def _check_roles(messages: object, roles: frozenset[str], text: str) -> None:
    if not isinstance(messages, list):
        raise errors.invalid_parameter("messages", "messages must be a list of message objects.")
    for message in messages:
        if not isinstance(message, dict):
            raise errors.invalid_parameter("messages", "messages must be a list of message objects.")
        role = message.get("role")
        if not isinstance(role, str) or role not in roles:
            raise errors.invalid_role(role, text)
