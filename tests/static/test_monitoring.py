"""Monitoring as code: Prometheus config and alert rules checked and unit-tested with promtool,
the Alertmanager config checked with amtool, Grafana dashboards checked for structure, runbook
links resolved (each section justifying its alert's `for:`), and the NPU dashboard proven against
a real Prometheus scraping Ascend npu-exporter's recorded /metrics page."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from tests.helpers import alertmanager
from tests.helpers.markdown import github_slug
from tests.helpers.modules import load_module
from tests.helpers.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
MON = REPO / "monitoring"
PROM_DIR = MON / "prometheus"
RULES = PROM_DIR / "rules" / "palmyra-alerts.yml"
UNIT_TESTS = PROM_DIR / "tests" / "palmyra-alerts.test.yml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
# Every annotation reads the base from the recording rule (its `url` label), then the anchor.
RUNBOOK_BASE_RULE = "palmyra:runbook_base_url"
RUNBOOK_PREFIX = '{{ with query "palmyra:runbook_base_url" }}{{ . | first | label "url" }}{{ end }}#'

EXPECTED_ALERTS = {
    "PalmyraReplicaNeverReady",
    "PalmyraReplicaLostReadiness",
    "PalmyraStandInWeights",
    "PalmyraOutputDrift",
    "PalmyraEngineDown",
    "PalmyraWarmupFailing",
    "PalmyraTTFTHigh",
    "PalmyraInterTokenLatencyHigh",
    "PalmyraErrorRatioHigh",
    "PalmyraQueueDepthSustained",
    "PalmyraKVCacheNearFull",
    "PalmyraPreemptionSpike",
    "PalmyraOverloadRejections",
    "PalmyraNPUUnhealthy",
    "PalmyraSidecarFaults",
    "PalmyraQuotaStoreDown",
}
# vLLM renamed these; a dashboard may join old and new name with `or` (no data is invented).
RENAMED = [
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
]
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
DASHBOARD_FILES = ["palmyra-service.json", "palmyra-engine.json", "palmyra-npu.json"]

# What each dashboard must show (from the contract's metric tables and npu-exporter's names).
REQUIRED_METRICS = {
    "palmyra-service.json": [
        "palmyra_requests_total",
        "palmyra_request_duration_seconds_bucket",
        "palmyra_time_to_first_token_seconds_bucket",
        "palmyra_inter_token_latency_seconds_bucket",
        "palmyra_output_tokens_total",
        "palmyra_prompt_tokens_total",
        "palmyra_in_flight_requests",
        "palmyra_queued_requests",
        "palmyra_rejections_total",
        "palmyra_upstream_errors_total",
        "palmyra_ready",
        "palmyra_engine_live",
        "palmyra_warmup_phase",
        "palmyra_warmup_duration_seconds",
        "palmyra_warmup_runs_total",
        "palmyra_canary_latency_seconds_bucket",
        "palmyra_canary_failures_total",
        "palmyra_startup_phase_seconds",
        "palmyra_stand_in_weights",
        "palmyra_tenant_tokens_total",
        "palmyra_tenant_requests_total",
        "palmyra_tenant_refusals_total",
        "palmyra_quota_store_up",
        "palmyra_quota_store_errors_total",
    ],
    "palmyra-engine.json": [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:request_prefill_time_seconds_bucket",
        "vllm:request_decode_time_seconds_bucket",
        "vllm:request_prompt_tokens_bucket",
        "vllm:request_generation_tokens_bucket",
        "vllm:request_success_total",
        "vllm:e2e_request_latency_seconds_bucket",
    ],
    "palmyra-npu.json": [
        "npu_chip_info_utilization",
        "npu_chip_info_hbm_used_memory",
        "npu_chip_info_hbm_total_memory",
        "npu_chip_info_temperature",
        "npu_chip_info_power",
        "npu_chip_info_health_status",
    ],
}


dq = load_module("palmyra_dashboard_queries", MON / "dashboard_queries.py")
local_prometheus = load_module("palmyra_local_prometheus", MON / "local_prometheus.py")
generator = load_module("palmyra_generate_dashboards", MON / "grafana" / "generate_dashboards.py")


def _yaml(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _alert_rules() -> list[dict]:
    return [r for g in _yaml(RULES)["groups"] for r in g["rules"] if "alert" in r]


def _recorded(name: str) -> dict:
    return next(r for g in _yaml(RULES)["groups"] for r in g["rules"] if r.get("record") == name)


def runbook_base() -> str:
    return _recorded(RUNBOOK_BASE_RULE)["labels"]["url"]


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool missing: install Debian's `prometheus` package (./test.sh static does)"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------------- promtool
def test_promtool_check_config_finds_the_rules():
    # rule_files is relative to the config (Compose mounts the folder at /etc/prometheus).
    out = _promtool("check", "config", "prometheus.yml", cwd=PROM_DIR)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 1 rule files found" in out.stdout + out.stderr


def test_promtool_check_rules():
    out = _promtool("check", "rules", str(RULES), cwd=PROM_DIR)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_pass():
    out = _promtool("test", "rules", str(UNIT_TESTS.relative_to(PROM_DIR)), cwd=PROM_DIR)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_unit_tests_cover_every_alert_firing_and_silent():
    fires: set[str] = set()
    silent: set[str] = set()
    for case in _yaml(UNIT_TESTS)["tests"]:
        for t in case.get("alert_rule_test", []):
            (fires if t.get("exp_alerts") else silent).add(t["alertname"])
    assert fires == EXPECTED_ALERTS, f"no firing case for {EXPECTED_ALERTS - fires}"
    assert silent == EXPECTED_ALERTS, f"no silent case for {EXPECTED_ALERTS - silent}"


# --------------------------------------------------------------------------------- the rules
def test_alert_set_and_annotations():
    rules = _alert_rules()
    names = [r["alert"] for r in rules]
    assert sorted(names) == sorted(EXPECTED_ALERTS)
    for r in rules:
        assert r.get("for"), f"{r['alert']}: no `for:` (a single bad sample would page)"
        assert r["labels"]["severity"] in {"warning", "critical"}, r["alert"]
        ann = r["annotations"]
        assert ann.get("summary") and ann.get("description"), r["alert"]
        assert ann["runbook_url"] == RUNBOOK_PREFIX + r["alert"].lower(), r["alert"]


def test_the_runbook_base_is_one_recording_rule_evaluated_before_every_alert():
    """The annotations find the base at the evaluation that renders them: a group evaluates its
    rules in order, each committed before the next, so the rule leads the one group that holds
    every alert. The unit tests expect the full links with that same base."""
    groups = _yaml(RULES)["groups"]
    holding = [g for g in groups if any("alert" in r for r in g["rules"])]
    assert len(holding) == 1, "every alert in one group, after the base"
    first, *rest = holding[0]["rules"]
    assert first == {"record": RUNBOOK_BASE_RULE, "expr": "vector(1)", "labels": {"url": first["labels"]["url"]}}
    assert all("alert" in r for r in rest)
    base = runbook_base()
    assert base.startswith("https://") and base.endswith("/docs/runbooks.md")
    expected = [
        a["exp_annotations"]["runbook_url"]
        for case in _yaml(UNIT_TESTS)["tests"]
        for t in case.get("alert_rule_test", [])
        for a in t.get("exp_alerts", [])
    ]
    assert expected and all(url.startswith(base + "#") for url in expected), expected


def runbook_sections() -> dict[str, str]:
    """Heading -> text of each `## ` section of docs/runbooks.md."""
    parts = re.split(r"^## (.+)$", RUNBOOKS.read_text(encoding="utf-8"), flags=re.M)
    return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_every_alert_runbook_section_justifies_its_for():
    """Each alert's section says why it waits as long as it does (`**`for: 10m`:**` and the
    reasons), with the duration the rule has: a `for:` changed without its reasons fails here."""
    sections = runbook_sections()
    for r in _alert_rules():
        text = sections[r["alert"]]
        assert f"**`for: {r['for']}`:**" in text, (
            f"{r['alert']}: its runbook section does not justify `for: {r['for']}`"
        )
        others = set(re.findall(r"\*\*`for: (\w+)`:\*\*", text)) - {r["for"]}
        assert not others, f"{r['alert']}: its runbook section justifies another `for:` ({others})"


def test_every_runbook_url_anchor_is_a_heading_in_runbooks_md():
    headings = re.findall(r"^## (.+)$", RUNBOOKS.read_text(encoding="utf-8"), flags=re.M)
    anchors = {github_slug(h) for h in headings}
    for r in _alert_rules():
        anchor = r["annotations"]["runbook_url"].removeprefix(RUNBOOK_PREFIX)
        assert anchor in anchors, f"{r['alert']}: #{anchor} is no heading in docs/runbooks.md"
    # and no runbook section for an alert that does not exist
    assert {h.strip() for h in headings} == EXPECTED_ALERTS


def test_prometheus_config_jobs_rules_and_alertmanager():
    cfg = _yaml(PROM_DIR / "prometheus.yml")
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    targets = {name: j["static_configs"][0]["targets"] for name, j in jobs.items()}
    # The engine listens on loopback only: its page comes through the sidecar's /engine/metrics.
    # The sidecar's own page from its probe port: the client port's leaves the per-tenant series out.
    assert targets == {
        "palmyra-sidecar": ["sidecar:8081"],
        "palmyra-engine": ["sidecar:8080"],
        "npu-exporter": ["npu-exporter:8082"],
    }
    paths = {name: j.get("metrics_path", "/metrics") for name, j in jobs.items()}
    assert paths == {"palmyra-sidecar": "/metrics", "palmyra-engine": "/engine/metrics", "npu-exporter": "/metrics"}
    # One replica, one `instance` in both jobs (the Alertmanager groups and inhibits by it): the
    # sidecar job's series carry the client address its engine job scrapes.
    assert [sc.get("labels") for sc in jobs["palmyra-sidecar"]["static_configs"]] == [{"instance": "sidecar:8080"}]
    matched = [p for pattern in cfg["rule_files"] for p in PROM_DIR.glob(pattern)]
    assert matched == [RULES], "rule_files must be relative to the config and match the rules file"
    # No external labels: Prometheus attaches them to everything it sends anywhere (the runbook
    # base is a recording rule instead).
    assert "external_labels" not in cfg["global"]
    # Alerts go to the Compose service `alertmanager` (tests/static/test_containers_compose.py
    # holds the name and port to the service), through the v2 API, the only one Prometheus 3 has.
    [am] = cfg["alerting"]["alertmanagers"]
    assert am == {"static_configs": [{"targets": ["alertmanager:9093"]}]}


def test_local_prometheus_points_at_the_alertmanager_it_is_given():
    base = _yaml(PROM_DIR / "prometheus.yml")
    alone = local_prometheus.render_config(base, local_prometheus.scrape_targets(["127.0.0.1:1"]))
    assert "alerting" not in alone, "no Alertmanager given: nothing to resolve `alertmanager` here"
    sent = local_prometheus.render_config(base, {}, alertmanagers=["127.0.0.1:9093"])
    assert sent["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}
    assert base["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]


# ------------------------------------------------------------------------------- Alertmanager
def _amtool_check(config: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    exe = alertmanager.binary("amtool")
    return subprocess.run([exe, "check-config", str(path)], capture_output=True, text=True, timeout=60)


def test_amtool_checks_the_alertmanager_config(tmp_path):
    """The shipped config as this machine's Alertmanager takes it: as it is from 0.26 on, with the
    webhook URL file's content written into `url` before (Debian 12's 0.25 predates url_file)."""
    config = alertmanager.shipped()
    [hook] = alertmanager.webhooks(config)
    assert hook == {"url_file": "/run/secrets/alertmanager-webhook-url", "send_resolved": True}
    url_file = tmp_path / "alertmanager-webhook-url"
    url_file.write_text("https://hooks.example/palmyra\n", encoding="utf-8")
    amtool_version = alertmanager.version(alertmanager.binary("amtool"))
    out = _amtool_check(alertmanager.for_version(config, url_file, amtool_version), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    print(f"amtool {'.'.join(map(str, amtool_version))}: {out.stdout.strip().splitlines()[0]}")
    if amtool_version < alertmanager.URL_FILE_SINCE:  # what the substitution stands in for
        assert _amtool_check(config, tmp_path).returncode != 0, "0.25 refuses url_file: the substitution is needed"
    # Routing as documented: one group per alert and replica; critical repeats sooner.
    route = config["route"]
    assert route["group_by"] == ["alertname", "job", "instance"] and route["receiver"] == "webhook"
    [critical] = route["routes"]
    assert critical["matchers"] == ['severity="critical"']
    assert _seconds(critical["repeat_interval"]) < _seconds(route["repeat_interval"])


def _seconds(duration: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def test_the_commented_receiver_examples_are_valid(tmp_path):
    text = (MON / "alertmanager" / "alertmanager.yml").read_text(encoding="utf-8")
    block = re.search(r"# BEGIN EXAMPLE receivers\n(.*?)\n\s*# END EXAMPLE receivers", text, flags=re.S)
    assert block, "the example receivers' markers"
    examples = yaml.safe_load("\n".join(line.strip().removeprefix("# ") for line in block.group(1).splitlines()))
    assert [e["name"] for e in examples] == ["email", "slack"]
    for example in examples:  # secrets from files, like the webhook's URL
        [kind] = [k for k in example if k.endswith("_configs")]
        assert any(key.endswith("_file") for key in example[kind][0]), example
    config = alertmanager.shipped()
    config["receivers"] += examples
    url_file = tmp_path / "url"
    url_file.write_text("https://hooks.example/palmyra", encoding="utf-8")
    for name in ("alertmanager-smtp-password", "alertmanager-slack-webhook-url"):
        assert f"/run/secrets/{name}" in block.group(1)
    version = alertmanager.version(alertmanager.binary("amtool"))
    out = _amtool_check(alertmanager.for_version(config, url_file, version), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_alertmanager_inhibitions_name_real_alerts():
    config = alertmanager.shipped()
    names = {
        m.split("=", 1)[1].strip('"')
        for r in config["inhibit_rules"]
        for m in r["source_matchers"] + r["target_matchers"]
        if m.startswith("alertname=")
    }
    assert names and names <= EXPECTED_ALERTS, names - EXPECTED_ALERTS


def test_slo_constants_agree_between_rules_and_dashboard():
    service = dq.load("palmyra-service.json")
    variables = {v["name"]: v for v in service["templating"]["list"]}
    for var, record in (("ttft_slo", "palmyra:slo_ttft_p99_seconds"), ("itl_slo", "palmyra:slo_itl_p99_seconds")):
        vector = re.fullmatch(r"vector\(([\d.]+)\)", _recorded(record)["expr"].strip())
        assert vector, f"{record} is a constant vector(...)"
        constant = vector.group(1)
        assert variables[var]["type"] in {"textbox", "constant"}
        assert float(variables[var]["query"]) == float(constant), var


TENANT_TOKENS = "job_tenant_kind:palmyra_tenant_tokens:increase1h"


def test_tenant_tokens_month_query_is_the_one_the_unit_tests_check():
    """The README's "tokens per tenant over a month" queries are the ones promtool checks against
    known totals, with three hours standing in for the month (the subquery's 1h step included:
    without it the overlapping hourly windows are summed once per evaluation)."""
    readme = (MON / "README.md").read_text(encoding="utf-8")
    documented = re.findall(r"```promql\n(.+?)\n```", readme, flags=re.S)
    tested = {t["expr"] for case in _yaml(UNIT_TESTS)["tests"] for t in case.get("promql_expr_test", [])}
    month = [q for q in documented if "[30d" in q]
    assert len(month) == 2 and any(TENANT_TOKENS + "[30d:1h]" in q for q in month), documented
    for query in month:
        assert query.replace("[30d", "[3h") in tested, f"not checked by {UNIT_TESTS.name}: {query}"
    # evaluated like every other group: an interval of its own over the 5-minute lookback (1h, say)
    # would leave most of the subquery's hourly steps without a sample
    group = next(g for g in _yaml(RULES)["groups"] if any(r.get("record") == TENANT_TOKENS for r in g["rules"]))
    assert "interval" not in group


# ----------------------------------------------------------------------------------- Grafana
def test_grafana_provisioning():
    ds = _yaml(MON / "grafana" / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert [(d["type"], d["uid"], d["url"]) for d in ds] == [("prometheus", "prometheus", "http://prometheus:9090")]
    providers = _yaml(MON / "grafana" / "provisioning" / "dashboards" / "palmyra.yml")["providers"]
    assert [(p["type"], p["options"]["path"]) for p in providers] == [("file", "/var/lib/grafana/dashboards")]
    on_disk = sorted(p.name for p in (MON / "grafana" / "dashboards").glob("*.json"))
    assert on_disk == sorted(DASHBOARD_FILES)


def test_dashboard_json_is_the_generators_output():
    for name, build in generator.DASHBOARDS.items():
        committed = (MON / "grafana" / "dashboards" / name).read_text(encoding="utf-8")
        assert committed == generator.render(build), f"{name} differs: run monitoring/grafana/generate_dashboards.py"


def test_dashboard_uids_unique():
    dashboards = [dq.load(n) for n in DASHBOARD_FILES]
    uids = [d["uid"] for d in dashboards]
    assert len(set(uids)) == len(uids) and all(uids)
    for d in dashboards:
        ids = [p["id"] for p in d["panels"]]
        assert len(set(ids)) == len(ids), d["uid"]


def _walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield path + "/" + k, k, v
            yield from _walk(v, path + "/" + k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_dashboard_structure(name):
    d = dq.load(name)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "instance" in variables
    if name != "palmyra-npu.json":
        assert "model" in variables  # the NPU exporter knows chips, not served models
    # No hard-coded datasource anywhere: every datasource reference is the variable.
    for where, key, value in _walk(d):
        if key == "datasource" and where != "/templating/list[0]/datasource":
            assert value == DS_REF, f"{name}{where}: {value!r}"
    panels = [p for p in d["panels"] if p["type"] != "row"]
    used: set[str] = set()
    for p in panels:
        assert p["datasource"] == DS_REF, p["title"]
        exprs = [t.get("expr", "").strip() for t in p.get("targets", [])]
        assert exprs and all(exprs), f"{p['title']}: every panel needs targets with an expr"
        for expr in exprs:
            assert not re.search(r"\bvector\s*\(", expr), f"{p['title']}: vector() fills missing data in"
            assert not re.search(r"\bor\s+on\s*\(", expr), f"{p['title']}: `or on()` fills missing data in"
            assert not re.search(r"\bor\s+[\d.]", expr), f"{p['title']}: `or <number>` fills missing data in"
            if re.search(r"\bor\b", expr):
                assert any(new in expr and old in expr for new, old in RENAMED), (
                    f"{p['title']}: `or` is allowed only to join a renamed vLLM metric: {expr}"
                )
            used |= dq.variables_used(expr)
    for v in variables.values():
        if v["type"] == "query":
            used |= dq.variables_used(v["definition"])
    undefined = used - set(variables) - GRAFANA_BUILTINS
    assert not undefined, f"undefined variables {undefined}"
    unused = set(variables) - used - {"datasource"}
    assert not unused, f"variables no query uses: {unused}"


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_dashboard_shows_every_required_metric(name):
    text = " ".join(q.expr for q in dq.panel_queries(dq.load(name)))
    missing = [m for m in REQUIRED_METRICS[name] if not re.search(re.escape(m) + r"(?![\w:])", text)]
    assert not missing, f"{name} does not chart {missing}"


# ------------------------------------------------------- a real Prometheus on the NPU fixture
def strip_timestamps(page: str) -> str:
    """Drop the sample timestamps of the recorded page (they are from long ago: Prometheus would
    store the samples at that time, outside any query window)."""
    out = []
    for line in page.splitlines():
        if line.startswith("#") or not line.strip():
            out.append(line)
            continue
        head, sep, rest = line.rpartition("}")
        if not sep:
            head, _, rest = line.partition(" ")
        out.append(f"{head}{sep} {rest.split()[0]}")
    return "\n".join(out) + "\n"


def mark_unhealthy(page: str, chip: str) -> str:
    """The same page with one chip's health status set to 0 (what a faulty 910B reports)."""
    return re.sub(rf'^(npu_chip_info_health_status\{{id="{chip}",[^}}]*\}}) 1$', r"\1 0", page, flags=re.M)


class _Exporter(BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, bytes]] = {}  # shared on purpose: the test sets the pages every handler serves

    def do_GET(self):  # http.server's name
        body = self.pages.get(self.path)
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def npu_prometheus(data_dir):
    assert shutil.which("prometheus"), "prometheus missing: install Debian's `prometheus` package"
    page = strip_timestamps((data_dir / "fixtures" / "npu-exporter-metrics.txt").read_text(encoding="utf-8"))
    faulty = mark_unhealthy(page, "3")
    assert faulty != page
    handler = type("Exporter", (_Exporter,), {"pages": {"/metrics": page.encode(), "/faulty/metrics": faulty.encode()}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    addr = f"127.0.0.1:{server.server_address[1]}"
    cfg = local_prometheus.render_config(
        _yaml(PROM_DIR / "prometheus.yml"),
        {"npu-exporter": [addr], "npu-exporter-faulty": [addr]},
        extra_jobs=[{"job_name": "npu-exporter-faulty", "metrics_path": "/faulty/metrics"}],
    )
    prom = local_prometheus.LocalPrometheus(cfg)
    try:
        prom.start()
        wait_until(
            lambda: prom.targets_up() == {"npu-exporter": True, "npu-exporter-faulty": True},
            30,
            "both npu-exporter targets up",
        )
        wait_until(lambda: _values(prom, "count(npu_chip_info_health_status)") == [16.0], 30, "16 chips scraped")
        yield prom
    finally:
        prom.stop()
        server.shutdown()
        server.server_close()


def _values(prom, expr: str) -> list[float]:
    body = prom.query(expr)
    assert body["status"] == "success", f"{expr}: {body}"
    data = body["data"]
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(s["value"][1]) for s in data["result"]]


def test_every_dashboard_query_parses_in_prometheus(npu_prometheus):
    # Prometheus has no offline PromQL parser CLI: its query API is the parser.
    values = {"instance": ".*", "model": ".*", "npu": ".*", "ttft_slo": "2", "itl_slo": "0.25", "__rate_interval": "1m"}
    checked = 0
    for name in DASHBOARD_FILES:
        d = dq.load(name)
        exprs = [q.expr for q in dq.panel_queries(d)]
        exprs += [dq.label_values_selector(v["definition"]) for v in d["templating"]["list"] if v["type"] == "query"]
        for expr in exprs:
            body = npu_prometheus.query(dq.substitute(expr, values))
            assert body["status"] == "success", f"{name}: {expr}\n{body.get('error')}"
            checked += 1
    assert checked > 60


def test_npu_dashboard_panels_have_data(npu_prometheus):
    values = {"instance": ".*", "npu": ".*"}
    empty = []
    queries = dq.panel_queries(dq.load("palmyra-npu.json"))
    for q in queries:
        if not _values(npu_prometheus, dq.substitute(q.expr, values)):
            empty.append(q.key)
    assert not empty, f"NPU panels without data on npu-exporter's page: {empty}"
    assert len(queries) >= 9


def test_npu_variable_queries_find_the_chips(npu_prometheus):
    d = dq.load("palmyra-npu.json")
    npu_var = next(v for v in d["templating"]["list"] if v["name"] == "npu")
    selector = dq.substitute(dq.label_values_selector(npu_var["definition"]), {"instance": ".*"})
    ids = {s["metric"]["id"] for s in npu_prometheus.query(selector)["data"]["result"]}
    assert ids == {str(i) for i in range(8)}


def test_alert_rules_load_and_evaluate_ok(npu_prometheus):
    def rules():
        groups = npu_prometheus.api("rules")["data"]["groups"]
        flat = [r for g in groups for r in g["rules"]]
        return flat if flat and all(r["health"] == "ok" for r in flat) else None

    flat = wait_until(rules, 30, "every rule evaluated with health ok")
    assert {r["name"] for r in flat if r["type"] == "alerting"} == EXPECTED_ALERTS
    assert len(flat) == sum(len(g["rules"]) for g in _yaml(RULES)["groups"])


def test_npu_unhealthy_alert_goes_pending_with_full_runbook_url(npu_prometheus):
    def pending():
        alerts = npu_prometheus.api("alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "PalmyraNPUUnhealthy"]

    alerts = wait_until(pending, 30, "PalmyraNPUUnhealthy to become active")
    # only the chip marked unhealthy, not the 15 healthy ones; `for: 2m` holds it in pending
    assert [(a["labels"]["job"], a["labels"]["id"], a["state"]) for a in alerts] == [
        ("npu-exporter-faulty", "3", "pending")
    ]
    # the link in full, its base read from the recording rule by the `query` template function
    assert alerts[0]["annotations"]["runbook_url"] == runbook_base() + "#palmyranpuunhealthy"


# --- the engine's page, scraped through the sidecar ------------------------------------------------

# A stand-in sidecar's two pages (one series each, in the exposition format the real ones use);
# the same path against the real sidecar and vLLM is tests/engine/test_prometheus_live.py.
SIDECAR_PAGE = b"# TYPE palmyra_ready gauge\npalmyra_ready 1\n"
# The same sidecar's probe port: its full page, per-tenant series included.
PROBE_PAGE = (
    SIDECAR_PAGE + b'# TYPE palmyra_tenant_limit gauge\npalmyra_tenant_limit{limit="max_concurrent",tenant="a"} 2\n'
)
ENGINE_PAGE = (
    b'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0",model_name="palmyra-mini"} 3\n'
)
ENGINE_JOB = re.compile(r'up\{job=~"([^"]*palmyra-engine)"\}')


def test_local_prometheus_scrapes_the_engine_page_through_the_sidecar():
    """The deployed config, with a sidecar's addresses filled in the way local_prometheus does it:
    the engine job reads the client port's /engine/metrics, the sidecar job the probe port's
    /metrics (the full page), both under the client address as `instance`, and the engine-down
    alert's `up` selector watches the engine job."""
    assert shutil.which("prometheus"), "prometheus missing: install Debian's `prometheus` package"
    handler = type("Sidecar", (_Exporter,), {"pages": {"/metrics": SIDECAR_PAGE, "/engine/metrics": ENGINE_PAGE}})
    probe_handler = type("Probe", (_Exporter,), {"pages": {"/metrics": PROBE_PAGE}})
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (handler, probe_handler)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    addr, probe = (f"127.0.0.1:{server.server_address[1]}" for server in servers)
    [engine_job] = set(ENGINE_JOB.findall(RULES.read_text(encoding="utf-8")))
    targets = local_prometheus.scrape_targets([addr], probes=[probe])
    cfg = local_prometheus.render_config(_yaml(PROM_DIR / "prometheus.yml"), targets)
    try:
        with local_prometheus.LocalPrometheus(cfg) as prom:
            wait_until(
                lambda: prom.targets_up() == {"palmyra-sidecar": True, "palmyra-engine": True},
                30,
                "the sidecar scraped under both jobs",
            )
            wait_until(
                lambda: _values(prom, 'vllm:num_requests_waiting{job="palmyra-engine"}') == [3.0],
                30,
                "the engine's series under the engine job",
            )
            wait_until(lambda: _values(prom, "palmyra_tenant_limit") == [2.0], 30, "the probe port's page")
            assert _values(prom, f'up{{job=~"{engine_job}", instance="{addr}"}}') == [1.0]
            # The probe port's page, under the replica's client address: one instance per replica.
            assert _values(prom, f'palmyra_ready{{job="palmyra-sidecar", instance="{addr}"}}') == [1.0]
            assert _values(prom, f'up{{job="palmyra-sidecar", instance="{addr}"}}') == [1.0]
            assert _values(prom, f'{{instance="{probe}"}}') == []
            # Each job holds its own page only.
            assert _values(prom, '{__name__=~"vllm:.+", job="palmyra-sidecar"}') == []
            assert _values(prom, '{__name__=~"palmyra_.+", job="palmyra-engine"}') == []
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
