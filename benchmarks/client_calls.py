"""Nine calls as clients make them, with the unmodified `openai` and `anthropic` SDKs, against one
base URL (bare vLLM, or the sidecar in front of it): a table of pass or fail, with each failure's
first line.

1. `responses.create`, plain
2. `responses.stream`, streamed (the deltas joined equal the final response's text)
3. `responses.create` with `instructions`
4. `chat.completions.parse` with a strict two-value schema (`answer: Literal["yes", "no"]`,
   max_completion_tokens 32)
5. a named tool call (`tool_choice` naming a function whose one parameter is an enum): a call of
   that function with JSON arguments
6. `tool_choice="required"`: at least one tool call, as `required` promises
7. `tool_choice="auto"`: an answer, with or without a call
8. a tool result's round trip (the assistant's tool_calls and a `tool` message, then an answer)
9. Anthropic's `messages.create`

A call passes when the SDK returns its typed result without raising and that result has the shape
the call asks for (the table's detail column says what came back). What a random-weight model
writes inside that shape (a tool call's arguments, the text) is the model's, reported, not judged.

    python -m benchmarks.client_calls --base-url http://127.0.0.1:8911 --api-key KEY --label "0.32 sidecar" \\
        --json /tmp/calls-032-sidecar.json
    python -m benchmarks.client_calls --matrix /tmp/calls-*.json     # the results side by side
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import anthropic
import openai

from tests.helpers.api import ASK, MODEL, WEATHER, Verdict

TIMEOUT_S = 120.0


class Clients:
    def __init__(self, base_url: str, api_key: str) -> None:
        base = base_url.rstrip("/")
        self.openai = openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=TIMEOUT_S)
        self.anthropic = anthropic.Anthropic(base_url=base, api_key=api_key, max_retries=0, timeout=TIMEOUT_S)


def _arguments(call: Any) -> str:
    """A tool call's arguments as the model wrote them, and whether they are the schema's."""
    try:
        args = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return f"arguments not JSON: {call.function.arguments[:60]!r}"
    fits = isinstance(args, dict) and set(args) == {"city"} and args["city"] in ("Paris", "Rome")
    return f"arguments {json.dumps(args)[:60]} ({'the schema' if fits else 'not the schema'})"


def responses_plain(c: Clients) -> str:
    resp = c.openai.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16)
    if resp.usage is None or not resp.output:
        raise AssertionError(f"no output or usage: {resp.model_dump_json()[:200]}")
    return f"{resp.status}, {resp.usage.output_tokens} output tokens"


def responses_streamed(c: Clients) -> str:
    with c.openai.responses.stream(model=MODEL, input="Count to five.", max_output_tokens=16) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    if deltas != final.output_text:
        raise AssertionError(f"deltas {deltas!r} differ from the final text {final.output_text!r}")
    tokens = final.usage.output_tokens if final.usage else None
    return f"{final.status}, {tokens} output tokens, deltas = final text"


def responses_instructed(c: Clients) -> str:
    resp = c.openai.responses.create(model=MODEL, instructions="Answer in French.", input="Hello", max_output_tokens=16)
    if resp.usage is None:
        raise AssertionError("no usage")
    return f"{resp.status}, {resp.usage.input_tokens} input tokens"


def parse_two_values(c: Clients) -> str:
    resp = c.openai.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Is water wet? Answer yes or no."}],
        response_format=Verdict,
        max_completion_tokens=32,
    )
    parsed = resp.choices[0].message.parsed
    if parsed is None:
        raise AssertionError(f"nothing parsed: {resp.choices[0].message.content!r}")
    tokens = resp.usage.completion_tokens if resp.usage else None
    return f"answer {parsed.answer!r} in {tokens} tokens"


def named_tool(c: Clients) -> str:
    resp = c.openai.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_completion_tokens=48,
        temperature=0,
    )
    calls = resp.choices[0].message.tool_calls or []
    if len(calls) != 1 or calls[0].type != "function" or calls[0].function.name != "get_weather":
        content = resp.choices[0].message.content or ""
        raise AssertionError(
            f"not one call of get_weather; finish_reason {resp.choices[0].finish_reason}, {content[:80]!r}"
        )
    return f"get_weather called, {_arguments(calls[0])}"


def _tool_choice(c: Clients, choice: Literal["required", "auto"]) -> str:
    resp = c.openai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=choice, max_completion_tokens=48, temperature=0
    )
    message = resp.choices[0].message
    calls = message.tool_calls or []
    described = ", ".join(f"{call.function.name}: {_arguments(call)}" for call in calls if call.type == "function")
    tokens = resp.usage.completion_tokens if resp.usage else None
    said = f"finish_reason {resp.choices[0].finish_reason} after {tokens} tokens, {len(calls)} tool calls" + (
        f" ({described})" if described else f", content {(message.content or '')[:80]!r}"
    )
    if choice == "required" and not calls:
        raise AssertionError(f"no tool call: {said}")
    return said


def tool_required(c: Clients) -> str:
    return _tool_choice(c, "required")


def tool_auto(c: Clients) -> str:
    return _tool_choice(c, "auto")


def tool_round_trip(c: Clients) -> str:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    resp = c.openai.chat.completions.create(
        model=MODEL,
        messages=[
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        ],
        tools=[WEATHER],
        max_completion_tokens=16,
    )
    if resp.usage is None or resp.usage.completion_tokens < 1:
        raise AssertionError("no answer after the tool result")
    return f"finish_reason {resp.choices[0].finish_reason}, {resp.usage.completion_tokens} tokens"


def messages_create(c: Clients) -> str:
    message = c.anthropic.messages.create(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "Say hello."}]
    )
    if not message.content or message.content[0].type != "text":
        raise AssertionError(f"no text block: {message.model_dump_json()[:200]}")
    return f"stop_reason {message.stop_reason}, {message.usage.output_tokens} output tokens"


CALLS: list[tuple[str, Callable[[Clients], str]]] = [
    ("responses.create, plain", responses_plain),
    ("responses.stream, streamed", responses_streamed),
    ("responses.create with instructions", responses_instructed),
    ("chat.completions.parse, strict yes/no schema, 32 tokens", parse_two_values),
    ("named tool call (enum parameter)", named_tool),
    ('tool_choice="required"', tool_required),
    ('tool_choice="auto"', tool_auto),
    ("tool result round trip", tool_round_trip),
    ("anthropic messages.create", messages_create),
]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_all(base_url: str, api_key: str) -> list[dict[str, Any]]:
    clients = Clients(base_url, api_key)
    rows = []
    for number, (name, call) in enumerate(CALLS, 1):
        t0 = time.perf_counter()
        try:
            detail = call(clients)
            ok = True
        except Exception as exc:  # every failure is a row of the table, whatever raised it
            detail = first_line(exc)
            ok = False
        rows.append({"n": number, "call": name, "pass": ok, "detail": detail, "s": round(time.perf_counter() - t0, 2)})
    return rows


def sdk_versions() -> str:
    return f"openai {openai.__version__}, anthropic {anthropic.__version__}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| # | call | result | detail, or the error's first line |", "|---|---|---|---|"]
    for row in rows:
        detail = row["detail"].replace("|", "\\|")
        lines.append(f"| {row['n']} | {row['call']} | {'pass' if row['pass'] else 'FAIL'} | {detail} |")
    return "\n".join(lines)


def matrix(docs: list[dict[str, Any]]) -> str:
    head = "| # | call | " + " | ".join(doc["label"] for doc in docs) + " |"
    lines = [head, "|---|---|" + "---|" * len(docs)]
    for i, (name, _) in enumerate(CALLS):
        cells = ["pass" if doc["rows"][i]["pass"] else "FAIL" for doc in docs]
        lines.append(f"| {i + 1} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="the server's root, without /v1: http://127.0.0.1:8911")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--label", default="", help="the column's name in --matrix")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--matrix", type=Path, nargs="+", help="print the --json files side by side instead")
    args = parser.parse_args(argv)
    if args.matrix:
        print(matrix([json.loads(p.read_text()) for p in args.matrix]))
        return 0
    if not args.base_url:
        parser.error("--base-url is needed")
    rows = run_all(args.base_url, args.api_key)
    print(f"{args.base_url} ({args.label or 'unlabelled'}); {sdk_versions()}\n")
    print(table(rows))
    if args.json:
        doc = {"label": args.label or args.base_url, "base_url": args.base_url, "sdks": sdk_versions(), "rows": rows}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(row["pass"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
