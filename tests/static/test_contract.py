"""The sidecar's contract, recorded from the running code: what dashboards, alerts, clients, log
pipelines, operators and scripts depend on. A refactor that changes any of it fails here, and a
deliberate change shows up in review as a diff of the golden files in tests/data/contract/.

One golden file per aspect, each JSON with sorted keys and an indent of 2:

- metrics.json     the Prometheus families of SidecarMetrics (name, type, label names, buckets, the
                   values of labels whose children are pre-created from a fixed vocabulary, and
                   whether the client port's /metrics shows it or only the probe port's)
- errors.json      every error errors.py can build: status, OpenAI type and code, the headers it is
                   sent with; the code vocabularies; how an engine's error is reshaped
- headers.json     response header names of the sidecar over a real socket, per kind of answer
- access_log.json  the keys (and their JSON types) of the access-log line of the same requests
- openapi.json     the OpenAPI document the sidecar serves
- cli.json         every subcommand of `palmyra-serve` and its options
- settings.json    every PALMYRA_* variable Settings reads: type, default, constraints

Nothing here restates a constant: each file is what the code produces now. What would make a file
differ from run to run is left out or replaced on purpose (the package version, request ids,
timings, ports): only a change of the contract changes a file.

To accept a deliberate change: `PALMYRA_UPDATE_CONTRACT=1` and run this module. Every golden file
that differs from the running code is then rewritten and its test FAILS, saying which file it
rewrote, so that an update run can never be taken for a passing check; review `git diff
tests/data/contract/` and commit it with the change. A file that already matches is left alone and
its test passes. A run without the variable never writes anything.

Headers and access-log lines come from the real sidecar process in front of the fake engine of
the app tier (tests/helpers/procs.py, tests/helpers/fake_engine.py), started once for the module:
an in-process ASGI transport would bypass the bounded HTTP protocol (edge/protocol.py) that every
relayed request needs, and uvicorn's own headers (date) are part of what a client sees.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import inspect
import json
import os
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from palmyra_serve import __version__
from palmyra_serve.cli import build_parser
from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.app import SidecarApp, create_app
from palmyra_serve.sidecar.core import engine_errors, errors
from palmyra_serve.sidecar.core.metrics import tenant_families
from palmyra_serve.sidecar.observability.access_log import LOGGER_NAME
from tests.helpers import procs
from tests.helpers.api import completion
from tests.helpers.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "tests" / "data" / "contract"
UPDATE = "PALMYRA_UPDATE_CONTRACT"
# Stands for palmyra_serve.__version__ wherever the contract shows it: a release is not a change
# of the contract, and must not rewrite the golden files.
VERSION = "<palmyra_serve.__version__>"
# A client key the sidecar accepts (settings.placeholder_key refuses short or example ones).
API_KEY = "contract-test-key-5b0e2c7d"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


# --- golden files ---------------------------------------------------------------------------


def check_golden(name: str, data: object) -> None:
    """Compare `data` with tests/data/contract/<name>.json; in update mode rewrite it and fail."""
    path = CONTRACT / f"{name}.json"
    shown = path.relative_to(REPO).as_posix()
    text = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    old = path.read_text(encoding="utf-8") if path.is_file() else None
    if text == old:
        return
    if os.environ.get(UPDATE) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.fail(f"{shown} rewritten from the running code: review `git diff {shown}` and commit it", pytrace=False)
    if old is None:
        pytest.fail(f"{shown} is missing: write it with {UPDATE}=1, then review and commit it", pytrace=False)
    diff = "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), text.splitlines(keepends=True), f"{shown} (committed)", "running code"
        )
    )
    pytest.fail(
        f"the {name} contract changed. If that is deliberate, rerun with {UPDATE}=1 and commit the new "
        f"{shown} with the change; else the change broke what others depend on:\n{diff}",
        pytrace=False,
    )


def jsonable(value: object) -> Any:
    """A default or argument as JSON. Anything without an obvious, stable JSON form is refused, so a
    new kind of value is a decision made here rather than an object's repr (with its address) in a
    golden file."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, frozenset | set):
        return sorted(jsonable(v) for v in value)
    if isinstance(value, Path):
        return value.as_posix()
    raise TypeError(f"no JSON form chosen for {type(value).__name__} {value!r}: extend jsonable()")


def json_type(value: object) -> str:
    """The JSON type of a parsed value (bool before int: Python's bool is an int)."""
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if isinstance(value, kind):
            return name
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else "object"


def app_under_test() -> SidecarApp:
    """The sidecar app as serve() builds it, with a client key (so the keyed paths are keyed)."""
    return create_app(Settings(api_keys=[API_KEY]))


# --- 1. metrics -----------------------------------------------------------------------------


def metrics_contract() -> dict[str, Any]:
    """Every family on a fresh sidecar's /metrics page, from the registry create_app() builds (so the
    series the app's own wiring pre-creates, such as every readiness phase, are there too)."""
    registry = app_under_test().sidecar.metrics.registry
    # prometheus_client has no public accessor for a collector's label names, and a family whose
    # children are created on first use (requests by route and status) has no sample to read them
    # from; _collector_to_names, _name and _labelnames have been stable across its releases.
    label_names = {
        getattr(collector, "_name", None): list(getattr(collector, "_labelnames", ()))
        for collector in registry._collector_to_names
    }
    hidden = tenant_families(registry)  # the probe port's page only
    out: dict[str, Any] = {}
    for family in registry.collect():
        values: dict[str, set[str]] = {}
        buckets: list[str] = []
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label == "le":
                    if value not in buckets:
                        buckets.append(value)
                elif label != "version":  # palmyra_build_info's: the release, not a vocabulary
                    values.setdefault(label, set()).add(value)
        entry: dict[str, Any] = {
            "type": family.type,
            "labels": label_names[family.name],
            "precreated_label_values": {label: sorted(v) for label, v in values.items()},
            "client_port": family.name not in hidden,
        }
        if family.type == "histogram":
            entry["buckets"] = buckets  # the le values PromQL selects (le="2.0"), as exposed
        out[family.name] = entry
    return out


def test_metrics_contract() -> None:
    check_golden("metrics", metrics_contract())


# --- 2. errors ------------------------------------------------------------------------------

# Arguments for errors.py's factories, by parameter name: what a factory is called with here, not
# part of the contract. A factory with a parameter not named here fails the test until one is added.
SAMPLE_ARGS: dict[str, object] = {
    "allow": "POST",
    "allowed": "system, user, assistant",
    "code": errors.ErrorCode.RATE_LIMIT_TOKENS,
    "asked": 9,
    "cap": 8,
    "limit": 1024,
    "message": "a message",
    "method": "PUT",
    "param": "<param>",  # so that the golden file shows which factories echo their argument
    "path": "/v1/completions",
    "probe_paths": "/health, /ready",
    "request_id": "rid",
    "why": "a reason",
    "retry_after": 7,
    "role": "robot",
    "seconds": 1.5,
    "tenant": "search",
}
# Factories that pick another factory by a code: called with each code of their vocabulary (and
# one outside it, which shows the fallback).
DISPATCHERS = {"overloaded": ("reason", errors.OVERLOAD_CODES), "upstream": ("code", errors.UPSTREAM_CODES)}
OUTSIDE = "<any other code>"


async def _sent(exc: errors.ApiError, request_id: str | None, close: bool) -> tuple[int, list[str], dict]:
    """What send_error() writes for `exc`: status, header names, body."""
    messages: list[dict] = []

    async def send(message: dict) -> None:
        messages.append(message)

    await errors.send_error(send, exc, request_id, close)
    start, body = messages
    return start["status"], sorted(name.decode() for name, _ in start["headers"]), json.loads(body["body"])


def describe_error(exc: errors.ApiError) -> dict[str, Any]:
    status, headers, body = asyncio.run(_sent(exc, "rid", close=False))
    error = body["error"]
    assert status == exc.status
    return {
        "status": status,
        "type": error["type"],
        "code": error["code"],
        "param": error["param"],
        "body_fields": sorted(error),
        "headers": headers,
    }


def error_factories() -> dict[str, Any]:
    """Every public function of errors.py that returns an ApiError."""
    found = {}
    for name, func in inspect.getmembers(errors, inspect.isfunction):
        if func.__module__ != errors.__name__ or name.startswith("_"):
            continue
        returns = typing.get_type_hints(func).get("return")
        if isinstance(returns, type) and issubclass(returns, errors.ApiError):
            found[name] = func
    return found


def errors_contract() -> dict[str, Any]:
    factories: dict[str, Any] = {}
    for name, func in error_factories().items():
        params = list(inspect.signature(func).parameters)
        if name in DISPATCHERS:
            pick, codes = DISPATCHERS[name]
            rest = {p: SAMPLE_ARGS[p] for p in params if p != pick}
            factories[name] = {
                code: describe_error(func(**{pick: code if code != OUTSIDE else "no_such_code"}, **rest))
                for code in (*codes, OUTSIDE)
            }
            continue
        missing = [p for p in params if p not in SAMPLE_ARGS]
        assert not missing, f"errors.{name}: no sample argument for {missing}; add one to SAMPLE_ARGS"
        factories[name] = describe_error(func(**{p: SAMPLE_ARGS[p] for p in params}))
    vocabularies = {
        name: list(value)
        for name, value in vars(errors).items()
        if name.isupper() and isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    }
    constants = {
        name: value
        for module in (errors, engine_errors)
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str | int) and not isinstance(value, bool)
    }
    in_a_vocabulary = {code for codes in vocabularies.values() for code in codes}
    built = {f["code"] for f in factories.values() if "code" in f}  # the dispatchers' are among them
    # A refusal with no request id and the connection closed (the probe port's): what send_error writes.
    _, closing_headers, _ = asyncio.run(_sent(errors.not_found("GET", "/x"), None, close=True))
    return {
        "factories": factories,
        "vocabularies": vocabularies,
        "constants": constants,
        "codes_in_no_vocabulary": sorted(built - in_a_vocabulary),
        "vocabulary_codes_no_factory_builds": sorted(in_a_vocabulary - built),
        "headers_closing_without_request_id": closing_headers,
        "from_engine": engine_error_bodies(),
    }


def engine_error_bodies() -> dict[str, Any]:
    """How an engine's error reaches the client (engine_errors.from_engine), for vLLM's shapes: the
    client's fields, never the engine's 5xx text."""
    shapes = {
        "500 openai-shaped": (500, {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}),
        "400 openai-shaped": (
            400,
            {"error": {"message": "bad", "type": "BadRequestError", "param": "temperature", "code": 400}},
        ),
        "400 detail": (400, {"detail": "There was an error parsing the body"}),
        "401 framework": (401, {"error": "Unauthorized"}),
    }
    out = {}
    for name, (status, payload) in shapes.items():
        error = json.loads(engine_errors.from_engine(status, json.dumps(payload).encode(), "Reason", "rid"))["error"]
        out[name] = {
            "body_fields": sorted(error),
            "type": error["type"],
            "code": error["code"],
            "param": error["param"],
        }
    return out


def test_errors_contract() -> None:
    check_golden("errors", errors_contract())


# --- 3, 4. response headers and access-log lines, from the real process -------------------

# One request of each kind; the X-Request-Id finds its access-log line (and is never recorded).
CASES = ("completion_json", "completion_stream", "unauthorized", "admission_refused", "not_found", "client_disconnect")
# Access-log fields whose values come from a fixed vocabulary (recorded with their value); the
# others (timestamps, ids, durations, token counts) only by their JSON type.
VOCABULARY_FIELDS = ("level", "logger", "msg", "method", "path", "route", "status", "error", "client_disconnected")


def _header_names(resp: httpx.Response) -> list[str]:
    return sorted(name.decode().lower() for name, _ in resp.headers.raw)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Each kind of answer once, from a sidecar with keys on and room for exactly one generation in
    flight and none queued (adaptive admission at a ceiling of 1, queue of 0): a second generation
    while one streams is refused at once, with no timing involved."""
    log_dir = tmp_path_factory.mktemp("contract")
    env = {
        "PALMYRA_API_KEYS": API_KEY,
        "PALMYRA_ADMISSION_MAX_LIMIT": "1",
        "PALMYRA_ADMISSION_MIN_LIMIT": "1",
        "PALMYRA_MAX_QUEUE": "0",
        "PALMYRA_HEALTH_POLL_INTERVAL_S": "0.2",  # ready in a fraction of a second, not 2 s
    }
    with (
        procs.fake_engine(log_dir) as engine,
        procs.sidecar(engine.url, log_dir, extra_env=env, timeout_s=30) as sidecar,
        httpx.Client(timeout=10) as client,
    ):
        url = sidecar.url
        headers: dict[str, list[str]] = {}

        def rid(case: str) -> dict[str, str]:
            assert case in CASES
            return {"X-Request-Id": f"contract-{case}"}

        resp = client.post(
            f"{url}/v1/completions", json=completion(max_tokens=2), headers=AUTH | rid("completion_json")
        )
        assert resp.status_code == 200, resp.text
        headers["completion_json"] = _header_names(resp)

        body = completion(max_tokens=4, stream=True)
        with client.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH | rid("completion_stream")) as sse:
            assert sse.status_code == 200 and b"[DONE]" in sse.read()
        headers["completion_stream"] = _header_names(sse)

        resp = client.post(f"{url}/v1/completions", json=completion(), headers=rid("unauthorized"))
        assert resp.status_code == 401, resp.text
        headers["unauthorized"] = _header_names(resp)

        # A stream holds the one slot (its headers arrive only once it has it), so the next
        # generation is refused; then its client hangs up: the client disconnect.
        slow = completion("fake:slow", max_tokens=20, stream=True)
        with (
            httpx.Client(timeout=10) as holder,
            holder.stream("POST", f"{url}/v1/completions", json=slow, headers=AUTH | rid("client_disconnect")) as held,
        ):
            assert held.status_code == 200
            resp = client.post(f"{url}/v1/completions", json=completion(), headers=AUTH | rid("admission_refused"))
            assert resp.status_code == 429, resp.text
            headers["admission_refused"] = _header_names(resp)

        resp = client.get(f"{url}/v1/no-such-route", headers=AUTH | rid("not_found"))
        assert resp.status_code == 404, resp.text
        headers["not_found"] = _header_names(resp)

        # The control app's own refusal of a keyed path (the API document): not the relay's.
        resp = client.get(f"{url}/openapi.json")
        assert resp.status_code == 401, resp.text
        headers["unauthorized_control_path"] = _header_names(resp)

        def lines() -> dict[str, dict] | None:
            found = {}
            for line in sidecar.log().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # uvicorn's plain lines, or a line still being written
                if isinstance(entry, dict) and entry.get("logger") == LOGGER_NAME:
                    case = str(entry.get("request_id", "")).removeprefix("contract-")
                    if case in CASES:
                        found[case] = entry
            return found if set(found) == set(CASES) else None

        entries = wait_until(lines, 10, "an access-log line for every request")
        assert entries is not None
        yield {"headers": headers, "access_log": entries}


def test_response_headers_contract(traffic: dict[str, dict[str, Any]]) -> None:
    check_golden("headers", traffic["headers"])


def test_access_log_contract(traffic: dict[str, dict[str, Any]]) -> None:
    """Which keys each line has, by kind of request. Some keys depend on the engine's answer (the
    fake's JSON completion reports usage, so prompt_tokens; its stream does not); these are the
    key sets of the fake engine's answers, the same every run."""
    out = {}
    for case, entry in traffic["access_log"].items():
        out[case] = {
            "fields": {key: json_type(value) for key, value in entry.items()},
            "values": {key: entry[key] for key in VOCABULARY_FIELDS if key in entry},
        }
    check_golden("access_log", out)


# --- 5. OpenAPI -----------------------------------------------------------------------------


def test_openapi_contract() -> None:
    """The document /openapi.json serves: the control app's routes and every relayed route."""
    document = app_under_test().control.openapi()
    assert document["info"]["version"] == __version__
    check_golden("openapi", {**document, "info": {**document["info"], "version": VERSION}})


# --- 6. CLI ---------------------------------------------------------------------------------


def _action_kind(action: argparse.Action) -> str:
    # argparse's classes are its vocabulary of actions: _StoreTrueAction -> StoreTrue.
    return type(action).__name__.lstrip("_").removesuffix("Action")


def describe_parser(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """A parser's options and, recursively, its subcommands (argparse has no public accessor for
    either; _actions and _SubParsersAction are stable across Python releases)."""
    options: list[dict[str, Any]] = []
    out: dict[str, Any] = {"options": options}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out["subcommands"] = {
                "dest": action.dest,
                "required": action.required,
                "commands": {name: describe_parser(sub) for name, sub in action.choices.items()},
            }
            continue
        options.append(
            {
                "option_strings": action.option_strings,
                "dest": action.dest,
                # SUPPRESS: unset unless given, so that Settings reads PALMYRA_* (cli._settings).
                "default": "SUPPRESS" if action.default is argparse.SUPPRESS else jsonable(action.default),
                "choices": jsonable(action.choices),
                "required": action.required,
                "nargs": action.nargs,
                "type": getattr(action.type, "__name__", None),
                "action": _action_kind(action),
            }
        )
    return out


def test_cli_contract() -> None:
    check_golden("cli", describe_parser(build_parser()))


# --- 7. settings ----------------------------------------------------------------------------


def type_text(annotation: object) -> str:
    """An annotation as a short, stable text: `int | None`, `Literal['a', 'b']`, `list[str]`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(type_text(a) for a in args)}]"
    if isinstance(annotation, type):
        return annotation.__name__
    raise TypeError(f"no text chosen for the annotation {annotation!r}: extend type_text()")


def settings_contract() -> dict[str, Any]:
    prefix = Settings.model_config.get("env_prefix", "")
    variables = {}
    for name, field in Settings.model_fields.items():
        # An alias would change the variable's name; none is used, and this says so if one appears.
        assert field.alias is None and field.validation_alias is None, f"{name}: aliased; record its alias here"
        variables[f"{prefix}{name}".upper()] = {
            "field": name,
            "type": type_text(field.annotation),
            "default": jsonable(field.get_default(call_default_factory=True)),
            "required": field.is_required(),
            # Bounds (Ge, Gt) and markers such as NoDecode (PALMYRA_API_KEYS is comma-separated, not JSON).
            "constraints": [m.__name__ if isinstance(m, type) else repr(m) for m in field.metadata],
        }
    config = {k: v for k, v in Settings.model_config.items() if k in ("env_prefix", "extra", "case_sensitive")}
    return {"model_config": config, "variables": variables}


def test_settings_contract() -> None:
    check_golden("settings", settings_contract())
