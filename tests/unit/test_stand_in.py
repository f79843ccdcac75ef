"""The stand-in checkpoint: palmyra-mini's exact shape and Qwen2's tokenizer, seeded weights."""

from __future__ import annotations

import json

import pytest

from palmyra_serve.model import stand_in


def test_full_shape_has_palmyra_minis_parameter_count():
    assert stand_in.parameter_count(stand_in.SHAPES["full"]) == 1_777_088_000


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_tensor_names_and_shapes_match_transformers_qwen2(size):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**stand_in.hf_config(stand_in.SHAPES[size]))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    ours = stand_in.tensor_shapes(stand_in.SHAPES[size])
    theirs = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert ours == theirs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return stand_in.build(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


def test_tokenizer_encodes_like_qwen2(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    assert tok.encode("Hello world, 你好!") == [9707, 1879, 11, 220, 108386, 0]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    assert tok.encode("12345") == [16, 17, 18, 19, 20]  # Qwen2 splits digits one by one
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_tokenizer_config_names_qwen2s_class_as_real_checkpoints_do(tiny):
    # Not this transformers' own name for a bare fast tokenizer ("TokenizersBackend" in 5.x), which
    # the transformers 4.x under vLLM 0.18 does not know: the vllm018 tier's engine refused to start.
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "Qwen2Tokenizer"


def test_marker_says_random_weights_and_build_is_idempotent(tiny, tmp_path):
    marker = json.loads((tiny / stand_in.MARKER_FILE).read_text())
    assert marker["random_weights"] is True and marker["stands_in_for"] == "Writer/palmyra-mini"
    assert "RANDOM WEIGHTS" in (tiny / "README.md").read_text()
    mtime = (tiny / "model.safetensors").stat().st_mtime
    stand_in.build(tiny, "tiny", seed=0)
    assert (tiny / "model.safetensors").stat().st_mtime == mtime


def test_weights_are_seeded_bf16_with_random_biases(tiny, tmp_path):
    from safetensors.torch import load_file

    a = load_file(str(tiny / "model.safetensors"))
    b = load_file(str(stand_in.build(tmp_path / "again", "tiny", seed=0) / "model.safetensors"))
    c = load_file(str(stand_in.build(tmp_path / "other", "tiny", seed=1) / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert a[name].dtype.is_floating_point and str(a[name].dtype) == "torch.bfloat16"
    assert a[name].equal(b[name]) and not a[name].equal(c[name])
    assert a["model.layers.0.self_attn.k_proj.bias"].abs().sum() > 0
    assert not a["lm_head.weight"].equal(a["model.embed_tokens.weight"])  # untied


def test_the_chat_template_renders_tools_as_qwen25s_does(tiny):
    """Tools described inside <tools></tools> in the system turn, calls in <tool_call> JSON blocks
    (what vLLM's hermes parser reads back), results in a user turn's <tool_response>; a prompt
    without tools is exactly the plain ChatML one (the test above)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    called = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert f"<|im_start|>assistant\n<tool_call>\n{called}\n</tool_call>" in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    assert tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]) == [151657, 151658]  # Qwen2.5's ids
