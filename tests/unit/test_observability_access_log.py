"""observability/access_log.py: one JSON line per request in the shape of every other log line,
buffered and flushed within FLUSH_S with no further write to trigger it, and silent above info."""

from __future__ import annotations

import asyncio


def test_access_log_writes_one_json_line_per_request_buffered_briefly():
    import io
    import json
    import logging

    from palmyra_serve.sidecar.observability import access_log

    logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.INFO)
    try:

        async def scenario() -> list[str]:
            stream = io.StringIO()
            log = access_log.AccessLog(stream)
            log.write(1796400000.25, {"request_id": "a", "status": 200})
            log.write(1796400000.5, {"request_id": "b", "status": 429})
            assert stream.getvalue() == ""  # held back, not a write per request
            async with asyncio.timeout(5):  # flushed within FLUSH_S, with no further write to trigger it
                while stream.getvalue().count("\n") < 2:
                    await asyncio.sleep(access_log.FLUSH_S / 5)
            return stream.getvalue().splitlines()

        lines = [json.loads(line) for line in asyncio.run(scenario())]
    finally:
        logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.NOTSET)
    assert [(e["request_id"], e["status"]) for e in lines] == [("a", 200), ("b", 429)]
    assert lines[0]["ts"] == "2026-12-04T16:00:00.250Z" and lines[1]["ts"].endswith(":00.500Z")
    assert {k: lines[0][k] for k in ("level", "logger", "msg")} == {
        "level": "info",
        "logger": "palmyra.access",
        "msg": "request",
    }


def test_access_log_is_silent_above_info():
    import io
    import logging

    from palmyra_serve.sidecar.observability import access_log

    logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.WARNING)
    try:
        stream = io.StringIO()
        log = access_log.AccessLog(stream)
        log.write(0.0, {"request_id": "a"})
        log.flush()
    finally:
        logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.NOTSET)
    assert stream.getvalue() == ""
