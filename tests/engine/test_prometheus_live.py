"""The live proof of the monitoring: a real Prometheus (the repository's config and alert rules)
scrapes the real sidecar and vLLM CPU engine while real traffic flows, then every panel query of
the Service and Engine dashboards must return data, and every alert rule must load and evaluate.

Traffic covers what the panels show: plain, streamed and chat completions, a request the sidecar
rejects (413), one the engine refuses (404), and 5xx/upstream errors from a second sidecar whose
engine is unreachable (so the error panels are proven too, without breaking the shared engine).
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from tests.helpers import procs
from tests.helpers.api import MODEL, plain_client
from tests.helpers.modules import load_module
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine_contract  # also run against vLLM 0.18.0 (the vllm018 tier)

REPO = Path(__file__).resolve().parents[2]
MON = REPO / "monitoring"
RATE_WINDOW = "1m"  # stands in for Grafana's $__rate_interval: covers both traffic waves

# Panel targets ("dashboard uid / panel title / legend") allowed to stay empty here, each with the
# reason the event cannot be produced here; printed whenever used. The traffic below produces every
# event the other panels chart (preemptions and canary failures are rates of pre-created counters,
# so a zero rate is data, not a gap).
ALLOWED_EMPTY: dict[str, str] = {
    "palmyra-service / Quota store / {{instance}}": "these sidecars have no shared quota store (Redis): "
    "palmyra_quota_store_up exists only where one is configured",
}


dq = load_module("palmyra_dashboard_queries", MON / "dashboard_queries.py")
local_prometheus = load_module("palmyra_local_prometheus", MON / "local_prometheus.py")


def _hostport(url: str) -> str:
    return urlparse(url).netloc


def _finite(prom, expr: str) -> list[float]:
    body = prom.query(expr)
    assert body["status"] == "success", f"{expr}: {body.get('error')}"
    data = body["data"]
    raw = [data["result"][1]] if data["resultType"] == "scalar" else [s["value"][1] for s in data["result"]]
    return [v for v in map(float, raw) if not math.isnan(v)]


@pytest.fixture(scope="module")
def dead_sidecar(log_dir):
    """A sidecar whose engine address answers nothing: its requests end in 5xx, its upstream
    errors count `connect`, it never turns ready."""
    with procs.sidecar(f"http://127.0.0.1:{procs.free_port()}", log_dir, wait_ready=False, probe=True) as server:
        yield server


@pytest.fixture(scope="module")
def live_prometheus(engine_server, sidecar_server, dead_sidecar):
    base = yaml.safe_load((MON / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    # As deployed: each sidecar's own page from its probe port (the per-tenant series are only there),
    # under its client address as `instance`; the engine's page through its sidecar's client port
    # (/engine/metrics). The sidecar without an engine has no engine page to scrape.
    sidecars = [sidecar_server, dead_sidecar]
    targets = local_prometheus.scrape_targets(
        [_hostport(s.url) for s in sidecars], probes=[f"127.0.0.1:{s.probe_port}" for s in sidecars]
    )
    targets["palmyra-engine"] = [_hostport(sidecar_server.url)]
    cfg = local_prometheus.render_config(base, targets, scrape_interval="1s")
    with local_prometheus.LocalPrometheus(cfg) as prom:

        def all_up():
            active = prom.api("targets", state="active")["data"]["activeTargets"]
            return len(active) == 3 and all(t["health"] == "up" for t in active)

        wait_until(all_up, 30, "sidecars and engine scraped")
        yield prom


def _client(sidecar) -> httpx.Client:
    headers = {"Authorization": f"Bearer {sidecar.api_key}"} if getattr(sidecar, "api_key", None) else {}
    return plain_client(base_url=sidecar.url, headers=headers, timeout=httpx.Timeout(180.0, connect=10.0))


LONG_PROMPT = (
    "Palmyra serves text on Ascend NPUs and on CPUs alike. " * 24
)  # a few hundred tokens, reused: prefix-cache hits


def drive_traffic(client: httpx.Client, dead: httpx.Client) -> list[tuple[str, int]]:
    """One wave of every kind of request the dashboards chart. Returns (what, status) pairs."""
    seen = []
    for _ in range(3):
        r = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 0}
        )
        seen.append(("completion", r.status_code))
    # ignore_eos: random stand-in weights may emit EOS at once; streams need several chunks for ITL
    with client.stream(
        "POST",
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": LONG_PROMPT,
            "max_tokens": 16,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        chunks = [line for line in r.iter_lines() if line.startswith("data:")]
        seen.append(("streamed completion", r.status_code))
    assert len(chunks) >= 3, chunks
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 12,
        "ignore_eos": True,
    }
    with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
        list(r.iter_lines())
        seen.append(("streamed chat", r.status_code))
    seen.append(("chat", client.post("/v1/chat/completions", json=chat).status_code))
    # rejected by the sidecar itself: a body over the 4 MiB limit
    big = json.dumps({"model": MODEL, "prompt": "x" * (4 * 1024 * 1024 + 64), "max_tokens": 1})
    r = client.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
    seen.append(("too large", r.status_code))
    # refused by the engine: a model it does not serve
    r = client.post("/v1/completions", json={"model": "no-such-model", "prompt": "hi", "max_tokens": 1})
    seen.append(("unknown model", r.status_code))
    # a sidecar with no engine behind it: server-side errors and upstream connect errors
    for _ in range(2):
        r = dead.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
        seen.append(("engine unreachable", r.status_code))
    return seen


def _last_scrapes(prom) -> dict[str, float]:
    """When each active target's last scrape began (wall clock), by scrape URL."""
    active = prom.api("targets", state="active")["data"]["activeTargets"]
    return {a["scrapeUrl"]: datetime.fromisoformat(a["lastScrape"]).timestamp() for a in active}


def wait_scraped_after(prom, t: float) -> None:
    """Every target scraped after t, and that scrape stored: lastScrape is set when a scrape's
    body is read, before its samples are committed, but a target's scrapes run one after another,
    so once its lastScrape advances again the scrape that began after t is in the database."""

    def all_after():
        scrapes = _last_scrapes(prom)
        return len(scrapes) == 3 and all(v > t for v in scrapes.values()) and scrapes

    after = wait_until(all_after, 30, "every target scraped after the first wave")
    wait_until(
        lambda: all(v > after[url] for url, v in _last_scrapes(prom).items()),
        30,
        "every target scraped once more (the scrape after the first wave stored)",
    )


@pytest.fixture(scope="module")
def traffic(live_prometheus, sidecar_server, dead_sidecar):
    prom = live_prometheus
    with _client(sidecar_server) as client, _client(dead_sidecar) as dead:
        first = drive_traffic(client, dead)
        first_done = time.time()  # Prometheus runs on this machine: the same wall clock
        # every series the first wave created is in Prometheus before the second wave moves it,
        # so rate() sees an increase for each of them: every target scraped again since it ended
        wait_until(lambda: _finite(prom, 'palmyra_requests_total{status="413"}'), 30, "the first wave scraped")
        wait_scraped_after(prom, first_done)
        second = drive_traffic(client, dead)
    return first + second


def test_traffic_got_the_intended_answers(traffic):
    by_kind: dict[str, set[int]] = {}
    for kind, status in traffic:
        by_kind.setdefault(kind, set()).add(status)
    assert by_kind["completion"] == by_kind["streamed completion"] == by_kind["chat"] == {200}
    assert by_kind["streamed chat"] == {200}
    assert by_kind["too large"] == {413}
    assert by_kind["unknown model"] == {404}
    assert all(s >= 500 for s in by_kind["engine unreachable"]), by_kind["engine unreachable"]


def _dashboard_values(name: str, engine_server, sidecar_server, dead_sidecar) -> dict[str, str]:
    sidecars = f"{_hostport(sidecar_server.url)}|{_hostport(dead_sidecar.url)}"
    # The engine's series carry its sidecar's address: they are scraped through /engine/metrics.
    instance = sidecars if name == "palmyra-service.json" else _hostport(sidecar_server.url)
    return {"instance": instance, "model": MODEL, "ttft_slo": "2", "itl_slo": "0.25", "__rate_interval": RATE_WINDOW}


@pytest.mark.parametrize("name", ["palmyra-service.json", "palmyra-engine.json"])
def test_every_panel_query_has_data(name, traffic, live_prometheus, engine_server, sidecar_server, dead_sidecar):
    prom = live_prometheus
    values = _dashboard_values(name, engine_server, sidecar_server, dead_sidecar)
    queries = dq.panel_queries(dq.load(name))

    def missing() -> list[str]:
        """Panels without data, less those allowed to stay empty: waiting on an allowed one would
        let the traffic age out of the rate window, and every rate panel after it."""
        return [
            q.key for q in queries if q.key not in ALLOWED_EMPTY and not _finite(prom, dq.substitute(q.expr, values))
        ]

    # Scrapes are 1 s apart; the idle canary runs every 15 s once traffic stops: allow for both.
    deadline = time.monotonic() + 60
    empty = missing()
    while empty and time.monotonic() < deadline:
        time.sleep(2)
        empty = missing()
    allowed = [q.key for q in queries if q.key in ALLOWED_EMPTY and not _finite(prom, dq.substitute(q.expr, values))]
    print(f"{name}: {len(queries)} panel queries, allow-list: {ALLOWED_EMPTY or 'empty'}")
    for key in allowed:
        print(f"allowed empty: {key}: {ALLOWED_EMPTY[key]}")
    assert not empty, f"panels without data after real traffic: {sorted(empty)}"
    assert len(queries) >= 20


def test_variable_queries_list_the_live_targets(traffic, live_prometheus, engine_server, sidecar_server):
    # Both dashboards list the sidecar's address: the engine's series are scraped through it.
    expect = {
        "palmyra-service.json": _hostport(sidecar_server.url),
        "palmyra-engine.json": _hostport(sidecar_server.url),
    }
    for name, instance in expect.items():
        variables = {v["name"]: v for v in dq.load(name)["templating"]["list"]}
        selector = dq.substitute(dq.label_values_selector(variables["instance"]["definition"]), {})
        found = {s["metric"].get("instance") for s in live_prometheus.query(selector)["data"]["result"]}
        assert instance in found, (name, found)
        selector = dq.substitute(dq.label_values_selector(variables["model"]["definition"]), {"instance": ".*"})
        models = {s["metric"].get("model_name") for s in live_prometheus.query(selector)["data"]["result"]}
        assert MODEL in models, (name, models)


def test_alert_rules_load_and_evaluate_ok(traffic, live_prometheus):
    rules_file = yaml.safe_load((MON / "prometheus" / "rules" / "palmyra-alerts.yml").read_text(encoding="utf-8"))
    expected = {r.get("alert") or r.get("record") for g in rules_file["groups"] for r in g["rules"]}

    def loaded():
        rules = [r for g in live_prometheus.api("rules")["data"]["groups"] for r in g["rules"]]
        return rules if rules and all(r["health"] == "ok" for r in rules) else None

    rules = wait_until(loaded, 30, "every rule evaluated with health ok")
    assert {r["name"] for r in rules} == expected
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad


def runbook_base() -> str:
    """The base every runbook link starts with: the recording rule palmyra:runbook_base_url's label."""
    rules = yaml.safe_load((MON / "prometheus" / "rules" / "palmyra-alerts.yml").read_text(encoding="utf-8"))
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("record") == "palmyra:runbook_base_url"]
    return rule["labels"]["url"]


def test_alerts_single_out_the_broken_replica(traffic, live_prometheus, engine_server, sidecar_server, dead_sidecar):
    """The sidecar without an engine gets PalmyraReplicaNeverReady (pending: `for: 21m`) with the
    runbook link rendered from the recording rule, but neither PalmyraEngineDown (an engine that
    never came up is a start, not an outage) nor PalmyraReplicaLostReadiness (it was never ready);
    the healthy pair, which serves the tiny stand-in, has PalmyraStandInWeights and no other
    per-instance alert."""
    dead, live = _hostport(dead_sidecar.url), {_hostport(sidecar_server.url), _hostport(engine_server.url)}

    def active(name):
        alerts = live_prometheus.api("alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == name]

    alerts = wait_until(
        lambda: active("PalmyraReplicaNeverReady"), 30, "PalmyraReplicaNeverReady for the sidecar without engine"
    )
    assert [(a["labels"].get("instance"), a["state"]) for a in alerts] == [(dead, "pending")]
    assert alerts[0]["annotations"]["runbook_url"] == runbook_base() + "#palmyrareplicaneverready"
    stand_in = wait_until(lambda: active("PalmyraStandInWeights"), 30, "PalmyraStandInWeights for the stand-in pair")
    assert [a["labels"].get("instance") for a in stand_in] == [_hostport(sidecar_server.url)]
    everything = live_prometheus.api("alerts")["data"]["alerts"]
    for name in ("PalmyraEngineDown", "PalmyraReplicaLostReadiness"):
        assert not [a for a in everything if a["labels"]["alertname"] == name], everything
    on_live = [
        (a["labels"]["alertname"], a["labels"].get("instance"))
        for a in everything
        if a["labels"].get("instance") in live and a["labels"]["alertname"] != "PalmyraStandInWeights"
    ]
    assert not on_live, f"alerts on the healthy replica: {on_live}"
