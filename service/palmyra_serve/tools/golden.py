"""`palmyra-serve golden`: the fp32 golden reference of one checkpoint, recorded once.

The checkpoint runs in fp32 with Transformers on this machine's CPU (the method `validate` uses,
tools/reference.py) over GOLDEN_PROMPTS (22 prompts of different lengths, languages and kinds).
For each prompt the file keeps its token ids, the greedy continuation's ids and, at every
position, the top-k tokens with their log-probabilities: what a replica's own greedy tokens and
logprobs are compared with, position by position, where the top-2 margin says whether a different
token is drift or a near-tie. It also names what it was recorded for: the weights' and the
tokenizer's digests (model/digest.py), the dtype, the max-model-len of the checkpoint's config,
and the versions of Transformers and torch. The file is JSON, versioned by `format`, and small
(about 60 KB at the defaults).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from palmyra_serve.model.digest import tokenizer_digest, weights_digest
from palmyra_serve.tools.prompts import GOLDEN_PROMPTS

# The sidecar's reader (lifecycle/golden.py) names the same format; tools never import the sidecar,
# so tests/unit/test_tools_golden.py holds the two equal.
FORMAT = "palmyra-golden/1"
DEFAULT_TOKENS = 20
DEFAULT_TOP_K = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, type=Path, help="the checkpoint (safetensors, tokenizer)")
    parser.add_argument("--out", required=True, type=Path, help="the golden file to write (JSON)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_TOKENS, help="greedy tokens recorded per prompt")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="log-probabilities kept per position")


def record(model_dir: Path, max_tokens: int = DEFAULT_TOKENS, top_k: int = DEFAULT_TOP_K) -> dict[str, Any]:
    """The golden reference of `model_dir` as a JSON-ready dict."""
    import torch

    from palmyra_serve.tools.reference import Model

    torch.manual_seed(0)
    model = Model(model_dir)
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    prompts = []
    for name, text in GOLDEN_PROMPTS:
        ids = model.encode(text)
        path = model.greedy(ids, max_tokens)
        top = [[[tok, round(lp, 6)] for tok, lp in path.top_logprobs(pos, top_k)] for pos in range(max_tokens)]
        prompts.append(
            {
                "name": name,
                "prompt": text,
                "prompt_ids": ids,
                "tokens": path.tokens,
                "top": top,
            }
        )
    return {
        "format": FORMAT,
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "weights": weights_digest(model_dir),
        "tokenizer": tokenizer_digest(model_dir),
        "settings": {
            "dtype": "float32",
            "device": "cpu",
            "max_model_len": config.get("max_position_embeddings"),
            "max_tokens": max_tokens,
            "top_k": top_k,
            "greedy": True,
        },
        "versions": {"transformers": version("transformers"), "torch": version("torch")},
        "prompts": prompts,
    }


def run(args: argparse.Namespace) -> int:
    if args.max_tokens < 1 or args.top_k < 2:
        print("error: --max-tokens must be at least 1 and --top-k at least 2 (the top-2 margin)", file=sys.stderr)
        return 2
    golden = record(args.model_dir, args.max_tokens, args.top_k)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(golden, ensure_ascii=False, separators=(",", ":"))
    args.out.write_text(text + "\n", encoding="utf-8")
    print(
        f"wrote {args.out} ({len(text.encode()) // 1024} KiB): {len(golden['prompts'])} prompts x "
        f"{args.max_tokens} greedy tokens, top-{args.top_k} log-probabilities, weights {golden['weights'][:19]}..."
    )
    return 0
