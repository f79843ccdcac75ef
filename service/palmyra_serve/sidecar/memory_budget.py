"""The sidecar's worst-case memory, by construction: what the front-end limits allow at most.

Every term is a product of settings the sidecar enforces, so the sum is a bound, not an estimate
of typical use. docs/configuration.md shows this table for the defaults (scripts/gen_docs.py), and
tests/unit/test_edge_front_parts.py checks that it fits the sidecar container's memory limit in
k8s/base/deployment.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass

from palmyra_serve.settings import Settings

KIB = 1024
MIB = 1024 * 1024
# Idle RSS measured at 61-62 MB (docs/reliability.md, soak), plus room for the allocator's slack.
BASE_BYTES = 96 * MIB
# uvicorn, httptools and asyncio objects of one open connection (protocol, transport, timers,
# scope), and per header field the (name, value) tuple and its two bytes objects.
CONNECTION_OVERHEAD_BYTES = 16 * KIB
HEADER_FIELD_BYTES = 128
# Per request in flight: the client transport's write buffer up to its high-water mark (64 KiB,
# then pause_writing) and one read from the engine (up to 64 KiB).
IN_FLIGHT_BUFFER_BYTES = 128 * KIB
# The kernel's socket buffers of one client connection, which cgroup v2 charges to the container:
# the receive buffer at Linux's default size (tcp_rmem[1]; it grows only for a reader that keeps
# up, and uvicorn stops reading only while a body waits to be consumed), and the unsent queue that
# front_end.py caps with TCP_NOTSENT_LOWAT.
SOCKET_BUFFER_BYTES = 128 * KIB + 16 * KIB
# orjson's objects for the one body being checked at a time (the check is synchronous): a JSON
# list of small integers expands about 8x (an 8-byte pointer per 1-2 byte element).
PARSE_EXPANSION = 8


@dataclass(frozen=True)
class Term:
    what: str
    count: int
    each: int

    @property
    def total(self) -> int:
        return self.count * self.each


def body_budget(settings: Settings) -> int:
    """Request bodies held at once, over all connections (enforced by the relay: 503 beyond)."""
    return (settings.max_in_flight + settings.max_queue) * settings.max_body_bytes


def terms(settings: Settings) -> list[Term]:
    head = 2 * settings.max_header_bytes + settings.max_header_count * HEADER_FIELD_BYTES + CONNECTION_OVERHEAD_BYTES
    return [
        Term("process at rest (Python, uvicorn, FastAPI, metrics)", 1, BASE_BYTES),
        Term(
            "request bodies: (max_in_flight + max_queue) x max_body_bytes",
            settings.max_in_flight + settings.max_queue,
            settings.max_body_bytes,
        ),
        Term("the body being parsed for the cost check", 1, PARSE_EXPANSION * settings.max_body_bytes),
        Term(
            "open connections: max_connections x (2 x max_header_bytes + fields + overhead)",
            settings.max_connections,
            head,
        ),
        Term(
            "kernel socket buffers: max_connections x (receive buffer + unsent queue)",
            settings.max_connections,
            SOCKET_BUFFER_BYTES,
        ),
        Term(
            "relay buffers: max_in_flight x (client write buffer + engine read)",
            settings.max_in_flight,
            IN_FLIGHT_BUFFER_BYTES,
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
