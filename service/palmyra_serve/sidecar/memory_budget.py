"""The sidecar's worst-case memory, by construction: what the front-end limits allow at most.

Every term is a product of settings the sidecar enforces, so the sum is a bound, not an estimate
of typical use. docs/configuration.md shows this table for the defaults (scripts/gen_docs.py), and
tests check that it fits the sidecar container's memory limit for the settings each deployment
gives it: k8s/base/deployment.yaml (tests/unit/test_memory_budget.py), every k8s overlay
(tests/static/test_k8s.py) and docker-compose.yml (tests/static/test_containers_compose.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission.plan import AdmissionPlan
from palmyra_serve.sidecar.core.engine_errors import MAX_ERROR_BODY
from palmyra_serve.sidecar.edge.protocol import NOTSENT_LOWAT, PROBE_MAX_CONNECTIONS
from palmyra_serve.sidecar.relay.sse import MAX_EVENT_BYTES
from palmyra_serve.sidecar.relay.usage import MAX_GAP_BYTES, MAX_USAGE_BYTES
from palmyra_serve.sidecar.upstream.metrics_page import MAX_PAGE_BYTES, PAGE_COPIES
from palmyra_serve.sidecar.upstream.pool import HIGH_WATER, RCVBUF_CHARGED, READ_BYTES

KIB = 1024
MIB = 1024 * 1024
# Idle RSS measured at 61-62 MB (docs/reliability.md, soak), plus room for the allocator's slack.
BASE_BYTES = 96 * MIB
# uvicorn, httptools and asyncio objects of one open connection (protocol, transport, timers,
# scope), and per header field the (name, value) tuple and its two bytes objects.
CONNECTION_OVERHEAD_BYTES = 16 * KIB
HEADER_FIELD_BYTES = 128
# The client transport's write buffer: uvloop pauses the writer above 64 KiB, and uvicorn waits
# for it to drain before the next write, so it holds at most this plus one chunk.
CLIENT_WRITE_HIGH_WATER = 64 * KIB
# The kernel's socket buffers of one client connection, which cgroup v2 charges to the container:
# the receive buffer at Linux's default size (tcp_rmem[1]; it grows only for a reader that keeps
# up, and uvicorn stops reading only while a body waits to be consumed), and the unsent queue that
# edge/protocol.py caps with TCP_NOTSENT_LOWAT.
SOCKET_BUFFER_BYTES = 128 * KIB + NOTSENT_LOWAT
# orjson's objects for the one value being parsed at a time (every parse is synchronous: the cost
# check, an engine error body being reshaped, one read of SSE events joined to the unfinished
# one): a JSON list of small integers expands about 8x (an 8-byte pointer per 1-2 byte element).
PARSE_EXPANSION = 8
# What the relay holds of one engine read at most: the pool pauses reading above HIGH_WATER, and
# one read adds at most READ_BYTES.
CHUNK_BYTES = HIGH_WATER + READ_BYTES
# Per relayed request: the engine connection's unread body, the chunk being written to the client,
# and the client's write buffer (high water plus that chunk's unsent copy).
RELAY_BYTES = CHUNK_BYTES + CHUNK_BYTES + CLIENT_WRITE_HIGH_WATER + CHUNK_BYTES
# An engine error is read instead of streamed: its unread rest, its pieces, their join and the
# reshaped answer. Never more than a stream's buffers (tests/unit/test_memory_budget.py).
ERROR_PATH_BYTES = CHUNK_BYTES + 3 * MAX_ERROR_BODY + CLIENT_WRITE_HIGH_WATER
# Per generation, besides the relay buffers: the SSE account's unfinished event (relay/sse.py skips an
# event that outgrows it), or a JSON body's usage scanner (a response is one or the other). Their
# work on a read (joining it to the unfinished event, parsing its events) is synchronous: one at
# a time, in the parse term.
ACCOUNTING_BYTES = max(MAX_EVENT_BYTES, MAX_USAGE_BYTES + MAX_GAP_BYTES)
# The largest page the control app writes whole into a connection's write buffer: the sidecar's
# /metrics with a series for every route and every status an engine can answer (about 403 KiB;
# 28 KiB at rest), /openapi.json (36 KiB). /engine/metrics is written in slices, less than this.
# tests/unit/test_memory_budget.py measures them. A relaying connection's buffers are larger.
CONTROL_PAGE_BYTES = 448 * KIB


@dataclass(frozen=True)
class Term:
    what: str
    count: int
    each: int

    @property
    def total(self) -> int:
        return self.count * self.each


def in_flight(settings: Settings) -> int:
    """Generations admitted to the engine at once: the admission plan's ceiling (admission/plan.py),
    max_in_flight in fixed mode; in adaptive mode PALMYRA_ADMISSION_MAX_LIMIT, else --max-num-seqs or
    vLLM's default for the platform, which the limit may reach whatever it starts at (the ceiling
    the engine reports later is never above it)."""
    return AdmissionPlan.of(settings).ceiling


def relays(settings: Settings) -> int:
    """Requests relayed to the engine at once. Where every relayed request takes a slot (fixed
    mode), at most the ceiling; where generations alone do (adaptive: a model list or a
    tokenization is not gated), each open client connection may be relaying one."""
    plan = AdmissionPlan.of(settings)
    return min(plan.ceiling, settings.max_connections) if plan.gate_all else settings.max_connections


def connections(settings: Settings) -> int:
    """Client connections open at once: the cap, plus the probe port's own when it is on."""
    return settings.max_connections + (PROBE_MAX_CONNECTIONS if settings.probe_port else 0)


def non_relaying(settings: Settings) -> int:
    """Connections not counted among the relays, each of which may be writing a control page: the
    client connections beyond the relays (fixed mode), and every probe-port connection (it serves
    /metrics, whole, as well as the probes' small answers)."""
    probe = PROBE_MAX_CONNECTIONS if settings.probe_port else 0
    return settings.max_connections - relays(settings) + probe


def body_budget(settings: Settings) -> int:
    """Request bodies held at once, over all connections (enforced by the relay: 503 beyond)."""
    return AdmissionPlan.of(settings).body_budget(settings.max_body_bytes)


def terms(settings: Settings) -> list[Term]:
    head = 2 * settings.max_header_bytes + settings.max_header_count * HEADER_FIELD_BYTES + CONNECTION_OVERHEAD_BYTES
    parsed = max(settings.max_body_bytes, MAX_ERROR_BODY, CHUNK_BYTES + MAX_EVENT_BYTES)
    return [
        Term("process at rest (Python, uvicorn, FastAPI, metrics)", 1, BASE_BYTES),
        Term(
            "request bodies: (in flight + max_queue) x max_body_bytes",
            in_flight(settings) + settings.max_queue,
            settings.max_body_bytes,
        ),
        Term("the one JSON value being parsed (body, error body or a read of SSE events)", 1, PARSE_EXPANSION * parsed),
        Term(
            "open connections: connections x (2 x max_header_bytes + fields + overhead)",
            connections(settings),
            head,
        ),
        Term(
            "kernel socket buffers: connections x (receive buffer + unsent queue)",
            connections(settings),
            SOCKET_BUFFER_BYTES,
        ),
        Term(
            "relay buffers: relays x (engine read buffer + chunk in hand + client write buffer)",
            relays(settings),
            RELAY_BYTES,
        ),
        Term("engine connections' kernel receive buffers: relays x SO_RCVBUF", relays(settings), RCVBUF_CHARGED),
        Term(
            "accounting: in flight x (SSE event being assembled, or usage scanner)",
            in_flight(settings),
            ACCOUNTING_BYTES,
        ),
        Term(
            "control pages being written: connections beyond the relays (probe port's included) x largest control page",
            non_relaying(settings),
            CONTROL_PAGE_BYTES,
        ),
        Term(
            "the engine's metrics page: served, the one before it, a fetch (counted twice: it grows)",
            PAGE_COPIES,
            MAX_PAGE_BYTES,
        ),
    ]


def worst_case(settings: Settings) -> int:
    return sum(t.total for t in terms(settings))


def markdown(settings: Settings, limit_bytes: int) -> str:
    rows = ["| What | Count | Each | Total |", "|---|---:|---:|---:|"]
    for t in terms(settings):
        rows.append(f"| {t.what} | {t.count} | {t.each / KIB:,.1f} KiB | {t.total / MIB:,.1f} MiB |")
    total = worst_case(settings)
    rows.append(f"| **worst case** | | | **{total / MIB:,.1f} MiB** |")
    rows.append(f"| sidecar container limit (k8s/base/deployment.yaml) | | | {limit_bytes / MIB:,.0f} MiB |")
    return "\n".join(rows) + "\n"


_UNITS = {"Ki": KIB, "Mi": MIB, "Gi": 1024 * MIB, "K": 1000, "M": 1000**2, "G": 1000**3}


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity ("512Mi", "1G", "1048576") in bytes."""
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * _UNITS[suffix])
    return int(text)


def container_limit(deployment: dict, container: str) -> int:
    """The memory limit of one container of a parsed Deployment manifest, in bytes."""
    for spec in deployment["spec"]["template"]["spec"]["containers"]:
        if spec["name"] == container:
            return quantity_bytes(str(spec["resources"]["limits"]["memory"]))
    raise KeyError(container)
