"""The field table (fields.py) applied to one request body.

Every top-level field is looked up in its route's table: passed fields are left alone, stripped
ones removed, refused ones answered with a 400 (an inert default is dropped instead), bounded ones
checked (policy/checks.py); rewritten ones are read here and set by the relay's body rewrite
(stream, stream_options, priority, cache_salt). A field no table names is refused. Then the
request's cost is checked as a whole (policy/cost.py) and what prices it is read: the values the
reservation and the relay decide on are the ones vLLM will use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.lax import as_bool, as_dict, as_int
from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.policy import checks, cost
from palmyra_serve.sidecar.policy.fields import Decision, Rule


@dataclass(slots=True)
class Inspection:
    """What the relay needs of a checked body: the values it decides on, as vLLM reads them."""

    changed: bool  # something was removed or normalised: the body must be re-encoded
    streams: bool
    wants_usage: bool  # the client asked for the stream's usage event itself
    continuous_usage: bool
    extra_prompt_bytes: int  # tools and documents, which the chat template renders into the prompt


def inspect(payload: Any, table: Mapping[str, Rule], limits: checks.Limits, api: Api | None) -> Inspection:
    """Apply the route's table to `payload` (edited in place); raise an ApiError (400) on refusal."""
    if not isinstance(payload, dict):
        raise errors.not_a_json_object()
    seen = checks.Seen(limits)
    changed = False
    for name in list(payload):
        rule = table.get(name)
        if rule is None:
            raise errors.unknown_parameter(name)
        decision = rule.decision
        if decision is Decision.PASSED:
            continue
        if decision is Decision.BOUNDED:
            if rule.check is not None:
                rule.check(payload[name], seen)
        elif decision is Decision.STRIPPED:
            del payload[name]
            changed = True
        elif decision is Decision.REFUSED:
            if payload[name] not in rule.inert:
                raise errors.unsupported_parameter(name, rule.why)
            del payload[name]
            changed = True
    if api is None:
        return Inspection(changed, False, False, False, seen.extra_prompt_bytes)
    cost.check(payload, limits, api)
    streams = bool(as_bool(payload, "stream"))
    if "stream" in payload and type(payload["stream"]) is not bool:
        payload["stream"] = streams  # the engine gets the value the relay decided on
        changed = True
    options = as_dict(payload, "stream_options") or {}
    wants_usage = bool(as_bool(options, "include_usage")) if streams else False
    continuous = bool(as_bool(options, "continuous_usage_stats")) if streams else False
    if _prompt_logprobs(payload, api):
        _check_prompt_logprobs(payload, api, limits, seen)
    return Inspection(changed, streams, wants_usage, continuous, seen.extra_prompt_bytes)


def _prompt_logprobs(payload: dict, api: Api) -> bool:
    """Whether the engine computes logprobs over the prompt: prompt_logprobs, or (completions)
    echo with logprobs, which returns the prompt's logprobs too."""
    if as_int(payload, "prompt_logprobs"):
        return True
    return api is Api.COMPLETIONS and bool(as_bool(payload, "echo")) and as_int(payload, "logprobs") is not None


def _check_prompt_logprobs(payload: dict, api: Api, limits: checks.Limits, seen: checks.Seen) -> None:
    from palmyra_serve.sidecar.core.prompt import prompt_estimate

    prompt = prompt_estimate(payload, api, seen.extra_prompt_bytes)
    if prompt > limits.prompt_logprobs_max_tokens:
        raise errors.ApiError.of(
            errors.ErrorCode.PARAMETER_TOO_LARGE,
            f"prompt logprobs (prompt_logprobs, or echo with logprobs) are served for prompts of at most "
            f"{limits.prompt_logprobs_max_tokens} tokens; this one is about {prompt}: each prompt position costs "
            "a log-softmax over the whole vocabulary.",
            param="prompt_logprobs",
        )
