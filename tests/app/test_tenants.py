"""Tenants and quotas through the real sidecar (a fake engine behind it) and a real redis-server
(Debian's): one regression test per promise of docs/tenants.md.

- Redis counts exactly as the local window does (tenants/redis_store.py's script against
  tenants/window.py), and two replicas share one minute.
- Every response of a limited tenant carries x-ratelimit-* headers; over a limit it is a 429 with
  Retry-After, counted per tenant; the tenant is in the access log.
- A stream that did not ask for usage gets none, while its tokens are counted exactly.
- With priority scheduling, the engine gets the tenant's priority, whatever the client sent.
- Redis going away leaves each replica its share (palmyra_quota_store_up 0); coming back restores
  the shared limit.
- The OpenAI SDK, unmodified, with a tenant key: its retry honours the 429's Retry-After.
- The per-tenant series are read on the probe port only: the client port's /metrics, which asks no
  key, has every other series and none with a `tenant` label, with a probe port or without one."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path

import httpx
import openai

from palmyra_serve.sidecar.tenants.config import key_digest
from palmyra_serve.sidecar.tenants.quota import Quotas
from palmyra_serve.sidecar.tenants.redis_store import RedisStore, client
from palmyra_serve.sidecar.tenants.window import SlidingMinute
from tests.helpers.api import metric_value
from tests.helpers.redis_server import redis_server
from tests.helpers.waiting import wait_until

SEARCH_KEY = "search-team-key-0123456789"
ANY = {"model": "m", "prompt": "x"}
BATCH_KEY = "batch-team-key-0123456789"


def tenants_file(tmp_path: Path, search: str, batch: str = "") -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "tenants:\n"
        f"  - name: search\n    keys: ['{key_digest(SEARCH_KEY)}']\n{search}"
        f"  - name: batch\n    keys: ['{key_digest(BATCH_KEY)}']\n{batch}"
    )
    return path


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_redis_counts_exactly_as_the_local_window_and_two_replicas_share_a_minute(log_dir):
    rng = random.Random(7)

    async def scenario(redis_url: str, password_file: Path) -> None:
        store = RedisStore(client(redis_url, password_file, None, 2.0), "t", timeout_s=2.0)
        raw = store.redis
        limits = {"requests": 50, "tokens": 400}
        for _ in range(300):
            key_req, key_tok = store.key("x", "requests"), store.key("x", "tokens")
            before = {k: {int(s): int(v) for s, v in (await raw.hgetall(k)).items()} for k in (key_req, key_tok)}
            amounts = {"requests": 1, "tokens": rng.choice([0, 1, 30, 90, 500])}
            taken = await store.take("x", limits, amounts)
            fits = all(
                SlidingMinute(dict(before[k])).fits(taken.slot, min(amounts[kind], limits[kind]), limits[kind])
                for k, kind in ((key_req, "requests"), (key_tok, "tokens"))
            )
            assert taken.admitted == fits
            window = SlidingMinute({int(s): int(v) for s, v in (await raw.hgetall(key_tok)).items()})
            assert taken.states["tokens"].remaining == max(0, 400 - window.used(taken.slot))
            if taken.admitted and rng.random() < 0.5:
                await store.settle("x", taken.slot, -rng.randint(0, min(amounts["tokens"], limits["tokens"])))
        # Two replicas, one minute: 30 requests allowed between them, whoever asks.
        replicas = [
            Quotas(RedisStore(client(redis_url, password_file, None, 2.0), "two", timeout_s=2.0)) for _ in range(2)
        ]
        from palmyra_serve.sidecar.tenants.config import TenantSpec

        spec = TenantSpec(name="shared", requests_per_minute=30)
        admitted = 0
        for i in range(50):
            verdict = await replicas[i % 2].admit(spec, 0)
            admitted += verdict.reservation is not None
        assert admitted == 30
        for quotas in replicas:
            assert quotas.remote_up
            await quotas.close()
        await store.close()

    with redis_server(log_dir) as redis:
        asyncio.run(scenario(redis.url, redis.password_file))


def test_a_limited_tenant_gets_headers_429s_exact_stream_tokens_and_its_priority(
    engine, sidecar_factory, client: httpx.Client, tmp_path
):
    path = tenants_file(
        tmp_path, "    requests_per_minute: 4\n    tokens_per_minute: 100000\n    priority: -3\n", "    weight: 2\n"
    )
    with sidecar_factory(
        engine.url, probe=True, PALMYRA_TENANTS_FILE=str(path), PALMYRA_PRIORITY_SCHEDULING="true"
    ) as sc:
        ok = client.post(
            f"{sc.url}/v1/completions",
            headers=auth(SEARCH_KEY),
            json={"model": "m", "prompt": "hello", "max_tokens": 5, "priority": -100},
        )
        assert ok.status_code == 200
        assert ok.headers["x-ratelimit-limit-requests"] == "4" and ok.headers["x-ratelimit-remaining-requests"] == "3"
        assert ok.headers["x-ratelimit-limit-tokens"] == "100000" and ok.headers["x-ratelimit-reset-tokens"] == "1m0s"
        # A stream that asked for no usage: none reaches the client, the engine was asked for it.
        with client.stream(
            "POST",
            f"{sc.url}/v1/completions",
            headers=auth(SEARCH_KEY),
            json={"model": "m", "prompt": "hi", "max_tokens": 6, "stream": True},
        ) as stream:
            assert stream.headers["x-ratelimit-remaining-requests"] == "2"
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) == 7
        assert all('"usage"' not in e for e in events)
        bodies = {b["prompt"]: b for b in _bodies(client, engine.url) if isinstance(b.get("prompt"), str)}
        assert bodies["hi"]["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
        assert bodies["hello"]["priority"] == -3 and bodies["hi"]["priority"] == -3  # the tenant's, not the client's
        # The engine's usage, exactly: 3 + 5 and 3 + 6 prompt and completion tokens.
        tokens = 'palmyra_tenant_tokens_total{kind="%s",tenant="search"}'
        assert metric_value(client, sc.probe_url, tokens % "completion") == 11
        assert metric_value(client, sc.probe_url, tokens % "prompt") == 6
        # A stream that asked for usage keeps it.
        with client.stream(
            "POST",
            f"{sc.url}/v1/completions",
            headers=auth(SEARCH_KEY),
            json={
                "model": "m",
                "prompt": "hi",
                "max_tokens": 2,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as stream:
            assert any('"usage"' in line for line in stream.iter_lines())
        client.get(f"{sc.url}/v1/models", headers=auth(SEARCH_KEY))  # every relayed route counts a request
        over = client.post(f"{sc.url}/v1/completions", headers=auth(SEARCH_KEY), json={"model": "m", "prompt": "x"})
        assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_requests"
        assert 1 <= int(over.headers["retry-after"]) <= 60 and over.headers["x-ratelimit-remaining-requests"] == "0"
        # Another tenant is not touched by search's limit, and an unlimited one gets no headers.
        other = client.post(f"{sc.url}/v1/completions", headers=auth(BATCH_KEY), json={"model": "m", "prompt": "x"})
        assert other.status_code == 200 and "x-ratelimit-limit-requests" not in other.headers
        refused = 'palmyra_tenant_refusals_total{reason="rate_limit_requests",tenant="search"}'
        assert metric_value(client, sc.probe_url, refused) == 1
        assert metric_value(client, sc.probe_url, 'palmyra_tenant_requests_total{status="429",tenant="search"}') == 1
        assert metric_value(client, sc.probe_url, 'palmyra_tenant_requests_total{status="200",tenant="batch"}') == 1

        def logged_tenants() -> set[str]:
            lines = sc.log_path.read_text().splitlines()
            return {json.loads(line).get("tenant") for line in lines if '"palmyra.access"' in line}

        wait_until(lambda: {"search", "batch"} <= logged_tenants(), 10, "the tenants in the access log", 0.1)


def test_without_redis_each_replica_enforces_its_share_and_gets_the_shared_limit_back(
    engine, sidecar_factory, client: httpx.Client, tmp_path, log_dir
):
    path = tenants_file(tmp_path, "    requests_per_minute: 40\n")
    with redis_server(log_dir) as redis:
        env = {
            "PALMYRA_TENANTS_FILE": str(path),
            "PALMYRA_QUOTA_REDIS_URL": redis.url,
            "PALMYRA_QUOTA_REDIS_PASSWORD_FILE": str(redis.password_file),
            "PALMYRA_QUOTA_REPLICAS": "4",
        }
        sidecar = sidecar_factory(engine.url, **env)
        sc = sidecar.__enter__()
    try:  # Redis stopped (the block above ended), the sidecar still running

        def ask() -> httpx.Response:
            return client.post(f"{sc.url}/v1/completions", headers=auth(SEARCH_KEY), json=ANY)

        alone = ask()
        assert alone.status_code == 200 and alone.headers["x-ratelimit-limit-requests"] == "10"
        assert metric_value(client, sc.url, "palmyra_quota_store_up") == 0
        assert metric_value(client, sc.url, "palmyra_quota_store_errors_total") >= 1
        statuses = [ask().status_code for _ in range(12)]
        assert statuses.count(200) == 9 and statuses[-1] == 429  # 10 in all on this replica alone
        with redis_server(log_dir, port=redis.port) as again:
            # Seen back without a request (the watch pings it), then shared again.
            wait_until(lambda: metric_value(client, sc.url, "palmyra_quota_store_up") == 1, 10, "store up", 0.1)
            back = ask()
            assert back.status_code == 200 and back.headers["x-ratelimit-limit-requests"] == "40"
            assert again.cli("EXISTS", "palmyra:quota:{search}:requests") == "1"
    finally:
        sidecar.__exit__(None, None, None)


def _bodies(client: httpx.Client, engine_url: str) -> list[dict]:
    return client.get(f"{engine_url}/fake/stats").json()["bodies"]


def test_the_openai_sdk_with_a_tenant_key_retries_a_429_after_its_retry_after(
    engine, sidecar_factory, client: httpx.Client, tmp_path
):
    path = tenants_file(tmp_path, "    max_concurrent: 1\n")
    client.post(f"{engine.url}/fake/control", json={"generate_delay": 1.5}).raise_for_status()
    with sidecar_factory(engine.url, probe=True, PALMYRA_TENANTS_FILE=str(path)) as sc:
        sdk = openai.OpenAI(base_url=f"{sc.url}/v1", api_key=SEARCH_KEY, max_retries=3)
        first = sdk.with_options(max_retries=0)

        async def both() -> list[object]:
            loop = asyncio.get_running_loop()
            slow = loop.run_in_executor(None, lambda: first.completions.create(model="m", prompt="a", max_tokens=2))
            wait_until(lambda: any(b.get("prompt") == "a" for b in _bodies(client, engine.url)), 10, "first in", 0.02)
            retried = loop.run_in_executor(None, lambda: sdk.completions.create(model="m", prompt="b", max_tokens=2))
            return list(await asyncio.gather(slow, retried))

        done = asyncio.run(both())
        assert all(c.choices[0].text for c in done)  # type: ignore[attr-defined]
        refusals = 'palmyra_tenant_refusals_total{reason="tenant_concurrency",tenant="search"}'
        assert metric_value(client, sc.probe_url, refusals) >= 1  # the SDK met the 429 and retried past it


# A series with a `tenant` label, whatever the family; and the families of the per-tenant metrics.
TENANT_SERIES = re.compile(r'^[a-z_:]+\{(?:[^}]*,)?tenant="', re.M)
TENANT_FAMILIES = {
    "palmyra_tenant_requests_total",
    "palmyra_tenant_tokens_total",
    "palmyra_tenant_refusals_total",
    "palmyra_tenant_limit",
}


def _families(page: str) -> set[str]:
    return {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}


def test_per_tenant_series_are_served_on_the_probe_port_only(engine, sidecar_factory, client: httpx.Client, tmp_path):
    """The client port's /metrics answers anyone without a key (Prometheus sends none): it must not
    tell who the tenants are, nor how much each asks for or is refused. The probe port, which no
    client reaches in a deployment, serves the full page; a single-port sidecar leaves the series out
    too (docs/metrics.md: set PALMYRA_PROBE_PORT to read them)."""
    path = tenants_file(tmp_path, "    requests_per_minute: 1\n    max_concurrent: 2\n")

    def traffic(url: str) -> None:
        assert client.post(f"{url}/v1/completions", headers=auth(SEARCH_KEY), json=ANY).status_code == 200
        assert client.post(f"{url}/v1/completions", headers=auth(SEARCH_KEY), json=ANY).status_code == 429
        assert client.post(f"{url}/v1/completions", headers=auth(BATCH_KEY), json=ANY).status_code == 200

    with sidecar_factory(engine.url, probe=True, PALMYRA_TENANTS_FILE=str(path)) as sc:
        traffic(sc.url)
        public = client.get(f"{sc.url}/metrics")
        full = client.get(f"{sc.probe_url}/metrics")
        assert public.status_code == full.status_code == 200
        assert public.headers["content-type"] == full.headers["content-type"]
        # Every tenant series on the probe port: each family, each tenant the traffic touched.
        assert _families(full.text) >= TENANT_FAMILIES
        for series in (
            'palmyra_tenant_requests_total{status="200",tenant="search"} 1.0',
            'palmyra_tenant_requests_total{status="429",tenant="search"} 1.0',
            'palmyra_tenant_requests_total{status="200",tenant="batch"} 1.0',
            'palmyra_tenant_refusals_total{reason="rate_limit_requests",tenant="search"} 1.0',
            'palmyra_tenant_limit{limit="requests_per_minute",tenant="search"} 1.0',
            'palmyra_tenant_tokens_total{kind="prompt",tenant="default"} 0.0',
        ):
            assert series in full.text.splitlines(), series
        # None on the client port: no series with a `tenant` label, no tenant family at all (not
        # even its HELP and TYPE lines), no tenant's name in a label.
        assert not TENANT_SERIES.findall(public.text), TENANT_SERIES.findall(public.text)[:3]
        assert "tenant=" not in public.text
        assert not any(name in public.text for name in ('"search"', '"batch"', "palmyra_tenant_"))
        # ... and everything else: the families differ by exactly the tenant ones, and the aggregates
        # count the same traffic.
        assert _families(full.text) - _families(public.text) == TENANT_FAMILIES
        assert _families(public.text) <= _families(full.text)
        for series in (
            'palmyra_requests_total{route="completions",status="200"}',
            'palmyra_rejections_total{reason="rate_limit_requests"}',
        ):
            assert metric_value(client, sc.url, series) == metric_value(client, sc.probe_url, series) >= 1
    # One port only (`palmyra-serve up`'s layout): the client port leaves them out all the same.
    with sidecar_factory(engine.url, PALMYRA_TENANTS_FILE=str(path)) as alone:
        traffic(alone.url)
        page = client.get(f"{alone.url}/metrics").text
        assert "tenant=" not in page and "palmyra_tenant_" not in page
        assert metric_value(client, alone.url, 'palmyra_rejections_total{reason="rate_limit_requests"}') == 1
