"""A small Dockerfile parser: stages and their instructions (continuations joined, comments
dropped), global ARG defaults, exec-form commands and leading flags, enough to hold the Dockerfile
against the layout the images share (tests/static/test_containers.py and the Compose and
deployment checks beside it)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

# Loopback only: the engine is reached through its sidecar, never from the pod or Compose network.
ENGINE_CMD = ["palmyra-serve", "engine", "--host", "127.0.0.1", "--port", "8000"]


@dataclass
class Instruction:
    keyword: str  # upper case
    args: str  # the rest, continuations joined, RUN flags (--mount=...) included
    line: int

    def exec_form(self) -> list[str]:
        """JSON exec form of CMD/ENTRYPOINT/HEALTHCHECK CMD; fails on shell form (on purpose)."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            text = text[text.index("CMD") + 3 :]
        value = json.loads(text.strip())
        assert isinstance(value, list), f"line {self.line}: {self.keyword} is not in exec form"
        return value

    def flags(self) -> dict[str, list[str]]:
        """Leading --name=value flags (RUN --mount, COPY --from, HEALTHCHECK --interval)."""
        out: dict[str, list[str]] = {}
        for token in shlex.split(self.args):
            if not token.startswith("--"):
                break
            name, _, value = token[2:].partition("=")
            out.setdefault(name, []).append(value)
        return out

    def body(self) -> str:
        """The instruction without its leading flags (for RUN: the shell command)."""
        rest = self.args.lstrip()
        while rest.startswith("--"):
            rest = rest.split(None, 1)[1] if " " in rest else ""
        return rest


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.of(keyword)
        assert found, f"stage {self.name} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        """ENV key=value pairs of this stage (later ones win)."""
        out: dict[str, str] = {}
        for inst in self.of("ENV"):
            for token in shlex.split(inst.args):
                key, sep, value = token.partition("=")
                assert sep, f"line {inst.line}: use ENV key=value"
                out[key] = value
        return out

    def args_defaults(self) -> dict[str, str]:
        return _arg_defaults(self.of("ARG"))

    def runs(self) -> list[Instruction]:
        return self.of("RUN")


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: dict[str, Stage]


def _arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    out: dict[str, str] = {}
    for inst in instructions:
        name, _, default = inst.args.strip().partition("=")
        out[name] = default.strip().strip('"')
    return out


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash continuations; drop comments and blank lines (also inside continuations)."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not current:
            start = number
        if stripped.endswith("\\"):
            current.append(stripped[:-1].strip())
            continue
        current.append(stripped)
        out.append((start, " ".join(current)))
        current = []
    assert not current, "Dockerfile ends inside a continuation"
    return out


def parse_dockerfile(text: str) -> Dockerfile:
    global_args: list[Instruction] = []
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for number, line in logical_lines(text):
        keyword, _, args = line.partition(" ")
        inst = Instruction(keyword.upper(), args.strip(), number)
        if inst.keyword == "FROM":
            parts = inst.args.split()
            name = parts[2] if len(parts) == 3 and parts[1].lower() == "as" else f"stage{len(stages)}"
            stage = Stage(base=parts[0], name=name)
            stages[name] = stage
        elif stage is None:
            assert inst.keyword == "ARG", f"line {number}: only ARG may precede the first FROM"
            global_args.append(inst)
        else:
            stage.instructions.append(inst)
    return Dockerfile(_arg_defaults(global_args), stages)
