"""policy/cost.py: the request-cost check the relay makes before admission. Integers are read the
way vLLM's pydantic models read them, what pydantic refuses is a 400 here, the caps apply after
that coercion, a list of prompts counts as that many sequences, and chat roles are checked."""

from __future__ import annotations

import pytest

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.lax import as_int
from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.policy.cost import CostLimits, check

LIMITS = CostLimits(max_tokens=512, max_choices=8, max_logprobs=20)


def refusal(payload: object, chat: bool = False) -> errors.ApiError | None:
    try:
        check(payload, LIMITS, Api.CHAT if chat else Api.COMPLETIONS)
    except errors.ApiError as exc:
        return exc
    return None


def refused(payload: object, chat: bool = False) -> errors.ApiError:
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


@pytest.mark.parametrize("payload", [[1, 2, 3], None, "hi", 7])
def test_a_body_that_is_not_a_json_object_is_a_400_here_whatever_the_engine_would_answer(payload):
    # vLLM 0.18 (the Ascend image's) answered an array or null body with a 500.
    exc = refused(payload)
    assert exc.status == 400 and exc.code is errors.ErrorCode.INVALID_JSON
