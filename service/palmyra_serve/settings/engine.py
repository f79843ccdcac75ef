"""The engine settings, one group of palmyra_serve.settings.Settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from palmyra_serve.settings.basics import BASIC


class EngineSettings(BaseSettings):
    """Engine: how the launcher starts vLLM, and how the sidecar reaches it."""

    # --- the sidecar's link to the engine -----------------------------------------------------
    engine_url: str = Field("http://127.0.0.1:8000", description="Where the sidecar reaches the engine.")
    engine_port: int = Field(8000, description="Port the engine listens on (internal only).")
    engine_api_key: str | None = Field(
        None,
        description="Pod-local secret: the engine's /v1 requires it (passed to vLLM as VLLM_API_KEY) "
        "and the sidecar sends it.",
        json_schema_extra=BASIC,
    )
    connect_timeout_s: float = Field(5.0, description="Connecting to the engine; refused or slower is 503.")
    read_timeout_s: float = Field(120.0, description="Longest silence from the engine inside one request before 504.")

    # --- the launcher -------------------------------------------------------------------------
    platform: Literal["auto", "ascend", "cuda", "cpu"] = Field(
        "auto",
        description="Engine platform; auto detects torch-npu, then CUDA, else CPU.",
        json_schema_extra=BASIC,
    )
    dtype: str = Field(
        "bfloat16", description="Engine dtype (bf16 everywhere: fp16 gives garbage for Qwen2.5 weights on Ascend)."
    )
    max_model_len: int = Field(
        8192, description="Engine --max-model-len (the reference adaptation's value).", json_schema_extra=BASIC
    )
    gpu_memory_utilization: float = Field(0.85, description="Share of NPU/GPU memory vLLM may use (seed: 0.85).")
    tensor_parallel_size: int = Field(1, description="Engine --tensor-parallel-size.")
    enforce_eager: bool = Field(False, description="Skip graph capture / torch.compile (faster start, slower decode).")
    npu_devices: str | None = Field(
        None,
        description="The NPU(s) the engine uses, as `npu-smi info` numbers them on the host (e.g. '3', or '0,1' "
        "for tensor parallelism); exported as ASCEND_RT_VISIBLE_DEVICES. Compose passes /dev/davinci<N> for one "
        "N and numbers it 0 inside the container; on Kubernetes the device plugin chooses: leave it unset.",
        json_schema_extra=BASIC,
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
