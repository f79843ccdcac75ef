"""The observability settings, one group of palmyra_serve.settings.Settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings


class ObservabilitySettings(BaseSettings):
    """Observability: logs and traces (docs/tracing.md)."""

    log_level: str = Field("info", description="Log level of the JSON logs.")
    up_log_dir: Path = Field(Path(".palmyra/logs"), description="`up` writes the engine's and sidecar's logs here.")
    otlp_traces_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces URL (e.g. http://otel-collector:4318/v1/traces): the sidecar exports its "
        "spans there and the engine is started with --otlp-traces-endpoint set to the same URL; unset: no "
        "tracing, and none of its cost.",
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of the traces the sidecar starts that are recorded; a client's traceparent keeps its "
        "own sampled flag (the engine follows the sidecar's decision).",
    )

    @field_validator("otlp_traces_endpoint")
    @classmethod
    def _an_http_url(cls, value: str | None) -> str | None:
        # Checked at start: a host:port (the gRPC exporter's form) would only fail at each export.
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL of an OTLP/HTTP traces receiver, got {value!r}")
        return value
