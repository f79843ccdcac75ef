"""The front end settings, one group of palmyra_serve.settings.Settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode

from palmyra_serve.settings.basics import BASIC
from palmyra_serve.settings.keys import split_keys


class FrontEndSettings(BaseSettings):
    """Front end: the sidecar's listeners, the bounds on what a client connection may cost, and the
    client keys."""

    # --- listeners ----------------------------------------------------------------------------
    host: str = Field(
        "127.0.0.1", description="Address the sidecar (or engine, for `engine`) listens on.", json_schema_extra=BASIC
    )
    port: int = Field(
        8080,
        description="Sidecar port: clients, /health, /ready, /metrics (without the per-tenant series).",
        json_schema_extra=BASIC,
    )
    probe_port: int = Field(
        0,
        description="A second sidecar port, the operator's, never published: only /health, /health/sidecar, /ready "
        "and the full /metrics (the per-tenant series included, which the client port leaves out), with its own "
        "small connection cap outside max_connections, for the kubelet's probes, Compose's healthcheck and "
        "Prometheus; 0: none (then no port shows the per-tenant series).",
        json_schema_extra=BASIC,
    )

    # --- bounds on a client connection --------------------------------------------------------
    max_connections: int = Field(
        384,
        description="Open client connections (in flight + queued + 64 spare for probes and idle keep-alive); at it "
        "a new one takes the place of the one idle the longest (never-authenticated ones first), and with none "
        "idle gets a canned 503 and is closed at once.",
    )
    max_request_line_bytes: int = Field(
        8 * 1024, description="Longest request line (method, target, version); longer is 414."
    )
    max_header_bytes: int = Field(
        16 * 1024, description="Largest request head (request line and headers); larger is 431."
    )
    max_header_count: int = Field(100, description="Most request header fields; more is 431.")
    header_timeout_s: float = Field(
        8.0,
        description="A connection's request head must arrive within this (from connect or the first byte); "
        "else closed.",
    )
    body_timeout_s: float = Field(30.0, description="A request body must arrive within this; else 408.")
    write_timeout_s: float = Field(
        10.0,
        description="A client that reads nothing while its send buffer is full for this long is disconnected "
        "(its slot freed, the engine stops generating for it).",
    )
    max_body_bytes: int = Field(
        768 * 1024,
        description="Largest request body; larger is 413. 768 KiB is 6x the largest prompt max-model-len 8192 admits "
        "(about 128 KiB of JSON); every in-flight and queued request may hold one (see the memory budget).",
    )

    # --- client keys --------------------------------------------------------------------------
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Client API keys, comma-separated. Keys are required unless auth is disabled.",
        json_schema_extra=BASIC,
    )
    api_keys_file: Path | None = Field(
        None,
        description="File of API keys, one per line or comma-separated (a mounted secret); "
        "re-read when it changes (checked once a second).",
        json_schema_extra=BASIC,
    )
    auth_disabled: bool = Field(
        False,
        description="Serve without API keys. Only an explicit true turns auth off (the local quick start sets it).",
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return split_keys(value)
        return value
