"""palmyra-serve: OpenAI-compatible serving of Writer/palmyra-mini on Ascend, CPU and CUDA."""

__version__ = "0.1.0"
SERVED_MODEL_NAME = "palmyra-mini"
HUB_MODEL_ID = "Writer/palmyra-mini"
# service.name of each process's spans (OTEL_SERVICE_NAME overrides either): docs/tracing.md.
SIDECAR_SERVICE_NAME = "palmyra-sidecar"
ENGINE_SERVICE_NAME = "palmyra-engine"
