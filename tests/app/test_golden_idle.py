"""The golden check waits for idle capacity, end to end: a due replay does not run beside a relayed
stream until one more interval has passed, and then runs anyway (the admission's count reaches the
supervisor through app.py). The fake engine returns no token ids, so each replay is an `error`
check: what is judged here is only when it ran (/ready's output: waited_s, in_flight)."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import httpx

from tests.helpers.api import completion
from tests.helpers.waiting import wait_until

GOLDEN = {
    "format": "palmyra-golden/1",
    "weights": "sha256:" + "0" * 64,
    "prompts": [{"name": "a", "prompt_ids": [1, 2], "tokens": [10, 11], "top": [[[10, -0.1], [99, -3.1]]] * 2}],
}
INTERVAL_S = 2.0


def test_a_due_check_waits_for_the_stream_then_runs_beside_it_after_one_more_interval(
    engine, sidecar_factory, client, tmp_path: Path
):
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(GOLDEN))
    env = {
        "PALMYRA_GOLDEN_FILE": str(path),
        "PALMYRA_GOLDEN_INTERVAL_S": str(INTERVAL_S),
        "PALMYRA_GOLDEN_MAX_SHARE": "1",
    }
    with sidecar_factory(engine.url, **env) as sc:

        def output() -> dict:
            return client.get(f"{sc.url}/ready").json()["output"]

        def stream() -> int:
            # 30 chunks 0.3 s apart: 9 s in flight, over four intervals.
            body = completion("fake:slow", max_tokens=30, stream=True)
            with httpx.Client(timeout=30) as c, c.stream("POST", f"{sc.url}/v1/completions", json=body) as resp:
                return sum(1 for line in resp.iter_lines() if line.startswith("data: "))

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(stream)
            beside = wait_until(lambda: o if (o := output())["in_flight"] else None, 10, "a check beside the stream")
            assert beside["waited_s"] >= INTERVAL_S, beside  # it waited one more interval first
            assert running.result(timeout=20) == 31  # 30 chunks and [DONE]
        idle = wait_until(
            lambda: o if (o := output())["in_flight"] == 0 and o["waited_s"] < INTERVAL_S else None,
            10,
            "a check on an idle replica",
        )
        assert idle["verdict"] == "error" and idle["next_in_s"] <= INTERVAL_S
