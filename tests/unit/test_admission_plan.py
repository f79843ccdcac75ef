"""admission/plan.py: the one reading of the admission settings, in each mode, and what the engine
changes of it."""

from __future__ import annotations

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission import capacity
from palmyra_serve.sidecar.admission.plan import AdmissionPlan

# vLLM CPU 0.32's series, trimmed: 16384 blocks x 128 tokens = 2 GiB of KV cache.
CACHE_LABELS = capacity.cache_config('vllm:cache_config_info{block_size="128",num_gpu_blocks="16384"} 1.0\n')


def test_fixed_mode_is_the_manual_settings_and_gates_every_route() -> None:
    plan = AdmissionPlan.of(
        Settings(
            _env_file=None,
            admission_mode="fixed",
            max_in_flight=7,
            max_queue=3,
            queue_timeout_s=4.0,
            admission_max_limit=99,
        )
    )
    assert plan.fixed and plan.gate_all
    assert (plan.ceiling, plan.floor, plan.start, plan.max_queue, plan.queue_timeout_s) == (7, 7, 7, 3, 4.0)
    assert not plan.ceiling_from_engine, "the adaptive settings do not apply"
    assert plan.learned(CACHE_LABELS) is plan


def test_adaptive_starts_under_max_num_seqs_and_learns_the_engines_ceiling() -> None:
    plan = AdmissionPlan.of(Settings(_env_file=None, platform="cpu", admission_kv_tokens_per_request=65536))
    assert not plan.fixed and not plan.gate_all, "generations only"
    assert (plan.ceiling, plan.floor, plan.start, plan.ceiling_from_engine) == (128, 2, 64, True)
    learned = plan.learned(CACHE_LABELS)
    assert (learned.ceiling, learned.start) == (32, 16), "2 097 152 / 65 536 requests fit, starting at half"
    assert plan.learned({}).ceiling == 128, "no labels: max_num_seqs alone"
    accelerator = AdmissionPlan.of(Settings(_env_file=None, platform="ascend", engine_extra_args="--max-num-seqs=48"))
    assert (accelerator.max_num_seqs, accelerator.ceiling) == (48, 48)


def test_an_operators_ceiling_and_start_are_kept_whatever_the_engine_says() -> None:
    plan = AdmissionPlan.of(Settings(_env_file=None, admission_max_limit=20, admission_initial_limit=3))
    assert (plan.ceiling, plan.start, plan.ceiling_from_engine) == (20, 3, False)
    assert plan.learned(CACHE_LABELS) is plan
    floor = AdmissionPlan.of(Settings(_env_file=None, admission_max_limit=3, admission_min_limit=2))
    assert floor.start == 2, "half the ceiling, never below the floor"
