"""The fields of vLLM's request models for the routes the sidecar relays, as JSON on stdout.

Run by the interpreter of the vLLM under test (`python tests/helpers/vllm_request_fields.py`): it
imports nothing of this repository, so the 0.18.0 venv runs it as it is. Its output for each
version is kept in tests/unit/data/vllm-request-fields.json; the tests compare the two.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys

# Each route's model, where vLLM 0.18.0 and 0.32 keep it.
MODELS = {
    "/v1/chat/completions": "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
    "/v1/completions": "vllm.entrypoints.openai.completion.protocol:CompletionRequest",
    "/tokenize#completion": "vllm.entrypoints.serve.tokenize.protocol:TokenizeCompletionRequest",
    "/tokenize#chat": "vllm.entrypoints.serve.tokenize.protocol:TokenizeChatRequest",
    "/detokenize": "vllm.entrypoints.serve.tokenize.protocol:DetokenizeRequest",
    "/v1/responses": "vllm.entrypoints.openai.responses.protocol:ResponsesRequest",
    "/v1/messages": "vllm.entrypoints.anthropic.protocol:AnthropicMessagesRequest",
}


def fields() -> dict[str, object]:
    logging.disable(logging.CRITICAL)
    from vllm import __version__

    out: dict[str, object] = {"vllm": __version__.split("+")[0]}
    for route, where in MODELS.items():
        module, name = where.split(":")
        model = getattr(importlib.import_module(module), name)
        out[route] = {"model": where, "extra": model.model_config.get("extra"), "fields": sorted(model.model_fields)}
    return out


if __name__ == "__main__":
    result = fields()
    sys.stdout.write("\n" + json.dumps(result, sort_keys=True) + "\n")
