"""policy/structured.py: structured output bounded by what the grammar compiler unrolls.

Attack: a 200-byte chat request whose json_schema held one string with
`"pattern": "^[\\x00-\\uffff]{0,8000}$"` froze vLLM 0.32's API server (12.9 s, /health timing out,
/ready 503); `{0,16000}` stalled it 57 s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.policy import structured
from palmyra_serve.sidecar.policy.structured import StructuredLimits, check, repeat_units

LIMITS = StructuredLimits(max_bytes=16384, max_repeat=64, max_choices=1024, regex_and_grammar=True)


def _schema(prop: dict) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": prop}}},
    }


def test_the_freezing_pattern_is_refused():
    with pytest.raises(errors.ApiError) as caught:
        check(_schema({"type": "string", "pattern": "^[\\x00-\\uffff]{0,8000}$"}), "response_format", LIMITS)
    assert caught.value.status == 400 and caught.value.param == "response_format"


@pytest.mark.parametrize("prop", [{"type": "string", "maxLength": 200000}, {"type": "string", "minLength": 65}])
def test_long_string_bounds_are_refused(prop):
    with pytest.raises(errors.ApiError):
        check(_schema(prop), "response_format", LIMITS)


def test_ordinary_schemas_pass():
    check(_schema({"type": "string", "maxLength": 32, "pattern": "^[a-z]+$"}), "response_format", LIMITS)
    check({"choice": ["yes", "no"]}, "structured_outputs", LIMITS)
    check({"json": '{"type": "object"}'}, "structured_outputs", LIMITS)


def test_units_add_up_over_a_requests_fields():
    budget = check(_schema({"type": "string", "maxLength": 40}), "response_format", LIMITS)
    with pytest.raises(errors.ApiError):
        check([{"function": {"parameters": {"properties": {"b": {"maxLength": 40}}}}}], "tools", LIMITS, budget)


def test_choices_and_size_bounded():
    with pytest.raises(errors.ApiError):
        check({"choice": [str(i) for i in range(20000)]}, "structured_outputs", LIMITS)
    with pytest.raises(errors.ApiError):
        check({"grammar": "root ::= " + " | ".join(['"x"'] * 10000)}, "structured_outputs", LIMITS)


def test_a_schema_inside_a_json_string_is_walked():
    inner = '{"type": "string", "pattern": "a{0,5000}"}'
    with pytest.raises(errors.ApiError):
        check({"json": inner}, "structured_outputs", LIMITS)


def test_regex_and_grammar_can_be_switched_off():
    off = StructuredLimits(16384, 64, 1024, regex_and_grammar=False)
    for value in ({"regex": "[a-z]+"}, {"grammar": 'root ::= "a"'}):
        with pytest.raises(errors.ApiError) as caught:
            check(value, "structured_outputs", off)
        assert caught.value.code == errors.ErrorCode.UNSUPPORTED_PARAMETER


def test_deep_nesting_is_a_400_not_a_recursion_error():
    node: dict = {"type": "string"}
    for _ in range(5000):
        node = {"items": node}
    with pytest.raises(errors.ApiError):
        check({"json": node}, "structured_outputs", LIMITS)


@pytest.mark.parametrize(
    "pattern, units",
    [
        ("abc", 0),
        ("a{0,50}", 50),
        ("a{7}", 7),
        ("a{3,}", 3),
        ("(a{0,50}){0,50}", 50 * 51),
        ("[{]{0,4}", 4),
        ("\\{0,99}", 0),
        ("a*b+c?", 0),
        ("x{a,b}", 0),
    ],
)
def test_repeat_units(pattern, units):
    assert repeat_units(pattern) == units


def test_grammar_strings_are_literals():
    assert repeat_units('root ::= "{0,999}" [a-z]{0,3}', grammar=True) == 3


@given(st.text(max_size=200))
def test_repeat_units_is_total(pattern):
    """Any text: a count, never an exception or a number past the cap."""
    units = repeat_units(pattern)
    assert 0 <= units <= 1 << 30
    assert 0 <= repeat_units(pattern, grammar=True) <= 1 << 30


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_a_quantifier_counts_its_upper_bound(low, high):
    low, high = min(low, high), max(low, high)
    assert repeat_units(f"a{{{low},{high}}}") == high
    assert structured._quantifier(f"{low},{high}") == high
