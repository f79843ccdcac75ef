"""The request record's one rendering, the access log: the keys it writes are the documented ones
(ACCESS_LOG_KEYS, from which docs/api.md is generated), each only when it applies."""

from __future__ import annotations

from palmyra_serve.sidecar.relay.record import ACCESS_LOG_KEYS, RequestRecord


def test_a_record_with_every_field_set_writes_every_documented_key_in_order() -> None:
    record = RequestRecord(
        "rid",
        "POST",
        "/v1/completions",
        "completions",
        status=499,
        duration_s=1.5,
        queue_wait_s=0.25,
        ttft_s=0.1,
        token_gap_s=0.02,
        client_paced=True,
        completion_tokens=7,
        prompt_tokens=5,
        error="queue_full",
        upstream_error="engine_timeout",
        upstream_detail="no answer in 3 s",
        truncated=True,
        usage_missing=True,
        engine_error_event=True,
        client_disconnected=True,
        tenant="search",
        trace_id="0af7651916cd43dd8448eb211c80319c",
    )
    fields = record.log_fields()
    assert list(fields) == list(ACCESS_LOG_KEYS)
    assert fields["queue_ms"] == 250.0 and fields["duration_ms"] == 1500.0 and fields["itl_ms"] == 20.0


def test_a_bare_record_writes_only_what_always_applies() -> None:
    fields = RequestRecord("rid", "GET", "/v1/models", "models", status=200).log_fields()
    assert list(fields) == ["request_id", "method", "path", "route", "status", "duration_ms"]
    assert set(fields) <= set(ACCESS_LOG_KEYS)
