"""The field decisions of the Responses and Messages APIs (fields.py explains the decisions): their
own fields, and the sampling and deployment fields they share with chat, decided alike."""

from __future__ import annotations

from collections.abc import Mapping

from palmyra_serve.sidecar.policy import checks, conversation
from palmyra_serve.sidecar.policy.fields import (
    _GENERATION,
    CHAT,
    COST,
    OPENAI_ONLY,
    OUTPUT_SHAPE,
    SAMPLING,
    Rule,
    bounded,
    passed,
    refused,
    rewritten,
    stripped,
)

# Decided as on the chat route: the deployment's switches and media, refused or stripped alike.
DEPLOYMENT_ONLY = (
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "mm_payload",
    "return_mm_kwargs",
    "watermarking",
)

STATELESS = (
    "this service keeps no responses: vLLM keeps them in one replica's memory, without bound, where "
    "a replica behind a load balancer cannot find another's"
)

# OpenAI's Responses API (vLLM's ResponsesRequest). Stateless: nothing is stored or read back.
RESPONSES: Mapping[str, Rule] = {
    "model": CHAT["model"],
    "input": bounded(
        f"text or items: messages (text parts only), function calls and outputs, reasoning ({COST})",
        conversation.responses_input,
    ),
    "instructions": bounded(f"a system message: counted into the prompt's reservation ({COST})"),
    "max_output_tokens": bounded(f"as max_tokens ({COST})"),
    "max_tool_calls": passed("limits the built-in tool loop, which never runs here (function tools only)"),
    "tools": bounded(
        "function tools only (built-in tools need tool servers this service does not run); their schemas "
        "bounded and their size reserved as chat's tools",
        conversation.responses_tools,
    ),
    "tool_choice": CHAT["tool_choice"],
    "parallel_tool_calls": passed(OUTPUT_SHAPE),
    "text": bounded(
        "its format's schema is structured output: size, depth and bounded repetitions (policy/structured.py)",
        checks.structured_field("text"),
    ),
    "structured_outputs": _GENERATION["structured_outputs"],
    "reasoning": passed("a chat-template input; the reservation covers the tokens it leads to"),
    "include": bounded(
        f"at most {conversation.MAX_INCLUDE} names; logprobs it asks for are sized by top_logprobs",
        conversation.include,
    ),
    "include_reasoning": passed(OUTPUT_SHAPE),
    "enable_response_messages": passed("echoes the rendered messages in the response: no engine work"),
    "top_logprobs": bounded(f"0..max_logprobs ({COST})"),
    "metadata": bounded(
        f"echoed: at most {conversation.MAX_METADATA} string pairs (OpenAI's own limits)", conversation.metadata
    ),
    "store": rewritten(f"always false: {STATELESS}"),
    "background": refused(f"a background response is stored until it is read back: {STATELESS}", False),
    "previous_response_id": refused(f"{STATELESS}; send the conversation in `input`"),
    "previous_input_messages": refused(
        "vLLM's carry-over of earlier turns in gpt-oss's Harmony format; send the turns in `input`"
    ),
    "prompt": refused("a template stored at OpenAI; this service stores none"),
    "prompt_cache_key": stripped("a cache routing hint; the tenant's cache_salt decides prefix sharing here"),
    "service_tier": passed("echoed; scheduling follows the tenant's priority"),
    "truncation": passed("only shortens the input to fit max-model-len"),
    **{
        name: _GENERATION[name]
        for name in (
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "logit_bias",
            "ignore_eos",
            "stop",
            "stop_token_ids",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "user",
            "priority",
            "request_id",
            "session_id",
            "cache_salt",
            *DEPLOYMENT_ONLY,
        )
    },
    "stream": rewritten(
        'read laxly ("true" is true) and sent as a JSON boolean; the stream always ends with the usage the '
        "tenant is charged"
    ),
    "chat_template_kwargs": CHAT["chat_template_kwargs"],
    "media_io_kwargs": CHAT["media_io_kwargs"],
    "mm_processor_kwargs": CHAT["mm_processor_kwargs"],
}

# Anthropic's Messages API (vLLM's AnthropicMessagesRequest, relayed by vLLM as a chat completion).
MESSAGES: Mapping[str, Rule] = {
    "model": CHAT["model"],
    "messages": bounded(
        f"roles user and assistant ({COST}); text, tool-use, tool-result and thinking blocks only",
        conversation.messages_content,
    ),
    "system": bounded(
        f"a string or text blocks, counted into the prompt's reservation ({COST})", conversation.messages_system
    ),
    "max_tokens": bounded(f"at most the cap, not negative ({COST}); reserved in full against a tenant's tokens"),
    "stop_sequences": bounded(
        f"at most {conversation.MAX_STOP_SEQUENCES} strings of at most {checks.MAX_STOP_CHARS} characters",
        conversation.stop_sequences,
    ),
    "stream": rewritten(
        'read laxly ("true" is true) and sent as a JSON boolean; the stream always ends with the usage the '
        "tenant is charged"
    ),
    "temperature": passed(SAMPLING),
    "top_p": passed(SAMPLING),
    "top_k": passed(SAMPLING),
    "tools": bounded(
        "client tools only (server tools need tool servers this service does not run); their input schemas "
        "bounded and their size reserved as chat's tools",
        conversation.messages_tools,
    ),
    "tool_choice": passed("auto, any, none or a named tool: the named tool's schema is bounded under tools"),
    "thinking": bounded("its budget_tokens at most the max_tokens cap", conversation.thinking),
    "output_config": bounded(
        "its format's schema is structured output: size, depth and bounded repetitions (policy/structured.py)",
        checks.structured_field("output_config"),
    ),
    "metadata": bounded(
        f"at most {conversation.MAX_METADATA} short string pairs; vLLM does not act on it", conversation.metadata
    ),
    "cache_salt": rewritten(
        "set from a server-side secret and the tenant (engines whose Messages API cannot carry it refuse tenants "
        "with a private prefix cache, relay/handler.py)"
    ),
    "chat_template_kwargs": CHAT["chat_template_kwargs"],
    **{name: _GENERATION[name] for name in DEPLOYMENT_ONLY},
}

# Fields of Anthropic's API that vLLM's model does not have and that clients send.
ANTHROPIC_ONLY: Mapping[str, Rule] = {
    "service_tier": stripped("Anthropic's capacity tier, without meaning for this engine"),
}

# Fields of OpenAI's Responses API that vLLM's model does not have.
RESPONSES_ONLY: Mapping[str, Rule] = {
    "safety_identifier": OPENAI_ONLY["safety_identifier"],
    "stream_options": stripped("OpenAI's stream obfuscation, without meaning for this engine"),
    "conversation": refused(f"a conversation stored at OpenAI: {STATELESS}"),
}
