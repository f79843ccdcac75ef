"""Per-read cost of the relay's SSE accounting, before and after relay/sse.py, on streams recorded from
the real vLLM engine (tests/unit/data/vllm-sse.json: socket reads as the relay's pool returned them).

"before" is the accounting the relay did until relay/sse.py: count `data: ` in each read and look for a
usage key (wrong on split markers, text containing the marker, n>1 and split usage events).
"after" is SseAccount.feed on the same reads. Both are timed per read (the unit the relay handles),
in CPU time of this process (the machine may be shared), the median of 7 runs of 2000 rounds.

    python -m benchmarks.sse_accounting        # from the repository root; prints a table, writes nothing
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from palmyra_serve.sidecar.relay.sse import SseAccount

HERE = Path(__file__).resolve().parent

RECORDED = HERE.parent / "tests" / "unit" / "data" / "vllm-sse.json"
ROUNDS = 2000


def before(reads: list[bytes]) -> int:
    events = 0
    usage_chunk = b""
    for chunk in reads:
        events += chunk.count(b"data: ")
        if b'"usage":' in chunk:
            usage_chunk = chunk
    return events + len(usage_chunk)


def after(reads: list[bytes]) -> int:
    acc = SseAccount()
    for chunk in reads:
        acc.feed(chunk, 1.0)
    acc.finish()
    return acc.completion_tokens()


def ns_per_read(fn: Callable[[list[bytes]], int], reads: list[bytes]) -> float:
    samples = []
    for _ in range(7):
        t0 = time.process_time_ns()  # CPU time: what the relay pays, whatever else runs beside it
        for _ in range(ROUNDS):
            fn(reads)
        samples.append((time.process_time_ns() - t0) / ROUNDS / len(reads))
    return statistics.median(samples)


def main() -> None:
    cases = json.loads(RECORDED.read_text())["cases"]
    print(
        f"{'stream':28} {'reads':>5} {'events':>6} {'before ns/read':>15} {'after ns/read':>14} {'after ns/event':>15}"
    )
    for case in cases:
        reads = [r.encode("latin-1") for r in case["reads"]]
        events = b"".join(reads).count(b"\n\n")
        old, new = ns_per_read(before, reads), ns_per_read(after, reads)
        print(
            f"{case['name']:28} {len(reads):5d} {events:6d} {old:15.0f} {new:14.0f} {new * len(reads) / events:15.0f}"
        )


if __name__ == "__main__":
    main()
