"""The Responses API and Anthropic's Messages API with the unmodified `openai` and `anthropic` SDKs,
through the sidecar, on the engine the service starts: vLLM 0.32 here and 0.18.0 (the Ascend
image's) in the vllm018 tier. Plain, streamed and instructed Responses; Messages plain and streamed;
a tenant charged exactly the engine's usage on both routes, streamed and not; and a private
tenant's cache salt, which vLLM 0.18.0's Messages API cannot carry, refused there and served on 0.32."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest
from anthropic.types import MessageParam

from tests.helpers import procs
from tests.helpers.api import HTTP, MODEL
from tests.helpers.reliability import sidecar_metric

pytestmark = pytest.mark.engine_contract

SHARED_KEY = "engine-shared-key-0123456789"
PRIVATE_KEY = "engine-private-key-0123456789"
HI: list[MessageParam] = [{"role": "user", "content": "Say hello."}]


def test_the_sdks_responses_and_messages_calls(sidecar_server):
    sdk = openai.OpenAI(base_url=f"{sidecar_server.url}/v1", api_key="unused", max_retries=0)
    plain = sdk.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8)
    assert plain.output_text and 1 <= plain.usage.output_tokens <= 8 and plain.usage.input_tokens > 0
    with sdk.responses.stream(model=MODEL, input="Say hello.", max_output_tokens=8) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text and 1 <= final.usage.output_tokens <= 8
    instructed = sdk.responses.create(model=MODEL, instructions="Answer in French.", input="Hello", max_output_tokens=8)
    # The instructions reached the prompt: they take the place of the template's default system prompt.
    assert instructed.usage.input_tokens != plain.usage.input_tokens

    claude = anthropic.Anthropic(base_url=sidecar_server.url, api_key="unused", max_retries=0)
    message = claude.messages.create(model=MODEL, max_tokens=8, messages=HI)
    assert message.content[0].type == "text" and 1 <= message.usage.output_tokens <= 8
    with claude.messages.stream(model=MODEL, max_tokens=8, system="Be brief.", messages=HI) as stream:
        streamed = "".join(stream.text_stream)
        last = stream.get_final_message()
    assert streamed and 1 <= last.usage.output_tokens <= 8
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=MODEL, max_tokens=9000, messages=HI)
    body = refused.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"  # Anthropic's shape


def test_a_tenant_pays_the_engines_usage_on_both_routes(engine_server, log_dir: Path, tmp_path):
    from palmyra_serve.sidecar.tenants.config import key_digest

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        f"  - name: team\n    keys: ['{key_digest(SHARED_KEY)}']\n    tokens_per_minute: 100000\n"
        "    prefix_cache: shared\n"
        f"  - name: private\n    keys: ['{key_digest(PRIVATE_KEY)}']\n"
    )
    env = {"PALMYRA_TENANTS_FILE": str(tenants)}
    with procs.sidecar(
        engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env, probe=True
    ) as sc:
        sdk = openai.OpenAI(base_url=f"{sc.url}/v1", api_key=SHARED_KEY, max_retries=0)
        claude = anthropic.Anthropic(base_url=sc.url, api_key=SHARED_KEY, max_retries=0)
        reported = [sdk.responses.create(model=MODEL, input="Hi", max_output_tokens=5).usage]
        with sdk.responses.stream(model=MODEL, input="Hi", max_output_tokens=6) as stream:
            reported.append(stream.get_final_response().usage)
        reported.append(claude.messages.create(model=MODEL, max_tokens=7, messages=HI).usage)
        with claude.messages.stream(model=MODEL, max_tokens=8, messages=HI) as stream:
            reported.append(stream.get_final_message().usage)
        tokens = 'palmyra_tenant_tokens_total{kind="%s",tenant="team"}'
        assert sidecar_metric(sc.probe_url, tokens % "completion") == sum(u.output_tokens for u in reported)
        assert sidecar_metric(sc.probe_url, tokens % "prompt") == sum(u.input_tokens for u in reported)

        version = HTTP.get(f"{engine_server.url}/version", timeout=10).json()["version"]
        private = anthropic.Anthropic(base_url=sc.url, api_key=PRIVATE_KEY, max_retries=0)
        if version.startswith("0.18."):
            with pytest.raises(anthropic.BadRequestError) as refused:
                private.messages.create(model=MODEL, max_tokens=4, messages=HI)
            body = refused.value.body
            assert isinstance(body, dict) and "prefix cache" in body["error"]["message"]
        else:
            assert private.messages.create(model=MODEL, max_tokens=4, messages=HI).usage.output_tokens >= 1
