"""The stand-in checkpoint: palmyra-mini's exact architecture and tokenizer with seeded random bf16 weights.

For machines that cannot download the real weights (and for tests). the reference adaptation's own accuracy
study used random-initialized weights of this shape. Every tensor is drawn from its own generator,
seeded from (seed, tensor name), so a checkpoint is reproducible bit for bit and independent of
iteration order. Biases are random too (not zero), so a loader that dropped them would show.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from palmyra_serve import HUB_MODEL_ID, SERVED_MODEL_NAME
from palmyra_serve.model.tokenizer import FIRST_SPECIAL_ID, SPECIAL_TOKENS, build_tokenizer

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MARKER_FILE = "palmyra_stand_in.json"
BUILDER_VERSION = 4  # 4: the chat template renders tools as Qwen2.5's does (3: tokenizer_config names Qwen2Tokenizer)
SHARD_BYTES = 2 * 1024**3
INIT_STD = 0.02


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int = 151936
    head_dim: int = 128


SHAPES = {
    # Writer/palmyra-mini: 1,777,088,000 parameters with untied embeddings.
    "full": Shape(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960
    ),
    # Same tokenizer, vocabulary and head_dim (the CPU attention kernel rejects head_dim 16);
    # two layers: builds in seconds and vLLM starts it in about a minute.
    "tiny": Shape(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=768
    ),
}


def hf_config(shape: Shape) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "max_window_layers": shape.num_hidden_layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "initializer_range": INIT_STD,
        "use_cache": True,
        "bos_token_id": FIRST_SPECIAL_ID,
        "eos_token_id": FIRST_SPECIAL_ID + SPECIAL_TOKENS.index("<|im_end|>"),
        "torch_dtype": "bfloat16",
    }


def tensor_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    """Qwen2ForCausalLM's checkpoint tensors: separate q/k/v with bias, gate/up/down without."""
    h, kv = shape.hidden_size, shape.num_key_value_heads * shape.head_dim
    q = shape.num_attention_heads * shape.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, h)}
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.weight": (h, q),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (shape.intermediate_size, h),
                p + "mlp.up_proj.weight": (shape.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, shape.intermediate_size),
            }
        )
    out["model.norm.weight"] = (h,)
    out["lm_head.weight"] = (shape.vocab_size, h)
    return out


def parameter_count(shape: Shape) -> int:
    total = 0
    for dims in tensor_shapes(shape).values():
        n = 1
        for d in dims:
            n *= d
        total += n
    return total


def _tensor(name: str, dims: tuple[int, ...], seed: int) -> torch.Tensor:
    import torch

    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return torch.ones(dims, dtype=torch.bfloat16)  # RMSNorm starts at identity
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    return (torch.randn(dims, generator=gen, dtype=torch.float32) * INIT_STD).to(torch.bfloat16)


def _write_weights(out_dir: Path, shape: Shape, seed: int) -> None:
    from safetensors.torch import save_file

    shards: list[dict] = [{}]
    size = 0
    for name, dims in tensor_shapes(shape).items():
        t = _tensor(name, dims, seed)
        nbytes = t.numel() * t.element_size()
        if size and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
        shard.clear()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


def marker(out_dir: Path) -> dict | None:
    """The stand-in marker of a checkpoint directory, or None for real weights."""
    path = Path(out_dir) / MARKER_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def build(out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a complete Hugging Face checkpoint to out_dir and return it. Idempotent for one (size, seed)."""
    shape = SHAPES[size]
    out_dir = Path(out_dir)
    wanted = {
        "random_weights": True,
        "size": size,
        "seed": seed,
        "builder_version": BUILDER_VERSION,
        "parameters": parameter_count(shape),
        "shape": asdict(shape),
        "stands_in_for": HUB_MODEL_ID,
    }
    existing = marker(out_dir)
    if existing == wanted:
        log.info("stand-in %s already built at %s", size, out_dir)
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.safetensors*"):
        stale.unlink()
    from importlib.metadata import version

    # transformers_version also tells transformers this is not an old Mistral tokenizer to "fix".
    config = {**hf_config(shape), "transformers_version": version("transformers")}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    gen_cfg = {
        "bos_token_id": FIRST_SPECIAL_ID,
        "eos_token_id": [FIRST_SPECIAL_ID + 2, FIRST_SPECIAL_ID],
        "pad_token_id": FIRST_SPECIAL_ID,
        "do_sample": False,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2), encoding="utf-8")
    build_tokenizer(out_dir)
    _write_weights(out_dir, shape, seed)
    (out_dir / "README.md").write_text(
        f"# RANDOM WEIGHTS: stand-in for {HUB_MODEL_ID}\n\n"
        f"palmyra-mini's exact architecture and Qwen2 tokenizer with seeded random bf16 weights "
        f"(size `{size}`, seed {seed}, {parameter_count(shape):,} parameters). It generates noise; "
        f"it exists to exercise serving, health, metrics and numerics where the real weights cannot be "
        f"downloaded. Served as `{SERVED_MODEL_NAME}`; the sidecar's /ready reports `weights: random-stand-in`.\n",
        encoding="utf-8",
    )
    for f in out_dir.iterdir():
        f.chmod(0o644)  # readable by the engine's uid 1000 when the folder is a mounted volume
    # Written last: a checkpoint interrupted midway carries no marker and is rebuilt next time.
    (out_dir / MARKER_FILE).write_text(json.dumps(wanted, indent=2), encoding="utf-8")
    return out_dir
