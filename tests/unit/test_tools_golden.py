"""tools/golden.py: the fp32 golden reference of a checkpoint, on the tiny stand-in."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from palmyra_serve.model.digest import tokenizer_digest, weights_digest
from palmyra_serve.sidecar.lifecycle import golden as reader
from palmyra_serve.tools import golden
from palmyra_serve.tools.prompts import GOLDEN_PROMPTS
from tests.helpers.models import stand_in_model


@pytest.fixture(scope="module")
def tiny():
    return stand_in_model("tiny")  # the tests' cached stand-in (built once per machine)


@pytest.fixture(scope="module")
def recorded(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("golden") / "golden.json"
    args = argparse.Namespace(model_dir=tiny, out=out, max_tokens=3, top_k=3)
    assert golden.run(args) == 0
    return json.loads(out.read_text(encoding="utf-8")), out


def test_the_prompt_set_is_varied_enough_to_measure_agreement_in_steps_under_5_percent():
    names = [name for name, _ in GOLDEN_PROMPTS]
    assert len(names) == len(set(names)) >= 20
    scripts = {"latin": "a", "han": "的", "kana": "の", "cyrillic": "о", "arabic": "ع"}
    assert all(any(ch in text for _, text in GOLDEN_PROMPTS) for ch in scripts.values())


def test_each_position_keeps_the_greedy_token_first_with_its_log_probabilities(recorded):
    doc, _ = recorded
    assert doc["format"] == golden.FORMAT == reader.FORMAT and len(doc["prompts"]) == len(GOLDEN_PROMPTS)
    for prompt in doc["prompts"]:
        assert len(prompt["tokens"]) == len(prompt["top"]) == 3 and prompt["prompt_ids"]
        for token, top in zip(prompt["tokens"], prompt["top"], strict=True):
            assert top[0][0] == token  # fp32 greedy is the top-1
            logprobs = [lp for _, lp in top]
            assert logprobs == sorted(logprobs, reverse=True) and all(lp <= 0 for lp in logprobs)


def test_it_names_the_weights_and_tokenizer_it_was_recorded_for(recorded, tiny, tmp_path):
    doc, out = recorded
    assert doc["weights"] == weights_digest(tiny) and doc["tokenizer"] == tokenizer_digest(tiny)
    assert doc["settings"]["dtype"] == "float32" and doc["settings"]["max_model_len"] > 0
    other = tmp_path / "other"
    shutil.copytree(tiny, other)
    weights = sorted(other.glob("*.safetensors"))[-1]
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(raw))
    assert weights_digest(other) != doc["weights"]  # other weights, another digest
    assert tokenizer_digest(other) == doc["tokenizer"]  # the same tokenizer, the same digest
    assert out.stat().st_size < 32 * 1024


def test_settings_that_cannot_judge_a_near_tie_are_refused(tiny, tmp_path):
    args = argparse.Namespace(model_dir=tiny, out=tmp_path / "g.json", max_tokens=3, top_k=1)
    assert golden.run(args) == 2 and not args.out.exists()
