"""`palmyra-serve validate`: is the endpoint numerically right?

Greedy tokens from the endpoint (/v1/completions, prompt sent as token ids, temperature 0,
top-5 logprobs) are compared position by position with the same checkpoint run by Transformers in
fp32 on CPU. the reference adaptation's accuracy table (first-token agreement, 20-token match rate) plus, at
the first divergence, the margins on both sides and a verdict that tells rounding-level near-ties
from real faults (see accuracy.py). `--quick` is the reference adaptation's `validate_ascend.py`: does the endpoint
load and generate at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from palmyra_serve.tools.endpoint import add_key_arguments

if TYPE_CHECKING:
    import httpx

    from palmyra_serve.tools.accuracy import EndpointOutput

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
DEFAULT_MODEL = "palmyra-mini"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL, help="endpoint root (default %(default)s)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="served model name (default %(default)s)")
    add_key_arguments(parser)
    parser.add_argument(
        "--model-dir",
        default=None,
        help="the same checkpoint, for the fp32 Transformers reference (not needed with --quick)",
    )
    parser.add_argument("--tokens", type=int, default=20, help="greedy tokens per prompt (default %(default)s)")
    parser.add_argument(
        "--near-tie",
        type=float,
        default=None,
        help="near-tie threshold in units of the reference logit std (default 0.2)",
    )
    parser.add_argument("--out", default=None, help="directory for report.md and results.json")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-request timeout in seconds")
    parser.add_argument(
        "--quick", action="store_true", help="only check that the endpoint lists the model and generates (no reference)"
    )


def _client(args: argparse.Namespace) -> httpx.Client:
    import httpx

    from palmyra_serve.tools.endpoint import api_key, headers

    return httpx.Client(base_url=args.base_url.rstrip("/"), headers=headers(api_key(args)), timeout=args.timeout)


def fetch_greedy(client: httpx.Client, model: str, ids: list[int], n: int) -> EndpointOutput:
    """The endpoint's greedy continuation of `ids` with its top-5 logprobs, as EndpointOutput."""
    from palmyra_serve.tools.accuracy import EndpointOutput
    from palmyra_serve.tools.endpoint import check_response, token_id

    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": n,
        "temperature": 0,
        "logprobs": 5,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
    }
    r = client.post("/v1/completions", json=body)
    choice = check_response(r.status_code, r.text)["choices"][0]
    lp = choice.get("logprobs") or {}
    tops = [
        {tid: v for k, v in (d or {}).items() if (tid := token_id(k)) is not None}
        for d in (lp.get("top_logprobs") or [])
    ]
    return EndpointOutput(
        tokens=[token_id(t) for t in lp.get("tokens") or []],
        token_logprobs=list(lp.get("token_logprobs") or []),
        top_logprobs=tops,
        finish_reason=choice.get("finish_reason"),
    )


def run_quick(args: argparse.Namespace) -> int:
    import httpx

    from palmyra_serve.tools.endpoint import EndpointError, check_response, parse_models
    from palmyra_serve.tools.prompts import QUICK_PROMPT

    checks: list[dict] = []
    with _client(args) as client:
        try:
            t0 = time.perf_counter()
            r = client.get("/v1/models")
            info = parse_models(check_response(r.status_code, r.text), args.model)
            checks.append(
                {"check": "model listed", "ok": True, "detail": f"{info.id} (max_model_len {info.max_model_len})"}
            )
            body = {"model": args.model, "prompt": QUICK_PROMPT, "max_tokens": 8, "temperature": 0}
            r = client.post("/v1/completions", json=body)
            out = check_response(r.status_code, r.text)
            n = int((out.get("usage") or {}).get("completion_tokens") or 0)
            text = out["choices"][0].get("text", "")
            checks.append(
                {
                    "check": "generates",
                    "ok": n > 0,
                    "detail": f"{n} tokens in {time.perf_counter() - t0:.2f}s: {text!r}",
                }
            )
        except (EndpointError, httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
            checks.append({"check": "endpoint", "ok": False, "detail": f"{type(exc).__name__}: {exc}"})
    ok = all(c["ok"] for c in checks)
    for c in checks:
        print(f"[{'ok' if c['ok'] else 'FAIL'}] {c['check']}: {c['detail']}")
    print("quick check passed" if ok else "quick check FAILED")
    if args.out:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "quick.json").write_text(json.dumps({"ok": ok, "checks": checks}, indent=2), encoding="utf-8")
    return 0 if ok else 1


def served_version(client: httpx.Client) -> str | None:
    """vLLM's own /version: answered by the bare engine; the sidecar does not relay it."""
    import httpx

    try:
        r = client.get("/version")
        return str(r.json()["version"]) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def run(args: argparse.Namespace) -> int:
    if args.quick:
        return run_quick(args)
    if not args.model_dir:
        print("error: --model-dir is required (the checkpoint the reference runs); or use --quick", file=sys.stderr)
        return 2
    from palmyra_serve.tools import accuracy, environment, report
    from palmyra_serve.tools.endpoint import EndpointError
    from palmyra_serve.tools.prompts import VALIDATE_PROMPTS
    from palmyra_serve.tools.reference import Model

    near_tie = accuracy.DEFAULT_NEAR_TIE if args.near_tie is None else args.near_tie
    from palmyra_serve.model.stand_in import marker

    stand_in = marker(Path(args.model_dir))
    print(
        f"loading the fp32 reference from {args.model_dir}" + (" (random-weight stand-in)" if stand_in else ""),
        file=sys.stderr,
    )
    ref_model = Model(args.model_dir)
    results = []
    with _client(args) as client:
        version = served_version(client)
        for name, text in VALIDATE_PROMPTS:
            ids = ref_model.encode(text)
            try:
                out = fetch_greedy(client, args.model, ids, args.tokens)
            except EndpointError as exc:
                print(f"error: {name}: {exc}", file=sys.stderr)
                return 2
            ref = ref_model.greedy(ids, args.tokens)
            res = accuracy.compare(name, text, len(ids), ref, out, near_tie)
            results.append(res)
            print(
                f"{name:>10}: {res.verdict:<20} first token {'ok' if res.first_token_match else 'DIFF'}, "
                f"match {res.match_rate:.0%}  {res.reason}",
                file=sys.stderr,
            )
    doc = {
        "schema": "palmyra-validate/1",
        "endpoint": args.base_url,
        "environment": environment.describe(args.base_url, version),
        "model": args.model,
        "model_dir": str(args.model_dir),
        "stand_in": stand_in,
        "tokens": args.tokens,
        "near_tie_threshold_std": near_tie,
        "summary": accuracy.summary(results, near_tie),
        "prompts": [r.to_dict() for r in results],
    }
    md = report.validate_markdown(doc)
    print(md)
    if args.out:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
        (out_dir / "report.md").write_text(md, encoding="utf-8")
    return 1 if doc["summary"]["suspicious"] else 0
