"""Prompts: five fixed texts for validate, seeded random token ids of exact length for bench."""

from __future__ import annotations

import random

# Five lengths and kinds of content, as in the reference adaptation's accuracy study (which used "What is 2+2?").
VALIDATE_PROMPTS: list[tuple[str, str]] = [
    ("arithmetic", "What is 2+2?"),
    ("completion", "The capital of France is"),
    ("chinese", "请用一句话介绍一下昇腾 NPU 和 vLLM 推理引擎的关系。"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'),
    (
        "long",
        (
            "Large language models are served behind HTTP endpoints that speak the OpenAI protocol. "
            "A request carries a prompt, a sampling configuration and a limit on the number of tokens to "
            "generate. The server batches requests from many clients, runs a prefill pass over each prompt "
            "to fill the key-value cache, and then decodes one token per step for every running sequence. "
            "Operators watch time to first token, inter-token latency and throughput, and they validate "
            "that a new accelerator, driver or image still computes the same numbers as a trusted "
            "reference before it takes traffic. Summarise the trade-offs of continuous batching in"
        ),
    ),
]

# The golden reference's prompt set (tools/golden.py): the five above and seventeen more, of other
# lengths, languages and kinds, so that agreement is measured in steps of under 5%, not 20%.
GOLDEN_PROMPTS: list[tuple[str, str]] = [
    *VALIDATE_PROMPTS,
    ("short", "Hello"),
    ("question", "Why is the sky blue?"),
    ("list", "Three fruits that are red:"),
    ("french", "La tour Eiffel se trouve à"),
    ("german", "Die Hauptstadt von Deutschland ist"),
    ("spanish", "El océano más grande del mundo es"),
    ("japanese", "日本の首都はどこですか？"),
    ("russian", "Столица России —"),
    ("arabic", "عاصمة مصر هي"),
    ("chinese-long", "人工智能的发展经历了多个阶段，从早期的符号推理到今天的大规模神经网络。请简要说明"),
    ("sql", "SELECT name, COUNT(*) FROM orders GROUP BY"),
    ("json", '{"model": "palmyra-mini", "messages": [{"role": "user", "content": "'),
    ("math", "The derivative of x^3 + 2x is"),
    ("rust", "fn main() {\n    let v: Vec<i32> = (1..=10).collect();\n    println!("),
    ("shell", "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.log; do"),
    ("digits", "1, 1, 2, 3, 5, 8, 13, 21,"),
    ("chat", "<|im_start|>user\nName a prime number.<|im_end|>\n<|im_start|>assistant\n"),
]

QUICK_PROMPT = "What is 2+2?"

# Qwen2's byte-level BPE ranks are ids 0..151642; special tokens start at 151643. Random prompts
# stay below so that no control token (end-of-text, chat markers) lands in a benchmark prompt.
FIRST_SPECIAL_ID = 151643


class RandomPrompts:
    """An endless, reproducible supply of distinct token-id prompts.

    Every request gets fresh ids: repeating one prompt would be served from vLLM's prefix cache
    and measure a cache hit, not a prefill.
    """

    def __init__(self, seed: int = 0, vocab_limit: int = FIRST_SPECIAL_ID):
        self._rng = random.Random(seed)
        self._limit = vocab_limit

    def take(self, length: int) -> list[int]:
        return [self._rng.randrange(self._limit) for _ in range(length)]
