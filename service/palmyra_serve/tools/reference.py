"""The fp32 Transformers reference on CPU: greedy continuation of token ids, with every step's logits.

Logits are kept for the whole path so that, once the endpoint's tokens are known, the margin
between any two tokens at the first divergence can be read along the shared prefix (up to the first
divergence the two paths are the same ids, so these are exactly the teacher-forced logits there).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class Model:
    """Tokenizer + fp32 model of one checkpoint directory, loaded once for all prompts."""

    def __init__(self, model_dir: str | Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.eval()

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def greedy(self, ids: list[int], n: int) -> GreedyPath:
        import torch

        rows = []
        tokens: list[int] = []
        with torch.inference_mode():
            # Only the last position's logits: a long prompt would otherwise hold [len, vocab] floats.
            out = self.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
            for step in range(n):
                logits = out.logits[0, -1].float()
                tok = int(torch.argmax(logits))
                rows.append(logits)
                tokens.append(tok)
                if step + 1 < n:
                    out = self.model(
                        input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True
                    )
        return GreedyPath(tokens, torch.stack(rows))


class GreedyPath:
    """One greedy path: its tokens and the logits each was chosen from (satisfies accuracy.Reference)."""

    def __init__(self, tokens: list[int], logits: torch.Tensor) -> None:
        self.tokens = tokens
        self._logits = logits  # [n, vocab] float32

    def logit(self, pos: int, tok: int) -> float:
        return float(self._logits[pos, tok])

    def std(self, pos: int) -> float:
        return float(self._logits[pos].std())

    def top2(self, pos: int) -> tuple[int, float, int, float]:
        import torch

        vals, idx = torch.topk(self._logits[pos], 2)
        return int(idx[0]), float(vals[0]), int(idx[1]), float(vals[1])

    def top_logprobs(self, pos: int, k: int) -> list[tuple[int, float]]:
        """The k most likely tokens at `pos` with their log-probabilities (fp32 log-softmax)."""
        import torch

        vals, idx = torch.topk(torch.log_softmax(self._logits[pos], dim=-1), k)
        return [(int(i), float(v)) for i, v in zip(idx, vals, strict=True)]

    def margins(self) -> list[float]:
        """Top-1 minus top-2 logit at every position, in units of that position's logit std."""
        out = []
        for pos in range(len(self.tokens)):
            _, l1, _, l2 = self.top2(pos)
            out.append((l1 - l2) / self.std(pos))
        return out
