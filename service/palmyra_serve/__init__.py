"""palmyra-serve: OpenAI-compatible serving of Writer/palmyra-mini on Ascend, CPU and CUDA."""

__version__ = "0.1.0"
SERVED_MODEL_NAME = "palmyra-mini"
HUB_MODEL_ID = "Writer/palmyra-mini"
