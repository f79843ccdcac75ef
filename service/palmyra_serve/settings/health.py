"""The health settings, one group of palmyra_serve.settings.Settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings


class HealthSettings(BaseSettings):
    """Health: liveness, the warmup before the first ready, the canary and golden checks while ready,
    the drain."""

    # --- liveness -----------------------------------------------------------------------------
    health_poll_interval_s: float = Field(2.0, description="How often the sidecar polls the engine's /health.")
    liveness_budget_s: float = Field(
        30.0, description="Engine dead or hung for longer than this fails /health (the engine container is restarted)."
    )

    # --- warmup -------------------------------------------------------------------------------
    warmup_long_prompt_share: float = Field(0.5, description="Longest warmup prompt as a share of max-model-len.")
    warmup_request_timeout_s: float = Field(
        300.0, description="Longest a single warmup generation may take (a long prompt on a slow CPU engine)."
    )
    warmup_burst: int = Field(4, description="Concurrent requests in the warmup burst.")
    warmup_max_backoff_s: float = Field(30.0, description="Warmup retries back off up to this long.")

    # --- canary -------------------------------------------------------------------------------
    canary_interval_s: float = Field(15.0, description="Idle seconds between one-token canary generations.")
    canary_timeout_s: float = Field(10.0, description="A canary slower than this counts as failed.")
    canary_failures_to_unready: int = Field(2, description="Consecutive canary failures that flip /ready to 503.")

    # --- golden check -------------------------------------------------------------------------
    golden_file: Path | None = Field(
        None,
        description="The checkpoint's fp32 golden reference (`palmyra-serve golden`): its prompts are replayed "
        "greedily before the replica first reports ready and every PALMYRA_GOLDEN_INTERVAL_S after, and a "
        "token that differs where the reference is not near a tie is output drift.",
    )
    golden_interval_s: float = Field(
        300.0,
        gt=0,
        description="Seconds between two replays of the golden prompts while ready. A due replay first waits "
        "until no relayed request is in flight, for at most one more interval (then it runs anyway).",
    )
    golden_max_share: float = Field(
        0.02,
        gt=0,
        le=1,
        description="The largest share of the replica's time the golden replays may take while ready: the next "
        "replay is due no sooner than the last one's seconds divided by this share after it began (0.02: a 6 s "
        "replay keeps a 300 s interval, a 90 s one waits 75 min). Measured: docs/validate-and-bench.md.",
    )
    golden_tolerance: float = Field(
        0.25,
        ge=0,
        description="Top-2 log-probability margin (nats) of the reference up to which a different token is a "
        "near-tie, not drift: bf16 moved the full-size stand-in's log-probabilities by at most 0.057 against fp32, "
        "so a flip needs a margin under 0.115 (docs/validate-and-bench.md).",
    )
    golden_action: Literal["unready", "report"] = Field(
        "unready",
        description="On output drift: unready (/ready 503, reason output_drift) or report (metrics and log only).",
    )
    golden_digest: Literal["refuse", "warn"] = Field(
        "refuse",
        description="When the served weights' SHA-256 differs from the one PALMYRA_GOLDEN_FILE was recorded for "
        "(or cannot be computed): refuse (the engine does not start, exit status 2) or warn (it starts, and says "
        "so). The engine hashes the *.safetensors files on each start: 2.3 s for 3.5 GB already in the page cache.",
    )

    # --- drain --------------------------------------------------------------------------------
    drain_timeout_s: float = Field(30.0, description="On SIGTERM, how long in-flight requests may take to finish.")
    # 10 s: Kubernetes drops a terminating pod from EndpointSlices within about a second, but every
    # kube-proxy (iptables/IPVS resync) and gateway (Envoy EDS, ingress controllers) applies that on
    # its own schedule, seconds more on a busy cluster. A replica takes minutes to start, so 10 s of
    # extra serving per stopped pod costs nothing; raise it behind slow load balancers.
    drain_propagation_s: float = Field(
        10.0,
        description="On SIGTERM, seconds /ready says 503 while new requests are still served (endpoints and "
        "gateways stop routing here meanwhile); then new requests get 503 and in-flight ones get "
        "the drain timeout. 0 where nothing routes by readiness (Compose, `up`).",
    )
