"""The sidecar's access log as a test reads it back: durations measured inside the sidecar."""

from __future__ import annotations

import json


def access_durations_s(server_log: str, status: int, error: str | None = None) -> list[float]:
    """Durations the sidecar itself logged for requests answered with `status` (and, when given,
    its own error code `error`): time inside the sidecar, free of the delays a busy 2-core machine
    adds between a client and the socket (seconds, at times)."""
    out = []
    for line in server_log.splitlines():
        if '"palmyra.access"' in line:
            record = json.loads(line)
            if record["status"] == status and (error is None or record.get("error") == error):
                out.append(record["duration_ms"] / 1000)
    return out
