"""The two views of the sidecar's registry (core/metrics.py): the probe port's full page and
the client port's, without every family that carries a `tenant` label. The app tier checks the
same over real sockets (tests/app/test_tenants.py); here, the rule itself, including for a family
added later or by a collector that declares no label names."""

from __future__ import annotations

from prometheus_client import Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from palmyra_serve.sidecar.core.metrics import TENANT_LABEL, SidecarMetrics, tenant_families
from palmyra_serve.sidecar.tenants.config import Tenants, TenantSpec


def _families(page: bytes) -> dict[str, list[dict[str, str]]]:
    return {f.name: [s.labels for s in f.samples] for f in text_string_to_metric_families(page.decode())}


def _metrics() -> SidecarMetrics:
    metrics = SidecarMetrics()
    metrics.show_tenants(Tenants({"search": TenantSpec(name="search", requests_per_minute=5)}, {}).by_name)
    metrics.count_tenant("search", 200, 3, 5)
    metrics.tenant_refusal("search", "rate_limit_requests")
    metrics.count_request("completions", 200)
    return metrics


def test_the_client_view_is_the_full_page_without_the_tenant_families():
    metrics = _metrics()
    full, public = _families(metrics.page(tenants=True)), _families(metrics.page(tenants=False))
    declared = {
        getattr(c, "_name", "")
        for c in metrics.registry._collector_to_names
        if TENANT_LABEL in getattr(c, "_labelnames", ())
    }
    # The families the sidecar declares with a `tenant` label, whatever their name says.
    assert declared == {
        "palmyra_tenant_requests",
        "palmyra_tenant_tokens",
        "palmyra_tenant_refusals",
        "palmyra_tenant_limit",
    }
    assert declared <= tenant_families(metrics.registry)
    assert set(full) - set(public) == declared, set(full) - set(public)
    assert all(TENANT_LABEL in labels for name in declared for labels in full[name])
    assert not any(TENANT_LABEL in labels for samples in public.values() for labels in samples)
    # Everything else is the same page, series for series.
    assert {n: s for n, s in full.items() if n not in declared} == public


def test_a_tenant_family_registered_later_or_undeclared_stays_off_the_client_page():
    metrics = _metrics()
    # Registered after the start, as the quota store's gauge is: hidden whole, even with no series.
    Gauge("palmyra_tenant_later", "A family added later.", ["tenant"], registry=metrics.registry)

    class Undeclared(Collector):
        """A collector that declares no label names: its samples are what tell."""

        def collect(self):
            family = GaugeMetricFamily("palmyra_custom", "Per tenant, undeclared.", labels=["tenant"])
            family.add_metric(["search"], 1.0)
            yield family
            yield GaugeMetricFamily("palmyra_custom_total_seen", "No tenant label.", value=2.0)

    metrics.registry.register(Undeclared())
    public = metrics.page(tenants=False).decode()
    full = metrics.page(tenants=True).decode()
    assert "palmyra_tenant_later" in full and 'palmyra_custom{tenant="search"} 1.0' in full
    assert "palmyra_tenant_later" not in public and "palmyra_custom{" not in public
    assert "palmyra_custom_total_seen 2.0" in public
    assert "tenant=" not in public
