"""The adaptive limit's ceiling from the engine: vLLM's cache_config_info labels and max_num_seqs."""

from __future__ import annotations

from palmyra_serve.sidecar.admission import capacity as ec

# Captured from the vLLM 0.32 CPU engine serving the tiny stand-in (2 GiB KV), trimmed to the
# series that matter plus neighbours; the label set is vLLM's CacheConfig.
VLLM_CPU_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="palmyra-mini"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0",\
gpu_memory_utilization="0.92",kv_cache_max_concurrency="1024.0",kv_cache_memory_bytes="2147483648",\
kv_cache_size_tokens="2097152",num_cpu_blocks="None",num_gpu_blocks="16384",\
num_gpu_blocks_override="None",sliding_window="None"} 1.0
"""

# An older label set (no kv_cache_* labels), as CacheConfig published before they were added.
OLDER_METRICS = """\
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",\
gpu_memory_utilization="0.85",num_cpu_blocks="None",num_gpu_blocks="2400",swap_space="4"} 1.0
"""


def test_cache_config_labels_are_read_from_the_metrics_page() -> None:
    labels = ec.cache_config(VLLM_CPU_METRICS)
    assert labels["num_gpu_blocks"] == "16384" and labels["block_size"] == "128"
    assert ec.kv_tokens(labels) == 16384 * 128
    assert ec.cache_config("vllm:num_requests_running 0\n") == {}


def test_kv_requests_from_blocks_then_from_max_concurrency() -> None:
    assert ec.kv_requests(ec.cache_config(OLDER_METRICS), 2048) == 2400 * 128 // 2048
    only_conc = {"kv_cache_max_concurrency": "37.5", "num_gpu_blocks": "None"}
    assert ec.kv_requests(only_conc) == 37
    assert ec.kv_requests({}) is None


def test_ceiling_is_the_smaller_of_max_num_seqs_and_kv() -> None:
    cpu = ec.cache_config(VLLM_CPU_METRICS)
    assert ec.ceiling(ec.default_max_num_seqs("cpu"), cpu) == 128  # KV holds 1024 such requests
    small_kv = ec.cache_config(OLDER_METRICS)  # 150 requests of 2048 tokens
    assert ec.ceiling(256, small_kv) == 150
    assert ec.ceiling(256, small_kv, tokens_per_request=8192) == 37
    assert ec.ceiling(256, {}) == 256, "no labels: max_num_seqs alone"


def test_max_num_seqs_from_the_launchers_extra_args() -> None:
    assert ec.max_num_seqs_from_args("--max-num-seqs 16 --enforce-eager") == 16
    assert ec.max_num_seqs_from_args("--enforce-eager --max-num-seqs=48") == 48
    assert ec.max_num_seqs_from_args("--max_num_seqs 8") == 8
    assert ec.max_num_seqs_from_args("--max-num-batched-tokens 4096") is None
    assert ec.max_num_seqs_from_args("--max-num-seqs lots") is None
    assert ec.max_num_seqs_from_args("'unbalanced") is None


def test_platform_defaults_follow_vllm() -> None:
    assert ec.default_max_num_seqs("cpu") == 128
    assert ec.default_max_num_seqs("cpu", tensor_parallel_size=2) == 256
    assert ec.default_max_num_seqs("ascend") == 256
