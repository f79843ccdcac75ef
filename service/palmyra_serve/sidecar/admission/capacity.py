"""The ceiling of the adaptive concurrency limit: what the engine can hold at once, read at start.

Two numbers bound it, and the ceiling is the smaller one:

- vLLM's `max_num_seqs`, the most sequences its scheduler runs in one step. vLLM does not publish
  it on /metrics (neither the CPU build 0.32 nor the vLLM 0.18 under vllm-ascend), so it comes from
  the launcher's arguments (`--max-num-seqs` in PALMYRA_ENGINE_EXTRA_ARGS), else vLLM's default for
  the serving API: 128 per tensor-parallel rank on CPU, 256 on any accelerator. 256 is vLLM's
  EngineArgs default below 70 GiB of device memory (NPU 910B, most GPUs); above, vLLM runs 1024, but
  the sidecar does not see the device's memory, so there the operator passes `--max-num-seqs` (or
  sets the ceiling outright, PALMYRA_ADMISSION_MAX_LIMIT, which replaces both bounds: admission/plan.py).
- KV capacity in requests: vLLM's `vllm:cache_config_info` info series (an always-1 gauge whose
  labels are its CacheConfig, in both versions) carries `num_gpu_blocks` and `block_size`; their
  product is the KV cache in tokens (the CPU backend reports its KV space as GPU blocks too). Divided
  by the tokens one request is expected to hold (PALMYRA_ADMISSION_KV_TOKENS_PER_REQUEST, default
  2048: a prompt plus its output for chat-sized traffic) it is the number of requests that fit
  without preemption. Newer vLLM also labels `kv_cache_max_concurrency` (requests of max_model_len
  that fit); it is only read when the block labels are missing, as it assumes every request is as
  long as the model allows.

Feature-detected: missing labels simply drop that bound. Pure functions; the caller fetches
/metrics (upstream/control.py's control-plane client) and passes the text.
"""

from __future__ import annotations

import re
import shlex

CPU_MAX_NUM_SEQS = 128  # vLLM EngineArgs, serving API, CPU platform, per TP rank
ACCEL_MAX_NUM_SEQS = 256  # accelerators below 70 GiB (NPU 910B, most GPUs)
DEFAULT_KV_TOKENS_PER_REQUEST = 2048

_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}\s+\S+", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def cache_config(metrics_text: str) -> dict[str, str]:
    """Labels of the first `vllm:cache_config_info` series, {} when the engine publishes none."""
    m = _INFO.search(metrics_text)
    return dict(_LABEL.findall(m.group("labels"))) if m else {}


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        value = float(labels[name])
    except (KeyError, ValueError):
        return None  # absent, or "None" before the engine sized its cache
    return int(value) if value > 0 else None


def kv_tokens(labels: dict[str, str]) -> int | None:
    """The KV cache in tokens: num_gpu_blocks x block_size."""
    blocks, size = _int_label(labels, "num_gpu_blocks"), _int_label(labels, "block_size")
    return blocks * size if blocks and size else None


def kv_requests(labels: dict[str, str], tokens_per_request: int = DEFAULT_KV_TOKENS_PER_REQUEST) -> int | None:
    """Requests of `tokens_per_request` tokens that fit in the KV cache at once."""
    tokens = kv_tokens(labels)
    if tokens is not None:
        return max(1, tokens // max(1, tokens_per_request))
    conc = _int_label(labels, "kv_cache_max_concurrency")
    return conc


def max_num_seqs_from_args(extra_args: str) -> int | None:
    """`--max-num-seqs N` or `--max-num-seqs=N` in the engine's extra arguments."""
    try:
        argv = shlex.split(extra_args)
    except ValueError:
        return None
    for i, arg in enumerate(argv):
        value = None
        if arg in ("--max-num-seqs", "--max_num_seqs") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(("--max-num-seqs=", "--max_num_seqs=")):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def default_max_num_seqs(platform: str, tensor_parallel_size: int = 1) -> int:
    return CPU_MAX_NUM_SEQS * max(1, tensor_parallel_size) if platform == "cpu" else ACCEL_MAX_NUM_SEQS


def ceiling(
    max_num_seqs: int, cache_labels: dict[str, str], tokens_per_request: int = DEFAULT_KV_TOKENS_PER_REQUEST
) -> int:
    """The adaptive limit's ceiling from the engine: min(max_num_seqs, KV requests)."""
    kv = kv_requests(cache_labels, tokens_per_request)
    return max(1, min(max_num_seqs, kv) if kv is not None else max_num_seqs)
