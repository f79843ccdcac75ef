"""The model settings, one group of palmyra_serve.settings.Settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from palmyra_serve import HUB_MODEL_ID, SERVED_MODEL_NAME
from palmyra_serve.settings.basics import BASIC


class ModelSettings(BaseSettings):
    """Model: which weights are served, from where, under which name."""

    model: str = Field(
        HUB_MODEL_ID, description="Hub id or local directory of the weights to serve.", json_schema_extra=BASIC
    )
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
    served_model_name: str = Field(
        SERVED_MODEL_NAME, description="Model name clients send and /v1/models lists.", json_schema_extra=BASIC
    )
