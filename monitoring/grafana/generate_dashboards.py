#!/usr/bin/env python3
"""Writes the Grafana dashboards in monitoring/grafana/dashboards/ (the JSON files are committed),
and the same bytes into k8s/monitoring/dashboards/ for the Kubernetes monitoring component.

    python3 monitoring/grafana/generate_dashboards.py          # rewrite the JSON files
    python3 monitoring/grafana/generate_dashboards.py --check  # exit 1 if any copy differs

Why a generator: three dashboards share the datasource variable, panel boilerplate and layout,
and hand-edited Grafana JSON drifts. tests/static/test_monitoring.py proves the committed JSON
equals this script's output, tests/static/test_k8s_monitoring.py the k8s copies. Standard library
only.

Why two copies: kustomize loads files only from inside a kustomization's root unless every user
passes `--load-restrictor LoadRestrictionsNone` (which `kubectl apply -k`, Argo CD and Flux do not
by default), so the k8s component cannot read monitoring/ in place. This script stays the one
source: both directories are its output, and --check (run by the tests) fails on either drifting.

Rules every query here follows (the tests check them): the datasource is the `datasource`
variable, never a fixed uid; nothing fills missing data in (no `or vector(0)`): an empty panel
must look empty. Two vLLM renames are covered with a plain union of the old and new name.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards"
# Inside the monitoring component's kustomization root (see the docstring).
REPO = Path(__file__).resolve().parents[2]
K8S_OUT = REPO / "k8s" / "monitoring" / "dashboards"
OUT_DIRS = (OUT, K8S_OUT)
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
LLM_ROUTES = 'route=~"completions|chat_completions"'

# SLO defaults, the same numbers as the palmyra:slo_* recording rules in the alert rules file.
TTFT_SLO_S = "2"
ITL_SLO_S = "0.25"


# ----------------------------------------------------------------------------- building blocks
def target(expr: str, legend: str = "", fmt: str | None = None) -> dict:
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "range": True}
    if fmt:
        t["format"] = fmt
    return t


def quantiles(
    metric: str, sel: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.95, 0.99), window: str = RATE
) -> list[dict]:
    grouping = f"le, {by}" if by else "le"
    suffix = f" {{{{{by}}}}}" if by else ""
    return [
        target(
            f"histogram_quantile({q}, sum by ({grouping}) (rate({metric}_bucket{{{sel}}}[{window}])))",
            f"p{int(q * 100)}{suffix}",
        )
        for q in qs
    ]


def panel(
    title: str,
    targets: list[dict],
    *,
    kind: str = "timeseries",
    unit: str = "short",
    desc: str = "",
    w: int = 8,
    h: int = 8,
    mappings: list | None = None,
    thresholds: list | None = None,
) -> dict:
    defaults: dict = {"unit": unit}
    if mappings:
        defaults["mappings"] = mappings
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    p = {
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {},
        "targets": targets,
    }
    if kind == "timeseries":
        p["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif kind == "heatmap":
        p["options"] = {"calculate": False, "yAxis": {"unit": unit}, "cellGap": 1}
    elif kind == "stat":
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
        }
    return p


def bool_map(one: str, zero: str) -> list:
    return [
        {
            "type": "value",
            "options": {
                "1": {"text": one, "color": "green", "index": 0},
                "0": {"text": zero, "color": "red", "index": 1},
            },
        }
    ]


def query_var(name: str, label: str, query: str, multi: bool = True) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-query"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": True,
        "allValue": ".*",
        "current": {},
        "options": [],
        "hide": 0,
    }


def textbox_var(name: str, label: str, value: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "textbox",
        "query": value,
        "current": {"text": value, "value": value},
        "options": [],
        "hide": 0,
    }


DATASOURCE_VAR = {
    "name": "datasource",
    "label": "Data source",
    "type": "datasource",
    "query": "prometheus",
    "current": {},
    "options": [],
    "regex": "",
    "hide": 0,
}


def dashboard(uid: str, title: str, variables: list[dict], rows: list[tuple[str, list[dict]]]) -> dict:
    panels, y, pid = [], 0, 1
    for row_title, row_panels in rows:
        panels.append(
            {
                "type": "row",
                "title": row_title,
                "id": pid,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for p in row_panels:
            w, h = p["gridPos"]["w"], p["gridPos"]["h"]
            if x + w > 24:
                x, y, row_h = 0, y + row_h, 0
            p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
            p["id"] = pid
            for i, t in enumerate(p["targets"]):
                t["refId"] = chr(ord("A") + i)  # every query its own letter, however many a panel has
            panels.append(p)
            pid, x, row_h = pid + 1, x + w, max(row_h, h)
        y += row_h
    return {
        "uid": uid,
        "title": title,
        "tags": ["palmyra"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "links": [
            {
                "type": "dashboards",
                "tags": ["palmyra"],
                "asDropdown": False,
                "includeVars": False,
                "keepTime": True,
                "title": "Palmyra",
            }
        ],
        "templating": {"list": [DATASOURCE_VAR, *variables]},
        "panels": panels,
    }


# ------------------------------------------------------------------------------- the dashboards
def service() -> dict:
    s = 'instance=~"$instance"'
    llm = f"{s}, {LLM_ROUTES}"
    m = 'model_name=~"$model"'
    s5xx, s4xx = s + ', status=~"5.."', s + ', status=~"4.."'
    rate = lambda metric, sel: f"rate({metric}{{{sel}}}[{RATE}])"  # noqa: E731
    return dashboard(
        "palmyra-service",
        "Palmyra / Service",
        [
            query_var("instance", "Sidecar", "label_values(palmyra_ready, instance)"),
            query_var("model", "Model", "label_values(vllm:num_requests_running, model_name)"),
            textbox_var("ttft_slo", "TTFT p99 SLO (s)", TTFT_SLO_S),
            textbox_var("itl_slo", "ITL p99 SLO (s)", ITL_SLO_S),
        ],
        [
            (
                "Readiness",
                [
                    panel(
                        "Readiness",
                        [target(f"palmyra_ready{{{s}}}", "{{instance}}")],
                        kind="state-timeline",
                        desc="/ready of each replica: ready only after warmup succeeded and the engine still answers.",
                        mappings=bool_map("ready", "not ready"),
                    ),
                    panel(
                        "Engine live",
                        [target(f"palmyra_engine_live{{{s}}}", "{{instance}}")],
                        kind="state-timeline",
                        desc="The sidecar's judgement of its engine (/health): "
                        "0 = dead or hung past the liveness budget.",
                        mappings=bool_map("live", "dead/hung"),
                    ),
                    panel(
                        "Warmup phase",
                        [target(f"palmyra_warmup_phase{{{s}}}", "{{instance}} {{phase}}")],
                        kind="state-timeline",
                        desc="1 marks the phase each replica is in.",
                        mappings=[
                            {
                                "type": "value",
                                "options": {
                                    "1": {"text": "current", "color": "blue"},
                                    "0": {"text": "-", "color": "transparent"},
                                },
                            }
                        ],
                    ),
                    panel(
                        "Warmup runs",
                        [
                            target(
                                f"sum by (instance, outcome) (palmyra_warmup_runs_total{{{s}}})",
                                "{{instance}} {{outcome}}",
                            )
                        ],
                        kind="stat",
                        desc="Warmup runs since the sidecar started, by outcome.",
                    ),
                    panel(
                        "Warmup duration",
                        [target(f"palmyra_warmup_duration_seconds{{{s}}}", "{{instance}}")],
                        kind="stat",
                        unit="s",
                        desc="Duration of the last successful warmup.",
                    ),
                    panel(
                        "Time to ready by phase",
                        [
                            target(f"palmyra_startup_phase_seconds{{{s}}}", "{{instance}} {{phase}}"),
                            target(f"sum without (phase) (palmyra_startup_phase_seconds{{{s}}})", "{{instance}} total"),
                        ],
                        kind="stat",
                        unit="s",
                        desc="Last start-up of each replica: engine_up (sidecar start or readiness lost, to the engine "
                        "serving the model), warmup (to ready), total = time to ready. Empty until a first start-up "
                        "finished. Cold vs warm figures: benchmarks/results/startup.md.",
                    ),
                    panel(
                        "Weights",
                        [target(f"palmyra_stand_in_weights{{{s}}}", "{{instance}}")],
                        kind="stat",
                        desc="Random stand-in weights answer with noise: never in production.",
                        mappings=[
                            {
                                "type": "value",
                                "options": {
                                    "1": {"text": "random stand-in", "color": "red"},
                                    "0": {"text": "real", "color": "green"},
                                },
                            }
                        ],
                    ),
                ],
            ),
            (
                "Traffic",
                [
                    panel(
                        "Requests by status",
                        [target(f"sum by (status) ({rate('palmyra_requests_total', s)})", "{{status}}")],
                        unit="reqps",
                    ),
                    panel(
                        "Requests by route",
                        [target(f"sum by (route) ({rate('palmyra_requests_total', s)})", "{{route}}")],
                        unit="reqps",
                    ),
                    panel(
                        "Error ratio",
                        [
                            target(
                                f"sum({rate('palmyra_requests_total', s5xx)})"
                                f" / sum({rate('palmyra_requests_total', s)})",
                                "5xx",
                            ),
                            target(
                                f"sum({rate('palmyra_requests_total', s4xx)})"
                                f" / sum({rate('palmyra_requests_total', s)})",
                                "4xx",
                            ),
                        ],
                        unit="percentunit",
                        desc="Share of all requests; no line means no such responses.",
                    ),
                    panel(
                        "Rejections by reason",
                        [target(f"sum by (reason) ({rate('palmyra_rejections_total', s)})", "{{reason}}")],
                        unit="reqps",
                        desc="The sidecar's own refusals: 429 admission (slo_unreachable, queue_full, queue_timeout), "
                        "413 body, 400 max_tokens, 401 auth, 503 draining.",
                    ),
                    panel(
                        "Upstream errors by kind",
                        [target(f"sum by (kind) ({rate('palmyra_upstream_errors_total', s)})", "{{kind}}")],
                        unit="reqps",
                    ),
                    panel(
                        "In-flight, queued and limit",
                        [
                            target(f"sum by (instance) (palmyra_in_flight_requests{{{s}}})", "in flight {{instance}}"),
                            target(f"sum by (instance) (palmyra_queued_requests{{{s}}})", "queued {{instance}}"),
                            target(f"sum by (instance) (palmyra_concurrency_limit{{{s}}})", "limit {{instance}}"),
                            target(f"sum by (instance) (palmyra_concurrency_ceiling{{{s}}})", "ceiling {{instance}}"),
                        ],
                        desc="Admission: the limit on requests in the engine (adaptive by default) under its ceiling.",
                    ),
                    panel(
                        "Queue wait",
                        [
                            *quantiles("palmyra_queue_wait_seconds", s, qs=(0.5, 0.99)),
                            target(f"max(palmyra_queue_max_wait_seconds{{{s}}})", "max allowed"),
                        ],
                        unit="s",
                        desc="Wait for an admission slot (0 when one was free); adaptive admission bounds it "
                        "by what the TTFT SLO leaves.",
                    ),
                ],
            ),
            (
                "Latency (as clients see it)",
                [
                    panel("Time to first token", quantiles("palmyra_time_to_first_token_seconds", llm), unit="s"),
                    panel("End-to-end latency", quantiles("palmyra_request_duration_seconds", llm), unit="s"),
                    panel(
                        "Inter-token latency",
                        quantiles("palmyra_inter_token_latency_seconds", llm),
                        unit="s",
                        desc="Per request: mean gap between streamed chunks.",
                    ),
                    panel(
                        "TTFT p99 / SLO",
                        [
                            target(
                                "histogram_quantile(0.99, sum by (le) ("
                                f"{rate('palmyra_time_to_first_token_seconds_bucket', llm)}))"
                                " / $ttft_slo",
                                "p99 / SLO",
                            )
                        ],
                        kind="stat",
                        unit="percentunit",
                        desc="Above 100% the TTFT SLO (variable ttft_slo, default 2 s) is missed.",
                        thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
                    ),
                    panel(
                        "ITL p99 / SLO",
                        [
                            target(
                                "histogram_quantile(0.99, sum by (le) ("
                                f"{rate('palmyra_inter_token_latency_seconds_bucket', llm)}))"
                                " / $itl_slo",
                                "p99 / SLO",
                            )
                        ],
                        kind="stat",
                        unit="percentunit",
                        desc="Above 100% the inter-token SLO (variable itl_slo, default 0.25 s) is missed.",
                        thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
                    ),
                    panel(
                        "Tokens per second",
                        [
                            target(f"sum by (route) ({rate('palmyra_output_tokens_total', s)})", "output {{route}}"),
                            target(f"sum by (route) ({rate('palmyra_prompt_tokens_total', s)})", "prompt {{route}}"),
                        ],
                        unit="short",
                    ),
                ],
            ),
            (
                "Canary and engine load",
                [
                    panel(
                        "Canary latency",
                        quantiles("palmyra_canary_latency_seconds", s, by="instance", qs=(0.5, 0.99), window="5m"),
                        unit="s",
                        desc="One-token generation the sidecar sends while idle. 5m window: canaries are sparse.",
                    ),
                    panel(
                        "Canary failures",
                        [
                            target(
                                f"sum by (instance) (increase(palmyra_canary_failures_total{{{s}}}[5m]))",
                                "{{instance}}",
                            )
                        ],
                    ),
                    panel(
                        "Engine running / waiting",
                        [
                            target(f"sum by (model_name) (vllm:num_requests_running{{{m}}})", "running {{model_name}}"),
                            target(f"sum by (model_name) (vllm:num_requests_waiting{{{m}}})", "waiting {{model_name}}"),
                        ],
                        desc="All engines serving $model (details on the Engine dashboard).",
                    ),
                ],
            ),
            (
                # Tenants come from the tenants file (plus `default`): the series are bounded by it.
                # Limits live in that file, not in metrics: headroom shows as tokens per minute
                # against each tenant's tokens_per_minute, and as quota refusals.
                "Tenants",
                [
                    panel(
                        "Tokens per minute by tenant",
                        [target(f"sum by (tenant) ({rate('palmyra_tenant_tokens_total', s)}) * 60", "{{tenant}}")],
                        desc="Prompt + completion tokens per minute, as the engine counted them, over the replicas "
                        "shown: compare with each tenant's tokens_per_minute in the tenants file.",
                    ),
                    panel(
                        "Requests by tenant and status class",
                        [
                            target(
                                f"sum by (tenant) ({rate('palmyra_tenant_requests_total', s + cls)})",
                                "{{tenant}} " + name,
                            )
                            for name, cls in (
                                ("2xx", ', status=~"2.."'),
                                ("4xx", ', status=~"4.."'),
                                ("5xx", ', status=~"5.."'),
                            )
                        ],
                        unit="reqps",
                        desc="Requests that passed the key check, by tenant (keys outside the tenants file are "
                        "`default`) and the status they ended with; 4xx includes the quota and admission refusals.",
                    ),
                    panel(
                        "Refusals by tenant and reason",
                        [
                            target(
                                f"sum by (tenant, reason) ({rate('palmyra_tenant_refusals_total', s)})",
                                "{{tenant}} {{reason}}",
                            )
                        ],
                        unit="reqps",
                        desc="Quota: rate_limit_requests, rate_limit_tokens, tenant_concurrency (the tenant is at its "
                        "limits). Overload: queue_full, queue_timeout, slo_unreachable (the service is at capacity). "
                        "Any other reason is the request's own fault.",
                    ),
                    panel(
                        "Quota store",
                        [target(f"palmyra_quota_store_up{{{s}}}", "{{instance}}")],
                        kind="state-timeline",
                        w=12,
                        desc="Shared: the replicas count every tenant limit together in Redis. Local share: Redis "
                        "does not answer, this replica enforces limit / PALMYRA_QUOTA_REPLICAS alone. "
                        "Only replicas with a shared store configured.",
                        mappings=bool_map("shared", "local share"),
                    ),
                    panel(
                        "Quota store errors",
                        [
                            target(
                                f"sum by (instance) ({rate('palmyra_quota_store_errors_total', s)})",
                                "{{instance}}",
                            )
                        ],
                        unit="ops",
                        w=12,
                        desc="Quota calls to Redis that failed or timed out; each one puts the replica on its "
                        "local share for at least a second.",
                    ),
                ],
            ),
        ],
    )


def engine() -> dict:
    e = 'instance=~"$instance", model_name=~"$model"'
    rate = lambda metric: f"rate({metric}{{{e}}}[{RATE}])"  # noqa: E731
    by_inst = lambda metric: f"sum by (instance) ({rate(metric)})"  # noqa: E731
    return dashboard(
        "palmyra-engine",
        "Palmyra / Engine",
        [
            query_var("instance", "Engine", "label_values(vllm:num_requests_running, instance)"),
            query_var("model", "Model", 'label_values(vllm:num_requests_running{instance=~"$instance"}, model_name)'),
        ],
        [
            (
                "Load",
                [
                    panel(
                        "Running / waiting",
                        [
                            target(f"sum by (instance) (vllm:num_requests_running{{{e}}})", "running {{instance}}"),
                            target(f"sum by (instance) (vllm:num_requests_waiting{{{e}}})", "waiting {{instance}}"),
                        ],
                    ),
                    panel(
                        "KV-cache usage",
                        [
                            target(
                                f"vllm:kv_cache_usage_perc{{{e}}} or vllm:gpu_cache_usage_perc{{{e}}}", "{{instance}}"
                            )
                        ],
                        unit="percentunit",
                        desc="vllm:kv_cache_usage_perc; "
                        "vLLM releases older than both engines here called it vllm:gpu_cache_usage_perc.",
                    ),
                    panel(
                        "Preemptions",
                        [target(by_inst("vllm:num_preemptions_total"), "{{instance}}")],
                        unit="ops",
                        desc="Requests whose KV cache was dropped for lack of blocks (recomputed later).",
                    ),
                    panel(
                        "Prefix-cache hit ratio",
                        [
                            target(
                                f"{by_inst('vllm:prefix_cache_hits_total')}"
                                f" / {by_inst('vllm:prefix_cache_queries_total')}",
                                "{{instance}}",
                            )
                        ],
                        unit="percentunit",
                        desc="Share of prompt tokens found in the prefix cache.",
                    ),
                    panel(
                        "Token throughput",
                        [
                            target(by_inst("vllm:prompt_tokens_total"), "prompt {{instance}}"),
                            target(by_inst("vllm:generation_tokens_total"), "generation {{instance}}"),
                        ],
                        unit="short",
                    ),
                    panel(
                        "Finish reasons",
                        [
                            target(
                                f"sum by (finished_reason) ({rate('vllm:request_success_total')})",
                                "{{finished_reason}}",
                            )
                        ],
                        unit="reqps",
                    ),
                ],
            ),
            (
                "Latency (inside the engine)",
                [
                    panel("Engine time to first token", quantiles("vllm:time_to_first_token_seconds", e), unit="s"),
                    panel(
                        "Inter-token latency",
                        [
                            target(
                                f"histogram_quantile({q}, sum by (le) ("
                                f"{rate('vllm:inter_token_latency_seconds_bucket')}"
                                f" or {rate('vllm:time_per_output_token_seconds_bucket')}))",
                                f"p{int(q * 100)}",
                            )
                            for q in (0.5, 0.95, 0.99)
                        ],
                        unit="s",
                        desc="vllm:inter_token_latency_seconds; older vLLM: vllm:time_per_output_token_seconds.",
                    ),
                    panel("Engine end-to-end latency", quantiles("vllm:e2e_request_latency_seconds", e), unit="s"),
                    panel("Queue time", quantiles("vllm:request_queue_time_seconds", e, qs=(0.5, 0.99)), unit="s"),
                    panel("Prefill time", quantiles("vllm:request_prefill_time_seconds", e, qs=(0.5, 0.99)), unit="s"),
                    panel("Decode time", quantiles("vllm:request_decode_time_seconds", e, qs=(0.5, 0.99)), unit="s"),
                ],
            ),
            (
                "Request shapes",
                [
                    panel(
                        "Prompt length",
                        [
                            target(
                                f"sum by (le) (increase(vllm:request_prompt_tokens_bucket{{{e}}}[{RATE}]))",
                                "{{le}}",
                                fmt="heatmap",
                            )
                        ],
                        kind="heatmap",
                        w=12,
                        desc="Prompt tokens per request (distribution over time).",
                    ),
                    panel(
                        "Generation length",
                        [
                            target(
                                f"sum by (le) (increase(vllm:request_generation_tokens_bucket{{{e}}}[{RATE}]))",
                                "{{le}}",
                                fmt="heatmap",
                            )
                        ],
                        kind="heatmap",
                        w=12,
                        desc="Generated tokens per request.",
                    ),
                ],
            ),
        ],
    )


def npu() -> dict:
    n = 'instance=~"$instance", id=~"$npu"'
    chip = "{{instance}} NPU {{id}}"
    return dashboard(
        "palmyra-npu",
        "Palmyra / NPU",
        [
            query_var("instance", "npu-exporter", "label_values(npu_chip_info_health_status, instance)"),
            query_var("npu", "NPU", 'label_values(npu_chip_info_health_status{instance=~"$instance"}, id)'),
        ],
        [
            (
                "Health",
                [
                    panel(
                        "Health",
                        [target(f"npu_chip_info_health_status{{{n}}}", chip)],
                        kind="state-timeline",
                        desc="npu-exporter: 1 = healthy.",
                        mappings=bool_map("healthy", "unhealthy"),
                    ),
                    panel(
                        "Error code",
                        [target(f"npu_chip_info_error_code{{{n}}}", chip)],
                        kind="stat",
                        desc="Driver error code of each chip (0 = none).",
                    ),
                    panel(
                        "NPUs per host",
                        [target('machine_npu_nums{instance=~"$instance"}', "{{instance}}")],
                        kind="stat",
                    ),
                    panel(
                        "Network health",
                        [target(f"npu_chip_info_network_status{{{n}}}", chip)],
                        kind="state-timeline",
                        desc="Chip network (RoCE/HCCS) health as npu-exporter reports it.",
                    ),
                ],
            ),
            (
                "Load",
                [
                    panel("AI core utilization", [target(f"npu_chip_info_utilization{{{n}}}", chip)], unit="percent"),
                    panel(
                        "HBM used / total",
                        [
                            target(f"npu_chip_info_hbm_used_memory{{{n}}}", "used " + chip),
                            target(f"npu_chip_info_hbm_total_memory{{{n}}}", "total " + chip),
                        ],
                        unit="decmbytes",
                    ),
                    panel("AI core frequency", [target(f"npu_chip_info_aicore_current_freq{{{n}}}", chip)], unit="MHz"),
                ],
            ),
            (
                "Thermals and power",
                [
                    panel("Temperature", [target(f"npu_chip_info_temperature{{{n}}}", chip)], unit="celsius", w=12),
                    panel("Power", [target(f"npu_chip_info_power{{{n}}}", chip)], unit="watt", w=12),
                ],
            ),
        ],
    )


DASHBOARDS = {"palmyra-service.json": service, "palmyra-engine.json": engine, "palmyra-npu.json": npu}


def render(build: Callable[[], dict]) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, build in DASHBOARDS.items():
        text = render(build)
        for path in (out / name for out in OUT_DIRS):
            if check:
                if not path.is_file() or path.read_text(encoding="utf-8") != text:
                    stale.append(str(path.relative_to(REPO)))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date (run generate_dashboards.py):", ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
