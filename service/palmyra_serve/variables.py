"""The PALMYRA_* variables: every setting (a field of settings.Settings) and the few variables that
are not settings, each with the file that reads it; and the warning for a name that is neither,
with the closest known name, so that a typo in an env file is said once at start instead of being
ignored in silence."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)
PREFIX = "PALMYRA_"

# Not settings: name -> (the file that reads it, why it is not a setting). Compose interpolation,
# the image entrypoint and the install script run before or outside the Python settings; the test
# knobs are read by the test suite. tests/static/test_docs.py checks each is read where it says and
# documented.
NON_SETTINGS: dict[str, tuple[str, str]] = {
    "PALMYRA_BIND": ("docker-compose.yml", "Compose interpolation: host address of the published port"),
    "PALMYRA_ENGINE_ASCEND_IMAGE": ("docker-compose.yml", "Compose interpolation: image name"),
    "PALMYRA_ENGINE_CPU_IMAGE": ("docker-compose.yml", "Compose interpolation: image name"),
    "PALMYRA_SIDECAR_IMAGE": ("docker-compose.yml", "Compose interpolation: image name"),
    "PALMYRA_NPU_EXPORTER_IMAGE": ("docker-compose.yml", "Compose interpolation: image name"),
    "PALMYRA_CANN_ENV": ("docker/engine-entrypoint.sh", "image entrypoint, runs before Python"),
    "PALMYRA_ASCEND_ROOT": ("docker/engine-entrypoint.sh", "image entrypoint, runs before Python"),
    "PALMYRA_PRELOAD_JEMALLOC": ("docker/engine-entrypoint.sh", "image entrypoint, runs before Python"),
    "PALMYRA_CANN_ENV_SCRIPTS": ("docker/engine-entrypoint.sh", "image entrypoint, runs before Python"),
    "PALMYRA_WORK_DIR": ("docker/engine-entrypoint.sh", "image entrypoint, runs before Python"),
    "PALMYRA_VENV": ("bootstrap.sh", "install script, runs before the package exists"),
    "PALMYRA_EXTRAS": ("bootstrap.sh", "install script, runs before the package exists"),
    "PALMYRA_TORCH_INDEX": ("bootstrap.sh", "install script, runs before the package exists"),
    "PALMYRA_PIP_ARGS": ("bootstrap.sh", "install script, runs before the package exists"),
    "PALMYRA_CA_BUNDLE": ("scripts/podman/build-image.sh", "image build script"),
    "PALMYRA_WHEELS_DIR": ("scripts/podman/build-image.sh", "image build script"),
    "PALMYRA_PYTHON_BASE": ("scripts/podman/build-image.sh", "image build script"),
    "PALMYRA_TORCH_CPU_INDEX_URL": ("scripts/podman/build-image.sh", "image build script"),
    "PALMYRA_API_KEY": ("service/palmyra_serve/tools/endpoint.py", "the client key validate and bench send"),
    "PALMYRA_LONG": ("tests/conftest.py", "test selection"),
    "PALMYRA_TEST_EXTRAS": ("test.sh", "test installation"),
    "PALMYRA_TEST_WORKERS": ("test.sh", "parallel workers of the tiers that start no engine"),
    "PALMYRA_TEST_PREBUILD": ("test.sh", "the container images built in the background"),
    "PALMYRA_TEST_REPORTS": ("test.sh", "where each pytest run writes its JUnit file"),
    "PALMYRA_TEST_ENGINE": ("tests/helpers/engine_under_test.py", "which vLLM the engine tier's engines run"),
    "PALMYRA_VLLM018_VENV": ("tests/vllm018/install.sh", "where vLLM 0.18.0's test venv lives"),
    "PALMYRA_TEST_CACHE": ("tests/helpers/models.py", "test cache directory"),
    "PALMYRA_RELIABILITY_FIGURES": (
        "tests/helpers/reliability.py",
        "where the reliability suite appends its figures",
    ),
    "PALMYRA_UPDATE_CONTRACT": ("tests/static/test_contract.py", "rewrites the contract snapshot's golden files"),
}


def setting_names() -> set[str]:
    from palmyra_serve.settings import Settings

    return {PREFIX + name.upper() for name in Settings.model_fields}


def unknown(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """The PALMYRA_* names among `names` that are neither a setting nor a known variable, each with
    the closest known name (None when nothing is close)."""
    known = sorted(setting_names() | set(NON_SETTINGS))
    out = []
    for name in sorted(n for n in names if n.startswith(PREFIX) and n not in known):
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        out.append((name, close[0] if close else None))
    return out


def warn_unknown(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Log one warning per unknown PALMYRA_* variable in the environment; returns them."""
    found = unknown(environ)
    for name, close in found:
        hint = f"; did you mean {close}?" if close else ""
        log.warning(
            "%s is not a palmyra-serve setting and is ignored%s",
            name,
            hint,
            extra={"fields": {"variable": name, "closest": close}},
        )
    return found
