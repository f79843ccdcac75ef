"""The checks behind the field table's `bounded` decisions (fields.py): each takes the field's
value as the client sent it and returns the value the engine gets (usually the same object), or
raises the sidecar's 400. Walks of nested values are bounded by depth before they recurse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.lax import as_int
from palmyra_serve.sidecar.policy import structured

MAX_MODEL_NAME = 256  # longer than any served name; vLLM echoes an unknown one in its 404
MAX_STOP_CHARS = 1000  # each stop string is searched for in the new text at every token
MAX_TOKEN_ID_LIST = 4096  # stop_token_ids, allowed_token_ids: a set built once per request
MAX_BAD_WORDS = 128  # each is tokenized and matched at every step
MAX_LOGIT_BIAS = 1024  # entries applied to the logits at every step
MAX_DOCUMENTS = 64
MAX_TEMPLATE_KWARGS = 16
MAX_TEMPLATE_VALUE = 1000
# Chat message content parts this text-only model reads; any other part (image_url, input_audio,
# video_url, file) would make the engine fetch or decode media for a model that has no use for it.
TEXT_PARTS = frozenset({"text", "refusal"})
# What a client may not set through chat_template_kwargs: the template's own inputs, which the
# request's fields set (and the sidecar has checked).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template"}
)


@dataclass(slots=True)
class Limits:
    """Everything a check compares with, from the settings (relay/handler.py builds it once)."""

    max_tokens: int
    max_choices: int
    max_logprobs: int
    prompt_logprobs_max_tokens: int
    structured: structured.StructuredLimits


@dataclass(slots=True)
class Seen:
    """What the checks learned about one request, for the checks that follow and the relay."""

    limits: Limits
    budget: Any = None  # the structured-output units counted so far
    extra_prompt_bytes: int = 0  # tools and documents, rendered into the prompt by the template


def model_name(value: Any, seen: Seen) -> Any:
    if isinstance(value, str) and len(value) > MAX_MODEL_NAME:
        raise errors.parameter_too_large("model (characters)", len(value), MAX_MODEL_NAME)
    return value


def stop(value: Any, seen: Seen) -> Any:
    for one in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
        if isinstance(one, str) and len(one) > MAX_STOP_CHARS:
            raise errors.parameter_too_large("stop (characters)", len(one), MAX_STOP_CHARS)
    return value


def _list_bound(name: str, cap: int):  # type: ignore[no-untyped-def]
    def check(value: Any, seen: Seen) -> Any:
        if isinstance(value, list | dict) and len(value) > cap:
            raise errors.parameter_too_large(name, len(value), cap)
        return value

    check.__name__ = f"at_most_{cap}"
    return check


token_id_list = _list_bound("token ids", MAX_TOKEN_ID_LIST)
bad_words = _list_bound("bad_words", MAX_BAD_WORDS)
logit_bias = _list_bound("logit_bias", MAX_LOGIT_BIAS)


def structured_field(name: str):  # type: ignore[no-untyped-def]
    def check(value: Any, seen: Seen) -> Any:
        seen.budget = structured.check(value, name, seen.limits.structured, seen.budget)
        return value

    check.__name__ = f"structured_{name}"
    return check


_tool_schemas = structured_field("tools")


def tools(value: Any, seen: Seen) -> Any:
    if value is None:
        return value
    if not isinstance(value, list):
        raise errors.invalid_parameter("tools", "tools must be a list.")
    _tool_schemas(value, seen)  # parameter schemas become grammars for required or named calls
    seen.extra_prompt_bytes += len(orjson.dumps(value))  # its depth was checked just above
    return value


def documents(value: Any, seen: Seen) -> Any:
    if value is None:
        return value
    if not isinstance(value, list) or len(value) > MAX_DOCUMENTS:
        raise errors.invalid_parameter("documents", f"documents must be a list of at most {MAX_DOCUMENTS} objects.")
    for doc in value:
        if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
            raise errors.invalid_parameter("documents", "each document must be an object of strings.")
        seen.extra_prompt_bytes += sum(len(v.encode()) for v in doc.values())
    return value


def template_kwargs(value: Any, seen: Seen) -> Any:
    if value is None:
        return value
    if not isinstance(value, dict) or len(value) > MAX_TEMPLATE_KWARGS:
        raise errors.invalid_parameter(
            "chat_template_kwargs", f"chat_template_kwargs must be an object of at most {MAX_TEMPLATE_KWARGS} entries."
        )
    for key, one in value.items():
        if key in RESERVED_TEMPLATE_KWARGS:
            raise errors.invalid_parameter("chat_template_kwargs", f"chat_template_kwargs may not set {key!r}.")
        if not (
            one is None
            or isinstance(one, bool | int | float)
            or (isinstance(one, str) and len(one) <= MAX_TEMPLATE_VALUE)
        ):
            raise errors.invalid_parameter(
                "chat_template_kwargs", "chat_template_kwargs values must be booleans, numbers or short strings."
            )
    return value


def messages(value: Any, seen: Seen) -> Any:
    """Roles (policy/cost.py) are checked with the cost; here the content parts: text only."""
    if not isinstance(value, list):
        return value  # cost.check answers it
    for message in value:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in TEXT_PARTS:
                    shown = kind[:40] if isinstance(kind, str) else type(part).__name__
                    raise errors.unsupported_parameter(
                        "messages", f"content parts of type {shown!r}: this model reads text only."
                    )
    return value


def prompt(value: Any, seen: Seen) -> Any:
    """A string, a list of token ids, a list of strings, or a list of lists of token ids: nothing
    deeper (vLLM's own model stops there too, but only after the sidecar would have walked it)."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise errors.invalid_parameter("prompt", "prompt must be a string, a list of strings or token ids.")
    for one in value:
        if isinstance(one, int | str):
            continue
        if isinstance(one, list) and all(type(t) is int for t in one):
            continue
        raise errors.invalid_parameter("prompt", "prompt must be a string, a list of strings or token ids.")
    return value


def detokenize_tokens(value: Any, seen: Seen) -> Any:
    if isinstance(value, list) and len(value) > seen.limits.max_tokens:
        raise errors.parameter_too_large("tokens", len(value), seen.limits.max_tokens)
    return value


def thinking_budget(value: Any, seen: Seen) -> Any:
    asked = as_int({"thinking_token_budget": value}, "thinking_token_budget")
    if asked is not None and not 0 <= asked <= seen.limits.max_tokens:
        raise errors.parameter_too_large("thinking_token_budget", asked, seen.limits.max_tokens)
    return value


def repetition_detection(value: Any, seen: Seen) -> Any:
    if value is None:
        return value
    if not isinstance(value, dict) or not all(
        k in ("max_pattern_size", "min_pattern_size", "min_count") for k in value
    ):
        raise errors.invalid_parameter(
            "repetition_detection", "repetition_detection takes max_pattern_size, min_pattern_size and min_count."
        )
    for key in value:
        asked = as_int(value, key)
        if asked is not None and asked > 256:
            raise errors.parameter_too_large(f"repetition_detection.{key}", asked, 256)
    return value
