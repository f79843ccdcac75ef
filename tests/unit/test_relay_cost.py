"""The edge's parts in isolation: request cost coercion, routes, fail-closed keys, the memory budget."""

from __future__ import annotations

import os

import pytest

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar import errors, memory_budget
from palmyra_serve.sidecar.edge.protocol import raw_response
from palmyra_serve.sidecar.relay.auth import ApiKeys, AuthConfigError, validate_engine_key
from palmyra_serve.sidecar.relay.cost import CostLimits, as_int, check
from palmyra_serve.sidecar.routes import CONTROL_PATHS, RELAYED
from tests.helpers import deployed

LIMITS = CostLimits(max_tokens=512, max_choices=8, max_logprobs=20)


def refusal(payload: dict, chat: bool = False) -> errors.ApiError | None:
    try:
        check(payload, LIMITS, chat)
    except errors.ApiError as exc:
        return exc
    return None


def refused(payload: dict, chat: bool = False) -> errors.ApiError:
    exc = refusal(payload, chat)
    assert exc is not None, f"not refused: {payload}"
    return exc


@pytest.mark.parametrize(
    ("value", "read"),
    [(1000, 1000), ("1000", 1000), (1000.0, 1000), ("1_000", 1000), (" 12 ", 12), (True, 1), (None, None)],
)
def test_integers_are_read_the_way_pydantic_reads_them(value, read):
    assert as_int({"max_tokens": value}, "max_tokens") == read


@pytest.mark.parametrize("value", ["1e3", 4.5, "4.5", [1], {"a": 1}, "0x10", float("inf"), "ten"])
def test_what_pydantic_refuses_is_a_400_here(value):
    exc = refusal({"max_tokens": value})
    assert exc is not None and (exc.status, exc.code, exc.param) == (400, "invalid_parameter", "max_tokens")


def test_caps_apply_after_coercion():
    for spelling in (513, "513", 513.0, 5.13e2):
        exc = refusal({"max_tokens": spelling})
        assert exc is not None and exc.code == "max_tokens_too_large"
    assert refusal({"max_tokens": "512", "max_completion_tokens": 512.0, "min_tokens": "1"}) is None
    assert refused({"n": 16384}).code == "parameter_too_large"
    assert refused({"best_of": "9"}).param == "best_of"
    assert refused({"n": 0}).code == "invalid_parameter"
    assert refusal({"n": 8, "use_beam_search": True}) is None
    assert refused({"logprobs": 21}).param == "logprobs"
    assert refused({"logprobs": -1}).code == "invalid_parameter"  # vLLM reads -1 as the whole vocabulary
    assert refused({"top_logprobs": 21}, chat=True).param == "top_logprobs"
    assert refusal({"logprobs": True, "top_logprobs": 5, "messages": []}, chat=True) is None
    assert refused({"logprob_token_ids": list(range(21))}).param == "logprob_token_ids"
    assert refused({"max_tokens": 10**30}).code == "max_tokens_too_large"


def test_a_list_of_prompts_counts_as_that_many_sequences():
    assert refusal({"prompt": ["a"] * 8}) is None
    assert refused({"prompt": ["a"] * 9}).param == "prompt"
    assert refusal({"prompt": [[1, 2]] * 4, "n": 2}) is None
    assert refused({"prompt": [[1, 2]] * 4, "n": 3}).param == "prompt"
    assert refusal({"prompt": list(range(5000)), "n": 8}) is None  # one prompt of token ids


def test_chat_roles():
    def roles(*rs: object) -> errors.ApiError | None:
        return refusal({"messages": [{"role": r, "content": "x"} for r in rs]}, chat=True)

    assert roles("system", "developer", "user", "assistant", "tool", "function") is None
    for bad in ("wizard", "USER", "", None, 1, ["user"], {"r": 1}):
        exc = roles("user", bad)
        assert exc is not None and exc.code == "invalid_role"
    assert refused({"messages": "hi"}, chat=True).code == "invalid_parameter"
    assert refused({"messages": ["hi"]}, chat=True).code == "invalid_parameter"


def test_relayed_routes_are_exact_paths_apart_from_the_control_app():
    for path, route in RELAYED.items():
        assert route.target == path.encode() and path not in CONTROL_PATHS
        assert route.methods and all(m.isupper() for m in route.methods)
    for path in ("/v1/chat/completions/batch", "/v1/responses", "/v1/messages", "/invocations"):
        assert path not in RELAYED and path not in CONTROL_PATHS


def test_the_api_document_lists_exactly_the_relayed_routes():
    from palmyra_serve.sidecar.openapi import PROXIED_PATHS

    assert set(PROXIED_PATHS) == set(RELAYED)
    for path, route in RELAYED.items():
        assert {m.upper() for m in PROXIED_PATHS[path]} == set(route.methods)


def test_keys_fail_closed(tmp_path):
    with pytest.raises(AuthConfigError, match="PALMYRA_AUTH_DISABLED=true"):
        ApiKeys([])
    assert ApiKeys([], disabled=True).check(None)
    enforced = ApiKeys(["a-real-key-123"], disabled=True)  # keys win over the switch
    assert not enforced.check(None) and enforced.check(b"Bearer a-real-key-123")
    for placeholder in ("changeme", "CHANGE-ME", "replace-me", "change-me-engine-key", "<your key>", "short"):
        with pytest.raises(AuthConfigError, match="placeholder"):
            ApiKeys([placeholder])
        # The engine key is held to the same rule (the sidecar refuses to start with it).
        with pytest.raises(AuthConfigError, match="engine key"):
            validate_engine_key(placeholder)
    validate_engine_key(None)  # no engine key: the engine has none (a local dev engine)
    validate_engine_key("a-real-engine-key-123")
    empty = tmp_path / "empty"
    empty.write_text("# a comment\n\n")
    with pytest.raises(AuthConfigError, match="holds no key"):
        ApiKeys([], empty)
    with pytest.raises(AuthConfigError, match="cannot read"):
        ApiKeys([], tmp_path / "missing")


def test_a_key_file_takes_the_format_k8s_readme_writes(tmp_path):
    """`kubectl create secret ... --from-literal=api-keys="$(openssl rand -hex 32),..."` puts a
    comma list in the mounted file: two keys, not one key with a comma in it."""
    path = tmp_path / "api-keys"
    path.write_text("first-key-abcdef,second-key-abcdef")  # no newline, as --from-literal writes it
    keys = ApiKeys([], path)
    assert keys.check(b"Bearer first-key-abcdef") and keys.check(b"Bearer second-key-abcdef")
    assert not keys.check(b"Bearer first-key-abcdef,second-key-abcdef")


def test_key_file_reloads_at_most_once_a_second(tmp_path):
    now = [100.0]
    path = tmp_path / "keys"
    path.write_text("first-key-abcdef\n")
    keys = ApiKeys(["env-key-abcdef"], path, clock=lambda: now[0])
    assert keys.check(b"Bearer first-key-abcdef") and keys.check(b"Bearer env-key-abcdef")
    path.write_text("second-key-abcdef\n")
    os.utime(path, ns=(10**18, 10**18))
    assert not keys.check(b"Bearer second-key-abcdef"), "checked again before a second passed"
    now[0] += 1.0
    assert keys.check(b"Bearer second-key-abcdef") and not keys.check(b"Bearer first-key-abcdef")
    assert keys.check(b"Bearer env-key-abcdef")
    path.write_text("# oops\n")  # unusable: the previous keys stay in force
    os.utime(path, ns=(2 * 10**18, 2 * 10**18))
    now[0] += 1.0
    assert keys.check(b"Bearer second-key-abcdef")


def test_protocol_answers_are_complete_http_responses():
    raw = raw_response(errors.too_many_connections(1))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ")
    assert f"content-length: {len(body)}".encode() in head and b"connection: close" in head
    assert b"retry-after: 1" in head and b'"code":"too_many_connections"' in body


def test_the_worst_case_memory_fits_the_sidecar_container():
    """The settings k8s/base deploys (its ConfigMap, the sidecar's env and flags) against the
    sidecar's limit there; tests/static/test_k8s.py checks every overlay the same way."""
    deployment = deployed.base_deployment()
    limit = memory_budget.container_limit(deployment, "sidecar")
    settings = deployed.sidecar_settings(deployed.base_config(), deployed.containers(deployment)["sidecar"])
    assert settings.admission_mode == "adaptive" and settings.probe_port, "what the deployment runs"
    worst = memory_budget.worst_case(settings)
    assert worst <= limit, f"worst case {worst / 2**20:.0f} MiB > limit {limit / 2**20:.0f} MiB"
    # The sum is of the enforced limits: raising one of them moves it.
    bigger = settings.model_copy(update={"max_body_bytes": 4 * 2**20})
    assert memory_budget.worst_case(bigger) > limit, "the issue's 4 MiB bodies must not fit"
    assert memory_budget.quantity_bytes("512Mi") == 512 * 2**20 and memory_budget.quantity_bytes("1G") == 10**9


def test_the_budget_counts_the_requests_each_admission_mode_lets_in():
    fixed = Settings(_env_file=None, admission_mode="fixed", max_in_flight=10, max_queue=5, max_connections=100)
    assert memory_budget.in_flight(fixed) == 10 and memory_budget.relays(fixed) == 10
    assert memory_budget.body_budget(fixed) == 15 * fixed.max_body_bytes
    # Adaptive admits up to its ceiling (vLLM's max-num-seqs unless set), and does not gate the
    # requests that generate nothing: every connection may be relaying one.
    cpu = Settings(_env_file=None, platform="cpu", max_in_flight=10, max_connections=100)
    assert memory_budget.in_flight(cpu) == 128 and memory_budget.relays(cpu) == 100
    accelerator = Settings(_env_file=None, platform="ascend")
    assert memory_budget.in_flight(accelerator) == 256
    assert memory_budget.in_flight(cpu.model_copy(update={"engine_extra_args": "--max-num-seqs 32"})) == 32
    assert memory_budget.in_flight(cpu.model_copy(update={"admission_max_limit": 7})) == 7
    assert memory_budget.worst_case(accelerator) > memory_budget.worst_case(cpu)


def test_every_per_request_buffer_is_in_the_budget():
    """Each buffer a relayed request may hold is a term, counted once per request that holds it."""
    from palmyra_serve.sidecar.upstream import pool

    assert memory_budget.ERROR_PATH_BYTES <= memory_budget.RELAY_BYTES, "an error body is read instead of a stream"
    settings = Settings(_env_file=None, platform="cpu")
    rows = {t.what.split(":")[0]: t for t in memory_budget.terms(settings)}
    assert rows["relay buffers"].count == memory_budget.relays(settings)
    assert rows["engine connections' kernel receive buffers"].each == pool.RCVBUF_CHARGED
    assert rows["accounting"].count == memory_budget.in_flight(settings)
