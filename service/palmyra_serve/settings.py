"""The one settings class: every knob, read from PALMYRA_* environment variables.

CLI flags override the environment (cli.py passes them as keyword arguments). Nothing here is
built at import time: callers construct Settings() when they start.

An empty variable counts as unset (the default applies): docker-compose.yml hands every setting
to the containers as `PALMYRA_<NAME>: ${PALMYRA_<NAME>:-}`, so one the env file leaves out arrives empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from palmyra_serve import HUB_MODEL_ID, SERVED_MODEL_NAME


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PALMYRA_", extra="ignore", env_ignore_empty=True)

    # --- where things are ---------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address the sidecar (or engine, for `engine`) listens on.")
    port: int = Field(
        8080, description="Sidecar port: clients, /health, /ready, /metrics (without the per-tenant series)."
    )
    probe_port: int = Field(
        0,
        description="A second sidecar port, the operator's, never published: only /health, /health/sidecar, /ready "
        "and the full /metrics (the per-tenant series included, which the client port leaves out), with its own "
        "small connection cap outside max_connections, for the kubelet's probes, Compose's healthcheck and "
        "Prometheus; 0: none (then no port shows the per-tenant series).",
    )
    engine_url: str = Field("http://127.0.0.1:8000", description="Where the sidecar reaches the engine.")
    engine_port: int = Field(8000, description="Port the engine listens on (internal only).")
    engine_api_key: str | None = Field(
        None,
        description="Pod-local secret: the engine's /v1 requires it (passed to vLLM as VLLM_API_KEY) "
        "and the sidecar sends it.",
    )

    # --- model ----------------------------------------------------------------------------
    model: str = Field(HUB_MODEL_ID, description="Hub id or local directory of the weights to serve.")
    model_dir: Path = Field(
        Path("models/palmyra-mini"), description="Where resolved weights live (containers: /models/palmyra-mini)."
    )
    model_source: Literal["auto", "huggingface", "modelscope", "local", "stand-in"] = Field(
        "auto",
        description="Where weights come from: auto uses a local directory, else the hub (HF_ENDPOINT), "
        "else the stand-in where allowed.",
    )
    stand_in_size: Literal["tiny", "full"] = Field("tiny", description="Stand-in shape when no weights can be had.")
    allow_stand_in: bool | None = Field(
        None,
        description="Random stand-in weights (loudly) when no real ones can be had; unset: allowed on CPU only, "
        "refused on accelerators (ascend, cuda), where a replica must serve the real model.",
    )
    served_model_name: str = Field(SERVED_MODEL_NAME, description="Model name clients send and /v1/models lists.")

    # --- engine launcher ------------------------------------------------------------------
    platform: Literal["auto", "ascend", "cuda", "cpu"] = Field(
        "auto", description="Engine platform; auto detects torch-npu, then CUDA, else CPU."
    )
    dtype: str = Field(
        "bfloat16", description="Engine dtype (bf16 everywhere: fp16 gives garbage for Qwen2.5 weights on Ascend)."
    )
    max_model_len: int = Field(8192, description="Engine --max-model-len (the reference adaptation's value).")
    gpu_memory_utilization: float = Field(0.85, description="Share of NPU/GPU memory vLLM may use (seed: 0.85).")
    tensor_parallel_size: int = Field(1, description="Engine --tensor-parallel-size.")
    enforce_eager: bool = Field(False, description="Skip graph capture / torch.compile (faster start, slower decode).")
    npu_devices: str | None = Field(
        None,
        description="The NPU(s) the engine uses, as `npu-smi info` numbers them on the host (e.g. '3', or '0,1' "
        "for tensor parallelism); exported as ASCEND_RT_VISIBLE_DEVICES. Compose passes /dev/davinci<N> for one "
        "N and numbers it 0 inside the container; on Kubernetes the device plugin chooses: leave it unset.",
    )
    doctor: Literal["stop", "warn", "off"] = Field(
        "stop",
        description="Ascend: `palmyra-serve engine` runs doctor's checks before vLLM; stop: not starting when one "
        "is certain to fail (no device node, a device this user may not open, ...), warn: log only, off: skip.",
    )
    cpu_kvcache_gib: int = Field(4, description="CPU engine KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE).")
    engine_extra_args: str = Field("", description="Extra vLLM server arguments, appended verbatim (shell-split).")
    tool_call_parser: str = Field(
        "hermes",
        description="vLLM's tool-call parser (--enable-auto-tool-choice --tool-call-parser): hermes reads the "
        "<tool_call> JSON blocks Qwen2's chat template asks the model for; empty: no tool calling (vLLM refuses "
        "every request with tools).",
    )
    structured_outputs_backend: str = Field(
        "xgrammar",
        description="vLLM's structured-output backend (--structured-outputs-config.backend): xgrammar, the one "
        "the sidecar's structured-output bounds are measured on; vLLM's own default, auto, may pick another per "
        "request.",
    )
    structured_outputs_compact: bool = Field(
        True,
        description="Structured JSON without whitespace between tokens (--structured-outputs-config."
        "disable_any_whitespace): a small model otherwise fills a schema's whitespace until max_tokens runs out; "
        "xgrammar and guidance only.",
    )

    # --- sidecar: upstream ----------------------------------------------------------------
    connect_timeout_s: float = Field(5.0, description="Connecting to the engine; refused or slower is 503.")
    read_timeout_s: float = Field(120.0, description="Longest silence from the engine inside one request before 504.")

    # --- sidecar: admission (docs/admission.md) -------------------------------------------
    admission_mode: Literal["adaptive", "fixed"] = Field(
        "adaptive",
        description="adaptive: the limit on requests in the engine follows measured latency against the SLOs, "
        "under a ceiling read from the engine, and the queue holds only what can start within the TTFT SLO; "
        "fixed: max_in_flight, max_queue and queue_timeout_s as set.",
    )
    max_in_flight: int = Field(
        64, description="fixed mode: requests relayed to the engine at once; more wait in the queue."
    )
    max_queue: int = Field(256, description="Requests waiting for a slot (both modes: a hard cap); beyond that 429.")
    queue_timeout_s: float = Field(
        30.0, description="fixed mode: longest wait in the queue before 429 (adaptive derives it from slo_ttft_s)."
    )
    tokenize_max_in_flight: int = Field(
        4,
        ge=1,
        description="/tokenize and /detokenize relayed at once, in a gate of their own (both modes); more wait.",
    )
    tokenize_max_queue: int = Field(16, ge=0, description="/tokenize and /detokenize waiting; beyond that 429.")
    tokenize_queue_timeout_s: float = Field(
        5.0, gt=0, description="Longest a /tokenize or /detokenize waits for its gate before 429."
    )
    slo_ttft_s: float = Field(
        2.0, gt=0, description="Time-to-first-token objective (adaptive admission; bench/validate's)."
    )
    slo_itl_s: float = Field(0.25, gt=0, description="Mean inter-token gap objective (adaptive admission).")
    admission_min_limit: int = Field(2, description="adaptive: the lowest the limit goes.")
    admission_max_limit: int | None = Field(
        None,
        description="adaptive: the highest the limit goes; unset: from the engine at start, "
        "min(max-num-seqs, KV cache / admission_kv_tokens_per_request).",
    )
    admission_initial_limit: int | None = Field(
        None, description="adaptive: where the limit starts; unset: half the ceiling."
    )
    admission_kv_tokens_per_request: int = Field(
        2048, description="adaptive: KV-cache tokens one request is expected to hold (bounds the ceiling)."
    )
    admission_ttft_engine_share: float = Field(
        0.5, description="adaptive: share of slo_ttft_s the engine's own TTFT may use; the rest is queue."
    )
    admission_itl_share: float = Field(
        0.8, description="adaptive: the limit is cut when the ITL p90 passes this share of slo_itl_s."
    )
    admission_queue_headroom: float = Field(
        0.1, description="adaptive: share of slo_ttft_s kept out of the queue's wait (margin for the tail)."
    )
    admission_window_s: float = Field(1.0, description="adaptive: shortest interval between limit changes.")
    retry_after_max_s: int = Field(30, description="adaptive: cap on a computed Retry-After (429).")
    max_body_bytes: int = Field(
        768 * 1024,
        description="Largest request body; larger is 413. 768 KiB is 6x the largest prompt max-model-len 8192 admits "
        "(about 128 KiB of JSON); every in-flight and queued request may hold one (see the memory budget).",
    )
    max_tokens_cap: int | None = Field(
        None, description="Largest max_tokens / max_completion_tokens / min_tokens (400 beyond); unset: max-model-len."
    )
    max_choices: int = Field(
        8,
        description="Largest n (and best_of), and of prompts x n for a list of prompts: "
        "sequences per request (400 beyond).",
    )
    max_logprobs: int = Field(
        20, description="Largest logprobs / top_logprobs / prompt_logprobs (vLLM's own default cap)."
    )
    prompt_logprobs_max_tokens: int = Field(
        512,
        ge=0,
        description="Longest prompt (estimated tokens) for which prompt logprobs are served (prompt_logprobs, or "
        "echo with logprobs): each prompt position costs a log-softmax over the whole vocabulary.",
    )
    structured_max_repeat: int = Field(
        64,
        ge=0,
        description="Bounded repetitions a request's structured output may ask the grammar compiler to unroll "
        "(maxLength, minLength, {m,n} in patterns, regexes and grammars, summed): at 64, under 2 s of one "
        "compiler thread on a 2-core x86 host (docs/request-fields.md).",
    )
    structured_max_bytes: int = Field(
        16 * 1024, ge=0, description="Largest structured-output field (schema, regex, grammar, tools), serialised."
    )
    structured_max_choices: int = Field(1024, ge=0, description="Most entries of a choice list or a schema's enum.")
    structured_regex_grammar: bool = Field(
        True,
        description="Serve regex- and grammar-constrained output (structured_outputs.regex / .grammar, schema "
        "patterns stay); false refuses them with a 400.",
    )
    retry_after_s: int = Field(
        1, description="Retry-After seconds on 503 (and on 429 in fixed mode; adaptive computes it from the queue)."
    )

    # --- sidecar: front end (bounds on what a client connection may cost) ----------------
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

    # --- sidecar: auth, logs ----------------------------------------------------------------
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Client API keys, comma-separated. Keys are required unless auth is disabled."
    )
    api_keys_file: Path | None = Field(
        None,
        description="File of API keys, one per line or comma-separated (a mounted secret); "
        "re-read when it changes (checked once a second).",
    )
    auth_disabled: bool = Field(
        False,
        description="Serve without API keys. Only an explicit true turns auth off (the local quick start sets it).",
    )
    log_level: str = Field("info", description="Log level of the JSON logs.")
    up_log_dir: Path = Field(Path(".palmyra/logs"), description="`up` writes the engine's and sidecar's logs here.")

    # --- sidecar: tenants and quotas (docs/tenants.md) ---------------------------------------
    tenants_file: Path | None = Field(
        None,
        description="YAML file of named tenants: their keys as sha256 digests, their limits, weight and priority; "
        "re-read when it changes (an invalid new file is logged and the previous one kept). Keys from api_keys "
        "and api_keys_file belong to the tenant `default`.",
    )
    quota_reserve_tokens: int = Field(
        256,
        ge=0,
        description="Completion tokens a generation that sets no max_tokens reserves against its tenant's "
        "tokens per minute until its real usage is known.",
    )
    quota_redis_url: str | None = Field(
        None,
        description="Redis that holds every tenant's quota windows, shared by all replicas (redis:// or rediss:// "
        "for TLS; no password in it); unset: each replica counts alone (right for one replica).",
    )
    quota_redis_password_file: Path | None = Field(
        None, description="File holding the Redis password (a mounted secret)."
    )
    quota_redis_ca_file: Path | None = Field(None, description="CA bundle that verifies a rediss:// server.")
    quota_redis_timeout_s: float = Field(
        0.25, gt=0, description="Longest a quota call to Redis may take before this replica counts alone."
    )
    quota_redis_prefix: str = Field(
        "palmyra", description="Prefix of the Redis keys (one per deployment sharing a Redis)."
    )
    quota_replicas: int = Field(
        1,
        ge=1,
        description="Replicas sharing the limits: while Redis is unreachable each enforces 1/replicas of every "
        "tenant limit (set it to the replica count, or an autoscaler's maximum).",
    )
    priority_scheduling: bool = Field(
        False,
        description="Run the engine with --scheduling-policy priority and set every generation's priority to "
        "its tenant's (a client's own priority is replaced).",
    )

    # --- tracing (docs/tracing.md) ------------------------------------------------------------
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

    # --- sidecar: health, warmup, canary, drain ---------------------------------------------
    health_poll_interval_s: float = Field(2.0, description="How often the sidecar polls the engine's /health.")
    liveness_budget_s: float = Field(
        30.0, description="Engine dead or hung for longer than this fails /health (the engine container is restarted)."
    )
    warmup_long_prompt_share: float = Field(0.5, description="Longest warmup prompt as a share of max-model-len.")
    warmup_request_timeout_s: float = Field(
        300.0, description="Longest a single warmup generation may take (a long prompt on a slow CPU engine)."
    )
    warmup_burst: int = Field(4, description="Concurrent requests in the warmup burst.")
    warmup_max_backoff_s: float = Field(30.0, description="Warmup retries back off up to this long.")
    canary_interval_s: float = Field(15.0, description="Idle seconds between one-token canary generations.")
    canary_timeout_s: float = Field(10.0, description="A canary slower than this counts as failed.")
    canary_failures_to_unready: int = Field(2, description="Consecutive canary failures that flip /ready to 503.")
    golden_file: Path | None = Field(
        None,
        description="The checkpoint's fp32 golden reference (`palmyra-serve golden`): its prompts are replayed "
        "greedily before the replica first reports ready and every PALMYRA_GOLDEN_INTERVAL_S after, and a "
        "token that differs where the reference is not near a tie is output drift.",
    )
    golden_interval_s: float = Field(
        300.0, gt=0, description="Seconds between two replays of the golden prompts while ready."
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

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return split_keys(value)
        return value

    @field_validator("otlp_traces_endpoint")
    @classmethod
    def _an_http_url(cls, value: str | None) -> str | None:
        # Checked at start: a host:port (the gRPC exporter's form) would only fail at each export.
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL of an OTLP/HTTP traces receiver, got {value!r}")
        return value


def split_keys(text: str) -> list[str]:
    """The one format of API keys, in PALMYRA_API_KEYS and in a key file alike: separated by commas
    or newlines, surrounding blanks dropped, lines starting with # skipped."""
    keys: list[str] = []
    for line in text.splitlines():
        if not line.strip().startswith("#"):
            keys += [k.strip() for k in line.split(",") if k.strip()]
    return keys


# The one rule for keys that must not be used: the values the repository's examples carry (.env,
# compose/*.env, READMEs), the usual suspects, and anything short enough to guess. Client keys
# (sidecar/relay/auth.py), the engine key at sidecar start and the engine launcher all apply it.
MIN_KEY_CHARS = 8
KEY_RECIPE = "openssl rand -hex 32"
PLACEHOLDER_KEYS = frozenset(
    {
        "changeme",
        "change-me",
        "change_me",
        "replace-me",
        "replace_me",
        "replaceme",
        "your-key",
        "your-api-key",
        "your_api_key",
        "api-key",
        "apikey",
        "secret",
        "password",
        "example",
        "test",
        "key",
        "key1",
        "key2",
        "sk-xxx",
        "xxx",
        "todo",
        "none",
        "null",
        "unused",
        "change-me-engine-key",
        "change-me-client-key",
    }
)


def placeholder_key(key: str) -> bool:
    """True for a key that is a known placeholder, starts like one, or is shorter than MIN_KEY_CHARS."""
    low = key.lower()
    return (
        low in PLACEHOLDER_KEYS
        or low.startswith(("change-me", "changeme", "replace-me", "<"))
        or len(key) < MIN_KEY_CHARS
    )


def engine_key_refusal(key: str | None, source: str) -> str | None:
    """Why the engine key read from `source` must not be used, or None (unset means no key). One
    message for the sidecar's start and the engine launcher alike."""
    if key and placeholder_key(key):
        return (
            f"the engine key ({source}) is a placeholder or shorter than {MIN_KEY_CHARS} characters; "
            f"generate one ({KEY_RECIPE}) and give the engine (VLLM_API_KEY) and the sidecar "
            "(PALMYRA_ENGINE_API_KEY) the same value"
        )
    return None
