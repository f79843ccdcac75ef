"""The page the inference gateway's endpoint picker scrapes, served live: the real sidecar in front
of the real vLLM CPU engine, at the path and with the metric names read from the component's own
picker config (k8s/components/inference-gateway/picker-config.yaml), parsed with the real
Prometheus text parser.

The picker (llm-d-router v0.10.0) reads five names; four must be there with values it can use.
`vllm:lora_requests_info` is registered by vLLM only when the engine runs with LoRA, which
palmyra-serve's engine does not: its absence is asserted, so that the day it appears the docs are
revisited (the picker treats it as optional: no adapters, no error).
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.api import HTTP, plain_client
from tests.helpers.reliability import figure, long_stream
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine_contract  # also run against vLLM 0.18.0 (the vllm018 tier)

REPO = Path(__file__).resolve().parents[2]
PICKER_CONFIG = REPO / "k8s" / "components" / "inference-gateway" / "picker-config.yaml"
LORA_ONLY = "vllm:lora_requests_info"
# llm-d-router's HTTP scrape client gives up after 10 s (datalayer/source/http/client.go).
PICKER_SCRAPE_TIMEOUT_S = 10.0


def _picker_scrape() -> tuple[str, dict[str, str]]:
    """(path, spec field -> metric name) as the deployed picker would use them."""
    config = yaml.safe_load(PICKER_CONFIG.read_text(encoding="utf-8"))
    [source] = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    [extractor] = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    [vllm] = [e for e in extractor["parameters"]["engineConfigs"] if e["name"] == "vllm"]
    names = {k: v.split("{")[0] for k, v in vllm.items() if k.endswith("Spec") and v}
    return (source.get("parameters") or {}).get("path", "/metrics"), names


def _families(text: str) -> dict[str, list]:
    """metric name -> its samples of that exact name (counters' _total etc. keep their suffix)."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


@pytest.fixture(scope="module")
def scrape(sidecar_server):
    path, _ = _picker_scrape()

    def get() -> dict[str, list]:
        resp = HTTP.get(f"{sidecar_server.url}{path}", timeout=PICKER_SCRAPE_TIMEOUT_S)
        assert resp.status_code == 200, f"{path}: {resp.status_code} {resp.text[:300]}"
        assert resp.headers["content-type"].startswith("text/plain"), resp.headers["content-type"]
        return _families(resp.text)

    return get


def test_the_picker_path_serves_what_the_picker_reads_with_usable_values(scrape):
    _, names = _picker_scrape()
    assert len(names) == 5, names
    page = scrape()
    for field, name in names.items():
        if name == LORA_ONLY:
            continue
        assert page.get(name), f"{name} ({field}) missing from the page the picker scrapes"
        for sample in page[name]:
            assert math.isfinite(sample.value), sample
    # What the picker's extractor turns them into (extractor.go): ints for the queue gauges, a
    # fraction for the KV cache, integer label values on the cache info gauge.
    for field in ("queuedRequestsSpec", "runningRequestsSpec"):
        assert all(s.value >= 0 and s.value == int(s.value) for s in page[names[field]])
    assert all(0.0 <= s.value <= 1.0 for s in page[names["kvUsageSpec"]])
    [info] = page[names["cacheInfoSpec"]]
    assert int(info.labels["block_size"]) > 0 and int(info.labels["num_gpu_blocks"]) > 0, info.labels
    # Without LoRA, vLLM does not register it: the picker reads no adapters (no error).
    assert LORA_ONLY not in page, "the engine now exports vllm:lora_requests_info: update docs/inference-gateway.md"


class _Stream:
    """A long generation streamed through the sidecar on a thread, recording what it received, so a
    failure can tell "the page did not follow the load" from "the load had already ended"."""

    def __init__(self, sidecar_url: str) -> None:
        self.url = sidecar_url
        self.opened = threading.Event()
        self.stop = threading.Event()
        self.status: int | None = None
        self.events = 0
        self.ended_at: float | None = None
        self.last_event = b""
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with (
                plain_client(timeout=httpx.Timeout(120, connect=10)) as client,
                client.stream("POST", f"{self.url}/v1/completions", json=long_stream(2000)) as resp,
            ):
                self.status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data:"):
                        self.events += 1
                        self.last_event = line.encode()[:300]
                        self.opened.set()
                    if self.stop.is_set():
                        return
        except BaseException as exc:  # reported by the test, not lost on the thread
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.opened.set()

    def __enter__(self) -> _Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(150)

    def state(self) -> str:
        return (
            f"status={self.status} events={self.events} ended={self.ended_at is not None} "
            f"error={self.error!r} last={self.last_event!r}"
        )


def test_the_page_is_the_engines_own_and_follows_its_load(scrape, engine_server, sidecar_server):
    _, names = _picker_scrape()
    running = names["runningRequestsSpec"]
    # The engine's own page, relayed: the same metric names as the engine serves itself.
    own = _families(HTTP.get(f"{engine_server.url}/metrics", timeout=10).text)
    assert {n for n in scrape() if n.startswith("vllm:")} == {n for n in own if n.startswith("vllm:")}

    def count() -> float:
        return sum(s.value for s in scrape()[running])

    def engines_own() -> float:
        return sum(s.value for s in _families(HTTP.get(f"{engine_server.url}/metrics", timeout=10).text)[running])

    wait_until(lambda: count() == 0, 60, "an idle engine", interval_s=0.2)
    # 2000 tokens ignoring EOS: about 20 s on this CPU, far longer than the scrapes below need. A
    # stream that still ends before a scrape saw it (an engine error event, a stall on a loaded
    # machine) is not what this test is about: it is retried once, and its state reported.
    seen = None
    for attempt in (1, 2):
        with _Stream(sidecar_server.url) as stream:
            assert stream.opened.wait(120), "the stream produced nothing"
            assert stream.status == 200, stream.state()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and stream.ended_at is None:
                seen = count()
                if seen >= 1:
                    break
                time.sleep(0.1)
            if seen is not None and seen >= 1:
                break
            assert stream.ended_at is not None, (
                f"{running} stayed 0 on the scraped page for 30 s while the stream was live "
                f"(the engine's own page: {engines_own()}; stream: {stream.state()})"
            )
            print(f"attempt {attempt}: the stream ended before a scrape saw it: {stream.state()}")
    assert seen is not None and seen >= 1, f"{running} never seen >= 1 in two streams"
    wait_until(lambda: count() == 0, 120, f"{running} back to 0 after the client left", interval_s=0.2)


def test_a_scrape_costs_far_less_than_the_picker_interval_allows(scrape, sidecar_server):
    """The picker scrapes every 200 ms (picker-config.yaml) with a 10 s client timeout: a scrape
    through the sidecar must take a small part of that, measured here on an idle engine."""
    path, _ = _picker_scrape()
    durations, sizes = [], []
    for _ in range(20):
        t0 = time.perf_counter()
        resp = HTTP.get(f"{sidecar_server.url}{path}", timeout=PICKER_SCRAPE_TIMEOUT_S)
        durations.append(time.perf_counter() - t0)
        assert resp.status_code == 200
        sizes.append(len(resp.content))
    durations.sort()
    figure(
        "engine-metrics scrape through the sidecar",
        scrapes=len(durations),
        median_ms=round(durations[len(durations) // 2] * 1000, 1),
        max_ms=round(durations[-1] * 1000, 1),
        page_bytes=max(sizes),
    )
    assert durations[len(durations) // 2] < 1.0
    assert durations[-1] < PICKER_SCRAPE_TIMEOUT_S
