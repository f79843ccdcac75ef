"""A request's end, published once: the tenant's slot given back first (whatever fails after), the
request counted and timed, its trace ended, its access-log line written (the record's rendering),
its tenant's series counted, and its lease settled with what it cost."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.observability.access_log import AccessLog
from palmyra_serve.sidecar.relay.context import RequestContext
from palmyra_serve.sidecar.tenants.tenancy import Tenancy

if TYPE_CHECKING:
    from palmyra_serve.sidecar.observability.tracing import Tracing

log = logging.getLogger("palmyra.sidecar")


class Publisher:
    def __init__(self, metrics: SidecarMetrics, access_log: AccessLog, tenancy: Tenancy) -> None:
        self.metrics = metrics
        self.access_log = access_log
        self.tenancy = tenancy

    async def finish(self, ctx: RequestContext, tracing: Tracing | None) -> None:
        record = ctx.record
        self.tenancy.release(ctx.lease)
        took = time.perf_counter() - ctx.t0
        self.metrics.count_request(record.route, record.status)
        self.metrics.duration.labels(record.route).observe(took)
        record.duration_s = took
        if record.trace is not None:
            try:
                record.trace.finish(record, ctx.t0 + took)
            except Exception:  # a failure of tracing costs its spans, never the request
                log.exception("tracing a request failed", extra={"fields": {"request_id": record.request_id}})
        self.access_log.write(time.time(), record.log_fields())
        if ctx.tenant is not None:
            self.metrics.count_tenant(ctx.tenant.name, record.status, record.prompt_tokens, record.completion_tokens)
        await self.tenancy.settle(ctx.lease, record)
