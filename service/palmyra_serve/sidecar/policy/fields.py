"""One decision for every field of vLLM's request models, per relayed route.

The engine's request models (vLLM 0.32's and the Ascend image's 0.18.0's; the field lists are
kept in tests/unit/data/vllm-request-fields.json and checked against the installed classes of both)
allow extra fields and read every value laxly. Here each field has exactly one decision:

- bounded: read as vLLM reads it and checked against a bound (the check and its reason);
- rewritten: the sidecar sets the value the engine gets (the client's is read, then replaced);
- stripped: removed before the body goes upstream;
- refused: a request that sets it (to anything but its inert default) gets a 400 naming it;
- passed: harmless as the engine reads it (why).

A field in no table is refused (`unknown_parameter`), never relayed unread: a vLLM upgrade that
adds a field fails the test that enumerates the models until someone decides here. The Responses
and Messages APIs' tables are in api_fields.py; every route's, by its target, in tables.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from palmyra_serve.sidecar.policy import checks


class Decision(StrEnum):
    BOUNDED = "bounded"
    REWRITTEN = "rewritten"
    STRIPPED = "stripped"
    REFUSED = "refused"
    PASSED = "passed"


@dataclass(frozen=True, slots=True)
class Rule:
    decision: Decision
    why: str
    # bounded: the check (None: checked with the request's cost, policy/cost.py); refused: the values
    # that are inert and simply dropped (a client library that sends the default is not refused).
    check: Callable[[Any, checks.Seen], Any] | None = None
    inert: tuple[Any, ...] = ()


def bounded(why: str, check: Callable[[Any, checks.Seen], Any] | None = None) -> Rule:
    return Rule(Decision.BOUNDED, why, check)


def rewritten(why: str) -> Rule:
    return Rule(Decision.REWRITTEN, why)


def stripped(why: str) -> Rule:
    return Rule(Decision.STRIPPED, why)


def refused(why: str, *inert: Any) -> Rule:
    return Rule(Decision.REFUSED, why, inert=(None, *inert))


def passed(why: str) -> Rule:
    return Rule(Decision.PASSED, why)


COST = "policy/cost.py"
SAMPLING = "a sampling parameter: vLLM checks its range; costs nothing per token beyond a plain request"
OUTPUT_SHAPE = "changes only what the response shows of work the engine does anyway"
MULTIMODAL = "multimodal input or output: this model reads and writes text only"

# Fields of both generation routes (chat and completions), in vLLM's order.
_GENERATION: dict[str, Rule] = {
    "model": bounded(
        f"at most {checks.MAX_MODEL_NAME} characters: vLLM echoes an unknown name in its 404", checks.model_name
    ),
    "frequency_penalty": passed(SAMPLING),
    "presence_penalty": passed(SAMPLING),
    "repetition_penalty": passed(SAMPLING),
    "temperature": passed(SAMPLING),
    "top_p": passed(SAMPLING),
    "top_k": passed(SAMPLING),
    "min_p": passed(SAMPLING),
    "seed": passed(SAMPLING),
    "length_penalty": passed("used by beam search only, which is refused"),
    "logit_bias": bounded(
        f"at most {checks.MAX_LOGIT_BIAS} entries, applied to the logits at every step", checks.logit_bias
    ),
    "max_tokens": bounded(
        f"at most the cap (default max-model-len), not negative ({COST}); reserved in full against a tenant's tokens"
    ),
    "n": bounded(f"1..max_choices, and prompts x n within max_choices ({COST}): each is a sequence"),
    "min_tokens": bounded(f"at most the cap ({COST}); reserved against a tenant's tokens: it forces generation"),
    "ignore_eos": bounded(
        "read laxly; without max_tokens the reservation is the whole cap: it forces generation to max_tokens"
    ),
    "stop": bounded(
        f"vLLM's own 4 strings, each at most {checks.MAX_STOP_CHARS} characters (searched at every token)", checks.stop
    ),
    "stop_token_ids": bounded(f"at most {checks.MAX_TOKEN_ID_LIST} ids", checks.token_id_list),
    "allowed_token_ids": bounded(f"at most {checks.MAX_TOKEN_ID_LIST} ids", checks.token_id_list),
    "bad_words": bounded(f"at most {checks.MAX_BAD_WORDS} words, each matched at every step", checks.bad_words),
    "include_stop_str_in_output": passed(OUTPUT_SHAPE),
    "skip_special_tokens": passed(OUTPUT_SHAPE),
    "spaces_between_special_tokens": passed(OUTPUT_SHAPE),
    "truncate_prompt_tokens": passed("only shortens the prompt; vLLM checks it against max-model-len"),
    "truncation_side": passed("which side truncate_prompt_tokens cuts"),
    "prompt_logprobs": bounded(
        f"0..max_logprobs ({COST}), and only on a prompt of at most "
        "prompt_logprobs_max_tokens: each prompt position costs a log-softmax over the "
        "whole vocabulary"
    ),
    "logprob_token_ids": bounded(f"at most max_logprobs ids ({COST})"),
    "stream": rewritten(
        'read laxly ("true" is true) and sent as a JSON boolean: the relay\'s accounting decides '
        "on the same value the engine uses"
    ),
    "stream_options": rewritten(
        "include_usage set for every stream the sidecar must account (and its event "
        "removed again when the client did not ask); continuous_usage_stats read laxly"
    ),
    "stream_interval": refused(
        "it packs many tokens into one event, which the relay's accounting and admission "
        "read per token; the deployment sets the engine's interval",
        1,
    ),
    "response_format": bounded(
        "structured output: size, depth and bounded repetitions (policy/structured.py)",
        checks.structured_field("response_format"),
    ),
    "structured_outputs": bounded(
        "structured output: size, depth, bounded repetitions, choices; regex and grammar "
        "can be turned off (policy/structured.py)",
        checks.structured_field("structured_outputs"),
    ),
    "use_beam_search": refused(
        "vLLM's beam search resubmits every beam's whole sequence at each step: hundreds "
        "of times the engine work of the generation it returns",
        False,
    ),
    "echo": bounded(
        "completions: with logprobs it makes prompt logprobs, priced as prompt_logprobs; chat: echoes "
        "the last message, no engine work"
    ),
    "user": passed("an identifier vLLM does not act on"),
    "priority": rewritten(
        "the tenant's priority when priority scheduling is on, else removed: a client never orders itself ahead"
    ),
    "request_id": stripped("the sidecar's X-Request-Id names the request to the engine"),
    "session_id": stripped("a routing hint for deployments with several engines behind one router; none here"),
    "cache_salt": rewritten("set from a server-side secret and the tenant: prefix-cache hits stay within a tenant"),
    "kv_transfer_params": refused(
        "disaggregated prefill's KV transfer instructions are the deployment's, not a client's"
    ),
    "ec_transfer_params": refused("encoder-cache transfer instructions are the deployment's, not a client's"),
    "vllm_xargs": refused("free-form arguments for custom logits processors; none is installed"),
    "return_tokens_as_token_ids": passed(OUTPUT_SHAPE),
    "return_token_ids": passed(OUTPUT_SHAPE),
    "return_token_offsets": passed(OUTPUT_SHAPE),
    "routed_experts_prompt_start": stripped("mixture-of-experts routing data; this model has no experts"),
    "mm_payload": stripped(MULTIMODAL),
    "return_mm_kwargs": stripped(MULTIMODAL),
    "watermarking": refused("switches the deployment's watermark on or off for one request: the operator's call"),
    "thinking_token_budget": bounded("0..the max_tokens cap", checks.thinking_budget),
    "repetition_detection": bounded(
        "pattern sizes and count at most 256 (checked at every token)", checks.repetition_detection
    ),
}

CHAT: Mapping[str, Rule] = {
    **_GENERATION,
    "messages": bounded(f"OpenAI's roles only ({COST}); text content parts only", checks.messages),
    "max_completion_tokens": bounded(f"as max_tokens ({COST})"),
    "logprobs": bounded("read laxly; top_logprobs carries the size"),
    "top_logprobs": bounded(f"0..max_logprobs ({COST})"),
    "tools": bounded(
        "their parameter schemas are bounded as structured output; their size counts into the prompt's reservation",
        checks.tools,
    ),
    "tool_choice": passed("none, auto, required or a named tool: the named tool's schema is bounded under tools"),
    "parallel_tool_calls": passed(OUTPUT_SHAPE),
    "reasoning_effort": passed("a chat-template input; the reservation covers the tokens it leads to"),
    "include_reasoning": passed(OUTPUT_SHAPE),
    "add_generation_prompt": passed("a chat-template switch"),
    "continue_final_message": passed("a chat-template switch"),
    "add_special_tokens": passed("a tokenizer switch"),
    "documents": bounded(
        f"at most {checks.MAX_DOCUMENTS} objects of strings, counted into the prompt's reservation", checks.documents
    ),
    "chat_template": refused(
        "a request's own Jinja template runs inside the engine's API server; only the model's template is served"
    ),
    "chat_template_kwargs": bounded(
        f"at most {checks.MAX_TEMPLATE_KWARGS} scalar entries, none naming the template's own inputs",
        checks.template_kwargs,
    ),
    "media_io_kwargs": refused(MULTIMODAL),
    "mm_processor_kwargs": refused(MULTIMODAL),
    "return_prompt_text": passed(OUTPUT_SHAPE),
}

COMPLETIONS: Mapping[str, Rule] = {
    **_GENERATION,
    "prompt": bounded(
        f"a string, token ids, or a list of either (nothing deeper); prompts x n within max_choices ({COST})",
        checks.prompt,
    ),
    "logprobs": bounded(f"0..max_logprobs ({COST})"),
    "suffix": passed("vLLM refuses it itself (400)"),
    "prompt_embeds": refused("tensors a client sends are deserialised by the engine; prompts are text or ids"),
    "add_special_tokens": passed("a tokenizer switch"),
}

# /tokenize takes a completion's prompt or a chat's messages.
TOKENIZE: Mapping[str, Rule] = {
    "model": CHAT["model"],
    "prompt": bounded("a string", checks.prompt),
    "messages": CHAT["messages"],
    "add_special_tokens": passed("a tokenizer switch"),
    "add_generation_prompt": passed("a chat-template switch"),
    "continue_final_message": passed("a chat-template switch"),
    "return_token_strs": passed(OUTPUT_SHAPE),
    "chat_template": CHAT["chat_template"],
    "chat_template_kwargs": CHAT["chat_template_kwargs"],
    "media_io_kwargs": CHAT["media_io_kwargs"],
    "mm_processor_kwargs": CHAT["mm_processor_kwargs"],
    "tools": bounded("bounded as chat's tools", checks.tools),
}

DETOKENIZE: Mapping[str, Rule] = {
    "model": CHAT["model"],
    "tokens": bounded("at most the max_tokens cap of ids", checks.detokenize_tokens),
}

# Fields of OpenAI's API that vLLM's models do not have: clients and SDKs send them, vLLM would
# ignore them. Removed, so that nothing unread is relayed; any other unknown field is refused.
OPENAI_ONLY: Mapping[str, Rule] = {
    name: stripped("OpenAI's, without meaning for this engine")
    for name in ("store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier")
}
