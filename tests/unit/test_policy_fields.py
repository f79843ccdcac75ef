"""policy/fields.py: every field of vLLM's request models has exactly one decision, on both engine
versions the service runs (0.32 here, 0.18.0 in the Ascend image), and the decisions hold as a
tenant with a valid key would try them: misspelt, lax-typed, unknown, nested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.routes import RELAYED
from palmyra_serve.sidecar.policy import checks, structured
from palmyra_serve.sidecar.policy.fields import Decision
from palmyra_serve.sidecar.policy.inspect import inspect
from palmyra_serve.sidecar.policy.tables import BY_TARGET, CLIENT_ONLY

HERE = Path(__file__).parent
SNAPSHOT = json.loads((HERE / "data" / "vllm-request-fields.json").read_text())
VERSIONS = SNAPSHOT["versions"]

LIMITS = checks.Limits(
    max_tokens=2048,
    max_choices=8,
    max_logprobs=20,
    prompt_logprobs_max_tokens=512,
    structured=structured.StructuredLimits(max_bytes=16384, max_repeat=64, max_choices=1024, regex_and_grammar=True),
)


def _table(route: str):
    return BY_TARGET[route.split("#")[0].encode()]


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_every_field_of_every_model_has_a_decision(version):
    missing = {route: sorted(set(model["fields"]) - set(_table(route))) for route, model in VERSIONS[version].items()}
    assert not any(missing.values()), f"vLLM {version} fields without a decision in policy/fields.py: {missing}"


def test_no_decision_for_a_field_no_engine_has():
    """A stale rule (a field every engine dropped) is a decision about nothing: removed, or it is
    one of OpenAI's own fields that clients send."""
    for target, table in BY_TARGET.items():
        known = set().union(
            *(
                set(model["fields"])
                for v in VERSIONS.values()
                for r, model in v.items()
                if r.split("#")[0].encode() == target
            )
        )
        stale = set(table) - known - CLIENT_ONLY
        assert not stale, f"{target.decode()}: rules for fields no engine version has: {sorted(stale)}"


def test_every_model_allows_or_ignores_extras_which_is_why_unknown_fields_are_refused():
    """OpenAI's models allow extras (relayed to the engine unread); Anthropic's ignores them (pydantic's
    default): either way a misspelt field would have no effect the client could see."""
    for version in VERSIONS.values():
        for route, model in version.items():
            assert model["extra"] == ("allow" if route != "/v1/messages" else None), route


def _inspect(payload, route=b"/v1/chat/completions"):
    entry = RELAYED[route.decode()]
    return inspect(payload, BY_TARGET[route], LIMITS, entry.api)


def _chat(**fields):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def _refused(payload, route=b"/v1/chat/completions") -> errors.ApiError:
    with pytest.raises(errors.ApiError) as caught:
        _inspect(payload, route)
    assert caught.value.status == 400
    return caught.value


def test_unknown_field_is_refused_by_name():
    err = _refused(_chat(temprature=0.5))
    assert err.code == errors.ErrorCode.UNKNOWN_PARAMETER and err.param == "temprature"


@pytest.mark.parametrize("spelling", ["true", "True", "1", 1, "yes", "on"])
def test_stream_is_read_as_vllm_reads_it_and_sent_as_a_boolean(spelling):
    payload = _chat(stream=spelling)
    seen = _inspect(payload)
    assert seen.streams is True and payload["stream"] is True and seen.changed


def test_stream_interval_is_refused():
    """Attack: stream_interval 2048 packed 1000 tokens into one event, charged as one token."""
    assert _refused(_chat(stream=True, stream_interval=2048)).param == "stream_interval"
    payload = _chat(stream_interval=None)
    _inspect(payload)
    assert "stream_interval" not in payload


@pytest.mark.parametrize(
    "field, value",
    [
        ("chat_template", "{% for i in range(10**9) %}x{% endfor %}"),
        ("kv_transfer_params", {"do_remote_prefill": True}),
        ("vllm_xargs", {"a": 1}),
        ("use_beam_search", True),
        ("use_beam_search", "true"),
        ("mm_processor_kwargs", {"x": 1}),
    ],
)
def test_refused_fields(field, value):
    assert _refused(_chat(**{field: value})).code == errors.ErrorCode.UNSUPPORTED_PARAMETER


def test_inert_defaults_of_refused_fields_are_dropped_not_refused():
    payload = _chat(use_beam_search=False, chat_template=None)
    assert _inspect(payload).changed
    assert "use_beam_search" not in payload and "chat_template" not in payload


def test_stripped_fields_never_reach_the_engine():
    payload = _chat(request_id="someone-elses", session_id="s", store=False, metadata={"a": "b"})
    _inspect(payload)
    assert not {"request_id", "session_id", "store", "metadata"} & set(payload)


def test_a_long_model_name_is_refused_before_the_engine_echoes_it():
    """Attack: a 70 KB model name made vLLM's 404 body exceed the relay's error cap."""
    assert (_refused(_chat(model="x" * 70_000)).param or "").startswith("model")


def test_a_prompt_nested_past_pythons_recursion_is_a_400():
    """Attack: a completion prompt nested 1000 lists deep crashed the reservation estimate."""
    prompt: list = [1]
    for _ in range(1000):
        prompt = [prompt]
    assert _refused({"prompt": prompt}, b"/v1/completions").param == "prompt"


def test_media_content_parts_are_refused():
    payload = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]}
    assert _refused(payload).code == errors.ErrorCode.UNSUPPORTED_PARAMETER


def test_prompt_logprobs_only_on_short_prompts():
    _inspect({"prompt": "a" * 400, "prompt_logprobs": 5}, b"/v1/completions")
    _refused({"prompt": "a" * 4000, "prompt_logprobs": 5}, b"/v1/completions")
    # echo with logprobs returns the prompt's logprobs: priced the same
    _refused({"prompt": "a" * 4000, "echo": "true", "logprobs": 1}, b"/v1/completions")
    _inspect({"prompt": "a" * 4000, "echo": True}, b"/v1/completions")


def test_template_kwargs_may_not_override_the_templates_inputs():
    _inspect(_chat(chat_template_kwargs={"enable_thinking": False}))
    _refused(_chat(chat_template_kwargs={"messages": []}))
    _refused(_chat(chat_template_kwargs={"x": {"nested": 1}}))


def test_tokenize_routes_have_their_own_tables():
    _refused({"prompt": "hi", "chat_template": "{{ x }}"}, b"/tokenize")
    _refused({"tokens": [1] * 5000}, b"/detokenize")
    _inspect({"tokens": [1, 2]}, b"/detokenize")


def test_every_refused_or_bounded_rule_says_why():
    for table in BY_TARGET.values():
        for name, rule in table.items():
            assert rule.why, name
            assert isinstance(rule.decision, Decision)
