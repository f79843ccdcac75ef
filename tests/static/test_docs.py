"""The documentation cannot drift from the code.

- docs/configuration.md and docs/metrics.md hold blocks generated from the code
  (scripts/gen_docs.py): the committed text must equal what the generator writes now.
- The hand-maintained engine-metrics table names exactly the `vllm:` metrics that the dashboards
  and alert rules use.
- Every PALMYRA_ variable mentioned in the docs, Compose, Dockerfile or manifests is a real setting
  (or an explicitly allowed non-setting variable, whose reader is checked to exist).
- Every relative link in README.md and docs/*.md resolves to a file, and an #anchor to a heading.
README commands are checked in test_docs_readme.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.variables import NON_SETTINGS
from tests.helpers import doc_blocks
from tests.helpers.markdown import github_slug
from tests.helpers.modules import load_module

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
GEN = REPO / "scripts" / "gen_docs.py"


def load_gen_docs() -> ModuleType:
    return load_module("gen_docs", GEN)  # a fresh copy each time: a test may repoint its paths


def markdown_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
    return [f for f in files if f.is_file()]


# --- generated references ---------------------------------------------------------------------


def test_generated_docs_are_current():
    out = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"docs are stale; run `python scripts/gen_docs.py`\n{out.stdout}{out.stderr}"


def test_check_fails_on_a_stale_doc_and_keeps_hand_written_prose(tmp_path):
    gen = load_gen_docs()
    doc = tmp_path / "configuration.md"
    original = (DOCS / "configuration.md").read_text(encoding="utf-8")
    # A stale row inside the generated block, and hand-written prose outside it.
    stale = original.replace("| `PALMYRA_MAX_MODEL_LEN` | int | `8192` |", "| `PALMYRA_MAX_MODEL_LEN` | int | `4096` |")
    assert stale != original
    doc.write_text(stale + "\nHand-written epilogue.\n", encoding="utf-8")
    blocks = {doc: gen.GENERATORS[gen.CONFIG_DOC]}
    assert gen.main(["--check"], generators=blocks) == 1
    assert gen.main([], generators=blocks) == 0
    assert doc.read_text(encoding="utf-8") == original + "\nHand-written epilogue.\n"
    assert gen.main(["--check"], generators=blocks) == 0


def test_every_setting_and_subcommand_is_in_the_configuration_reference():
    from palmyra_serve.cli import build_parser

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for name in Settings.model_fields:
        assert f"| `PALMYRA_{name.upper()}` |" in text, name
    gen = load_gen_docs()
    for command, sub in gen.subcommands(build_parser()):
        assert f"### `palmyra-serve {command}`" in text, command
        for action in gen.options(sub):
            for flag in action.option_strings:
                assert f"`{flag}" in text, (command, flag)


def exposed_sample_names() -> set[str]:
    metrics = SidecarMetrics()
    return {
        s.name
        for fam in metrics.registry.collect()
        for s in fam.samples
        if not s.name.endswith(("_bucket", "_sum", "_count"))
    }


def test_every_sidecar_metric_is_in_the_metrics_reference():
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(palmyra_\w+)` \|", text, re.M))
    names = exposed_sample_names()
    assert names <= documented
    # The contract's names (counters end in _total, as exposed).
    assert {"palmyra_requests_total", "palmyra_rejections_total", "palmyra_ready"} <= documented


# --- engine metrics: dashboards and rules vs docs/metrics.md -----------------------------------

VLLM_NAME = re.compile(r"vllm:[A-Za-z0-9_:]+")
SERIES_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def strings_in(obj: object):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from strings_in(key)
            yield from strings_in(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from strings_in(value)


def vllm_names(objects) -> set[str]:
    return {SERIES_SUFFIX.sub("", name) for obj in objects for s in strings_in(obj) for name in VLLM_NAME.findall(s)}


def monitoring_vllm_names() -> set[str]:
    dashboards = [
        json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((REPO / "monitoring/grafana/dashboards").glob("*.json"))
    ]
    rules = [
        yaml.safe_load(p.read_text(encoding="utf-8"))
        for p in sorted((REPO / "monitoring/prometheus/rules").glob("*.yml"))
    ]
    assert dashboards and rules
    return vllm_names(dashboards + rules)


def documented_vllm_names() -> set[str]:
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(vllm:[A-Za-z0-9_:]+)` \|", text, re.M))


def test_engine_metrics_table_matches_dashboards_and_rules():
    used, documented = monitoring_vllm_names(), documented_vllm_names()
    assert used - documented == set(), "used by dashboards/rules but missing from docs/metrics.md"
    assert documented - used == set(), "listed in docs/metrics.md but used by no dashboard or rule"


def test_engine_metric_name_extraction_sees_histogram_series():
    # The drift test above compares base names: a histogram used through its _bucket series counts.
    assert vllm_names([{"expr": "histogram_quantile(0.9, rate(vllm:e2e_request_latency_seconds_bucket[5m]))"}]) == {
        "vllm:e2e_request_latency_seconds"
    }
    assert "vllm:num_requests_waiting" in monitoring_vllm_names()


# --- PALMYRA_ variables -----------------------------------------------------------------------

# Non-setting variables: name -> (the file that reads it, why it is not a setting); one list, in
# service/palmyra_serve/variables.py, which also warns at start about a name that is neither.
ALLOWED_NON_SETTINGS = NON_SETTINGS
PALMYRA_VAR = re.compile(r"\bPALMYRA_[A-Z0-9_]*[A-Z0-9]\b")


def files_mentioning_variables() -> list[Path]:
    # Not CHANGELOG.md: history names the variables it renamed or removed.
    files = [f for f in markdown_files() if f.name != "CHANGELOG.md"]
    files += [REPO / "docker-compose.yml", REPO / "Dockerfile"]
    files += sorted((REPO / "k8s").rglob("*.yaml")) + sorted((REPO / "compose").glob("*.env"))
    files += sorted((REPO / "compose").glob("*.yml"))
    return [f for f in files if f.is_file()]


def test_every_palmyra_variable_mentioned_is_a_setting_or_allowed():
    settings = {f"PALMYRA_{name.upper()}" for name in Settings.model_fields}
    unknown: dict[str, list[str]] = {}
    for path in files_mentioning_variables():
        for name in set(PALMYRA_VAR.findall(path.read_text(encoding="utf-8"))):
            if name not in settings and name not in ALLOWED_NON_SETTINGS:
                unknown.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert unknown == {}, "not a Settings field (typo, or a removed setting still documented)"


def test_the_variable_check_would_catch_a_typo():
    settings = {f"PALMYRA_{name.upper()}" for name in Settings.model_fields}
    found = PALMYRA_VAR.findall("set `PALMYRA_MAX_MODEL_LENGTH=4096` and PALMYRA_DTYPE")
    assert found == ["PALMYRA_MAX_MODEL_LENGTH", "PALMYRA_DTYPE"]
    assert "PALMYRA_MAX_MODEL_LENGTH" not in settings | set(ALLOWED_NON_SETTINGS)


@pytest.mark.parametrize("name", sorted(ALLOWED_NON_SETTINGS))
def test_allowed_non_setting_is_really_read_where_claimed_and_documented(name):
    reader, _reason = ALLOWED_NON_SETTINGS[name]
    assert name not in {f"PALMYRA_{f.upper()}" for f in Settings.model_fields}, "it is a setting now: drop it here"
    assert name in (REPO / reader).read_text(encoding="utf-8"), f"{reader} no longer reads {name}"
    documented = (DOCS / "configuration.md").read_text(encoding="utf-8") + (REPO / "CONTRIBUTING.md").read_text(
        encoding="utf-8"
    )
    assert f"`{name}`" in documented, "explain it in docs/configuration.md (or CONTRIBUTING.md for test knobs)"


# --- links ------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def strip_code(text: str) -> str:
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchors(path: Path, text: str | None = None) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8") if text is None else text)
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    for _, heading in HEADING.findall(text):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        out.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return out


def broken_links(path: Path, original: str | None = None) -> list[str]:
    original = path.read_text(encoding="utf-8") if original is None else original
    text = strip_code(original)
    broken = []
    for target in LINK.findall(text) + REF_DEF.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not file_part:
            if anchor not in anchors(path, original):
                broken.append(f"{target}: no heading with anchor #{anchor} in {path.relative_to(REPO)}")
        elif REPO not in dest.parents and dest != REPO:
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    return broken


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    assert broken_links(doc) == []


def test_github_slugs():
    assert github_slug("Output is only `!!!!` in float16") == "output-is-only--in-float16"
    assert github_slug("`npu-smi` fails with -8005") == "npu-smi-fails-with--8005"
    assert github_slug("PalmyraKVCacheNearFull") == "palmyrakvcachenearfull"
    assert github_slug("Health, probes and shutdown") == "health-probes-and-shutdown"
    assert github_slug("What [links](x.md) do") == "what-links-do"


def test_link_check_catches_a_missing_file_and_a_missing_anchor():
    probe = DOCS / "link-check-probe.md"  # never written: its text is passed in
    text = (
        "[a](configuration.md#settings) [b](nope.md) [c](metrics.md#no-such-heading) "
        "[d](https://example.com/x) `[e](ignored.md)` [f](#local) [g](#elsewhere) [h](../../outside.md)\n"
        "# Local\n"
    )
    assert broken_links(probe, text) == [
        "nope.md: no such file",
        "metrics.md#no-such-heading: no heading with anchor #no-such-heading in docs/metrics.md",
        "#elsewhere: no heading with anchor #elsewhere in docs/link-check-probe.md",
        "../../outside.md: outside the repository",
    ]


# --- the docs speak of the product ------------------------------------------------------------

# How the project is developed is not the product: no tracker numbers of this project, no words
# about sessions or runs of its development, no notes the repository does not ship. (Upstream
# projects' issues are cited by their repository and number, e.g. "vllm-ascend #2698": allowed.)
DEVELOPMENT_TALK = re.compile(
    r"\bissue \d+\b|\b(?:last|this|previous|next) session\b|\bthis (?:stop|sprint)\b|DESIGN\.md|\bseed card\b",
    re.I,
)
# Where a reader meets the product: its docs, and the comments of its code, manifests and scripts.
SPOKEN = ("README.md", "CONTRIBUTING.md", "docs", "compose", "k8s", "monitoring", "service", "docker", "scripts")
SPOKEN_FILES = ("docker-compose.yml", "Dockerfile", "bootstrap.sh", "test.sh", ".env")


def product_files() -> list[Path]:
    found = [REPO / name for name in SPOKEN_FILES]
    for name in SPOKEN:
        path = REPO / name
        found += [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file()]
    return [p for p in found if p.suffix not in (".png", ".json") and "__pycache__" not in p.parts]


def development_talk(paths: list[Path]) -> list[str]:
    return [
        f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{number}: {line.strip()}"
        for path in paths
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if DEVELOPMENT_TALK.search(line)
    ]


def test_the_docs_and_comments_speak_of_the_product_not_of_its_development() -> None:
    files = product_files()
    assert len(files) > 100 and REPO / "README.md" in files
    assert development_talk(files) == []


def test_development_talk_is_found(tmp_path: Path) -> None:
    for line in ("as issue 3 asked", "measured in the last session", "see DESIGN.md", "the seed card's value"):
        page = tmp_path / "page.md"
        page.write_text(f"text\n{line}\n")
        assert development_talk([page]) == [f"{page}:2: {line}"]


# --- every command block is covered -----------------------------------------------------------


def test_every_command_block_has_its_coverage_and_the_inventory_is_current() -> None:
    found = doc_blocks.command_blocks()
    assert len(found) > 20 and {b.kind for b in found} <= set(doc_blocks.COVERAGE)
    assert doc_blocks.main(["--check"]) == 0, "python -m tests.helpers.doc_blocks"
    # The blocks run as written exist: the engine tier's test finds them through the same markers.
    assert sum(b.kind == "run" for b in found) >= 5


def test_a_new_block_without_its_coverage_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Run this:\n\n```sh\ncurl -s http://127.0.0.1:8080/ready\n```\n\n```\nno language\n```\n")
    found = doc_blocks.blocks(page)
    assert [b.kind for b in found] == [None, None]
    kinds = sorted(doc_blocks.COVERAGE)
    assert doc_blocks.problems(found) == [f"{page}:3: a sh block needs a marker <!-- doc-test: one of {kinds} -->"]
    assert doc_blocks.unlabelled([page]) == [f"{page}:7: a block without a language (sh, python, text, ...)"]
    page.write_text("<!-- doc-test: needs a cluster -->\n  ```sh\n  kubectl get pods\n  ```\n")
    (block,) = doc_blocks.blocks(page)
    assert (block.kind, block.text) == ("needs a cluster", "kubectl get pods") and doc_blocks.problems([block]) == []
