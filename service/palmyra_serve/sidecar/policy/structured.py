"""Bounds on structured output: what a request may ask the engine's grammar compiler to build.

vLLM compiles a request's JSON schema, regex, grammar, choice list or structural tag (and, for a
named or required tool call, the tool's parameter schema) with xgrammar while it validates the
request, inside its API server: a compile that takes seconds holds every other request, the
engine's own /health included. Compile time is driven by bounded repetitions that xgrammar unrolls
into states, each with a token mask over the 151,936-token vocabulary. Measured on this project's
CPU host with Qwen2's tokenizer, one compiler thread (docs/request-fields.md has the table): a plain
object schema 0.02 s; a string `maxLength` of 16 / 64 / 128: 0.34 / 1.75 / 3.6 s; a `pattern`
`[\\x00-\\uffff]{0,64}` 1.1 s and `{0,8000}` 8.8 s; a choice list of 1,000 entries 0.03 s, 4,000
0.67 s; `maxItems` 4,000 0.001 s (not unrolled).

So every bounded repetition counts as *units*, each unit one unrolled copy: a `maxLength` or
`minLength` of n is n units; a quantifier `{m,n}` in a pattern, a regex or a grammar is n copies of
what it repeats, so `(a{0,50}){0,50}` is 50 x (1 + 50) units. A request's units, over every
structured field it carries, stay within `structured_max_repeat`; its structured fields within
`structured_max_bytes` serialised and `MAX_DEPTH` levels; a choice list within
`structured_max_choices`. Regex and grammar can be switched off for a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from palmyra_serve.sidecar.core import errors

# Nesting of a schema (or of any structured field): far more than real schemas use, far less than
# the Python recursion that would otherwise stop the walk.
MAX_DEPTH = 32
# A bound above this is as good as unbounded for counting (and keeps the numbers small).
_HUGE = 1 << 30
# Keys of a JSON schema whose integer value is a repetition xgrammar unrolls.
_LENGTH_KEYS = frozenset({"maxLength", "minLength"})
# Keys whose string value is a regular expression.
_REGEX_KEYS = frozenset({"pattern", "regex", "whitespace_pattern"})
# Counts that xgrammar does not unroll (measured): bounded, not counted as units.
_COUNT_KEYS = frozenset({"maxItems", "minItems", "maxProperties", "minProperties"})
_MAX_COUNT = 4096


@dataclass(frozen=True, slots=True)
class StructuredLimits:
    max_bytes: int
    max_repeat: int
    max_choices: int
    regex_and_grammar: bool


class _Budget:
    __slots__ = ("limits", "param", "units")

    def __init__(self, limits: StructuredLimits, param: str) -> None:
        self.limits = limits
        self.param = param
        self.units = 0

    def add(self, units: int) -> None:
        self.units = min(_HUGE, self.units + units)
        if self.units > self.limits.max_repeat:
            raise errors.ApiError.of(
                errors.ErrorCode.PARAMETER_TOO_LARGE,
                f"{self.param}: its bounded repetitions (maxLength, minLength, {{m,n}} in patterns) add up to "
                f"more than this service's limit of {self.limits.max_repeat} (each costs the engine's grammar "
                "compiler time over the whole vocabulary before any request is answered).",
                param=self.param,
            )


def check(value: Any, param: str, limits: StructuredLimits, budget: _Budget | None = None) -> _Budget:
    """Raise a 400 when the structured field `param` asks for more than the limits allow. Pass the
    budget of the request's earlier structured fields to count them together."""
    budget = budget if budget is not None else _Budget(limits, param)
    budget.param = param
    if value is None:
        return budget
    _check_size(value, param, limits)
    _walk(value, budget, 0)
    return budget


def _check_size(value: Any, param: str, limits: StructuredLimits) -> None:
    _depth_ok(value, param)
    size = len(orjson.dumps(value)) if not isinstance(value, str) else len(value.encode())
    if size > limits.max_bytes:
        raise errors.parameter_too_large(f"{param} (bytes)", size, limits.max_bytes)


def _depth_ok(value: Any, param: str) -> None:
    """Iterative, so that a value nested deeper than Python's recursion is refused, not a crash."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise errors.invalid_parameter(param, f"{param} is nested more than {MAX_DEPTH} levels deep.")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _walk(node: Any, budget: _Budget, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise errors.invalid_parameter(budget.param, f"{budget.param} is nested more than {MAX_DEPTH} levels deep.")
    if isinstance(node, list):
        for item in node:
            _walk(item, budget, depth + 1)
        return
    if not isinstance(node, dict):
        return
    limits = budget.limits
    for key, value in node.items():
        if key in _LENGTH_KEYS:
            budget.add(_count(value))
        elif key in _COUNT_KEYS:
            if (count := _count(value)) > _MAX_COUNT:
                raise errors.parameter_too_large(f"{budget.param}.{key}", count, _MAX_COUNT)
        elif key in _REGEX_KEYS and isinstance(value, str):
            if key == "regex" and not limits.regex_and_grammar:
                raise _switched_off(budget.param, "regex")
            budget.add(repeat_units(value))
        elif key == "patternProperties" and isinstance(value, dict):
            for pattern in value:
                budget.add(repeat_units(pattern))
            _walk(value, budget, depth + 1)
        elif key == "grammar" and isinstance(value, str):
            if not limits.regex_and_grammar:
                raise _switched_off(budget.param, "grammar")
            budget.add(repeat_units(value, grammar=True))
        elif key in ("choice", "enum") and isinstance(value, list):
            if len(value) > limits.max_choices:
                raise errors.parameter_too_large(f"{budget.param}.{key}", len(value), limits.max_choices)
        elif key in ("json", "structural_tag") and isinstance(value, str):
            # A schema or tag sent as a JSON string: parsed (its size is bounded already) and walked.
            try:
                inner = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue  # not JSON: the engine refuses it with its own 400
            _depth_ok(inner, budget.param)
            _walk(inner, budget, depth + 1)
        elif isinstance(value, dict | list):
            _walk(value, budget, depth + 1)


def _count(value: Any) -> int:
    if type(value) is int:
        return max(0, value)
    try:  # read laxly, as a schema library might
        return max(0, int(float(value)))
    except (TypeError, ValueError, OverflowError):
        return 0


def _switched_off(param: str, what: str) -> errors.ApiError:
    return errors.unsupported_parameter(param, f"{what}-constrained output is turned off on this deployment.")


def repeat_units(pattern: str, grammar: bool = False) -> int:
    """The copies xgrammar unrolls for the bounded quantifiers `{m}`, `{m,}`, `{m,n}` of a regex (or
    an EBNF grammar, whose quoted strings are literals): each quantifier costs its upper bound times
    one plus the units of what it repeats. `*`, `+` and `?` are not unrolled and cost nothing."""
    stack = [0]  # units of the group being read, innermost last
    last = 0  # units of the atom just read (a quantifier after it multiplies them)
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            last = 0
            continue
        if grammar and c in "\"'":
            end = i + 1
            while end < n and pattern[end] != c:
                end += 2 if pattern[end] == "\\" else 1
            i = end + 1
            last = 0
            continue
        if c == "[":
            i = _class_end(pattern, i + 1)
            last = 0
            continue
        if c == "(":
            stack.append(0)
        elif c == ")":
            inner = stack.pop() if len(stack) > 1 else 0
            stack[-1] = min(_HUGE, stack[-1] + inner)
            last = inner
        elif c == "{":
            close = pattern.find("}", i)
            bound = _quantifier(pattern[i + 1 : close]) if close > 0 else None
            if bound is not None:
                stack[-1] = min(_HUGE, stack[-1] + bound * (1 + last) - last)
                last = 0
                i = close + 1
                continue
            last = 0
        else:
            last = 0
        i += 1
    return min(_HUGE, sum(stack))


def _class_end(pattern: str, i: int) -> int:
    """The index after a character class's closing bracket (a `]` first in the class is literal)."""
    n = len(pattern)
    if i < n and pattern[i] == "^":
        i += 1
    if i < n and pattern[i] == "]":
        i += 1
    while i < n and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _quantifier(text: str) -> int | None:
    """The upper bound of `m`, `m,` or `m,n` (None when it is not a quantifier)."""
    low, _, high = text.partition(",")
    low, high = low.strip(), high.strip()
    if not low.isdigit() or (high and not high.isdigit()):
        return None
    if len(low) > 9 or len(high) > 9:
        return _HUGE
    return int(high) if high else int(low)
