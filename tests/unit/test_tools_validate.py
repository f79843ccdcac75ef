"""validate end to end against a MockTransport endpoint and a fake reference (no torch, no engine)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest

from palmyra_serve.tools import reference, validate

REF_TOKENS = [11, 12, 13, 14]


class FakePath:
    tokens = REF_TOKENS

    def logit(self, pos: int, tok: int) -> float:
        # A clear winner at every position (2 std above the rest), so any disagreement is suspicious.
        return 2.0 if tok == REF_TOKENS[pos] else 0.0

    def std(self, pos: int) -> float:
        return 1.0

    def top2(self, pos: int):
        return REF_TOKENS[pos], 2.0, 0, 0.0


class FakeModel:
    def __init__(self, model_dir):
        pass

    def encode(self, text: str) -> list[int]:
        return [1, 2, 3]

    def greedy(self, ids, n):
        assert n == len(REF_TOKENS)
        return FakePath()


def _completion(tokens: list[int]) -> dict:
    return {
        "choices": [
            {
                "text": "x",
                "finish_reason": "length",
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in tokens],
                    "token_logprobs": [-0.5] * len(tokens),
                    "top_logprobs": [{f"token_id:{t}": -0.5, "token_id:0": -2.5} for t in tokens],
                },
            }
        ],
        "usage": {"completion_tokens": len(tokens)},
    }


def _args(tmp_path: Path, **kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    validate.add_arguments(p)
    model_dir = tmp_path / "ckpt"
    model_dir.mkdir(exist_ok=True)
    argv = [
        "--base-url",
        "http://engine.test",
        "--model-dir",
        str(model_dir),
        "--tokens",
        "4",
        "--out",
        str(tmp_path / "out"),
        "--api-key",
        "k",
    ]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return p.parse_args(argv)


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch):
    seen: list[dict] = []
    state = {"tokens": REF_TOKENS}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer k"
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "palmyra-mini", "max_model_len": 2048}]})
        body = json.loads(request.content)
        seen.append(body)
        if isinstance(body["prompt"], str):  # --quick
            return httpx.Response(200, json={"choices": [{"text": " 4"}], "usage": {"completion_tokens": 8}})
        return httpx.Response(200, json=_completion(state["tokens"]))

    def client(args):
        return httpx.Client(
            base_url=args.base_url,
            headers={"Authorization": f"Bearer {args.api_key}"},
            transport=httpx.MockTransport(handler),
        )

    monkeypatch.setattr(validate, "_client", client)
    monkeypatch.setattr(reference, "Model", FakeModel)
    return seen, state


def test_matching_endpoint_exits_zero_and_writes_reports(tmp_path: Path, endpoint, capsys) -> None:
    seen, _ = endpoint
    args = _args(tmp_path)
    (Path(args.model_dir) / "palmyra_stand_in.json").write_text(json.dumps({"size": "tiny", "seed": 0}))
    assert validate.run(args) == 0
    # The request: token ids, greedy, top-5 logprobs, exact ids back, fixed length.
    req = seen[0]
    assert req["prompt"] == [1, 2, 3] and req["temperature"] == 0 and req["logprobs"] == 5
    assert req["max_tokens"] == 4 and req["return_tokens_as_token_ids"] is True and req["ignore_eos"] is True
    assert len(seen) == 5  # five prompts
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["summary"]["first_token_agreement"] == 1.0
    assert doc["summary"]["verdicts"]["match"] == 5
    assert doc["stand_in"] == {"size": "tiny", "seed": 0}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "random-weight stand-in" in md and "Result: OK" in md


def test_clear_divergence_exits_one(tmp_path: Path, endpoint) -> None:
    _, state = endpoint
    state["tokens"] = [11, 99, 13, 14]
    args = _args(tmp_path)
    assert validate.run(args) == 1
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    p = doc["prompts"][0]
    assert (p["verdict"], p["first_divergence"], p["match_rate"]) == ("suspicious", 1, 0.75)
    assert p["divergence"]["ref_flip_margin"] == 2.0
    assert doc["stand_in"] is None
    assert "Result: SUSPICIOUS" in (tmp_path / "out" / "report.md").read_text()


def test_missing_model_dir_is_a_usage_error(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    validate.add_arguments(p)
    assert validate.run(p.parse_args([])) == 2


def test_quick_passes_on_a_generating_endpoint(tmp_path: Path, endpoint, capsys) -> None:
    args = _args(tmp_path, quick=True)
    assert validate.run(args) == 0
    assert "quick check passed" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "quick.json").read_text())["ok"] is True


def test_quick_fails_on_an_unreachable_endpoint(tmp_path: Path, monkeypatch, capsys) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    monkeypatch.setattr(
        validate, "_client", lambda a: httpx.Client(base_url=a.base_url, transport=httpx.MockTransport(refuse))
    )
    assert validate.run(_args(tmp_path, quick=True)) == 1
    assert "FAIL" in capsys.readouterr().out
