"""The admission settings, one group of palmyra_serve.settings.Settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings


class AdmissionSettings(BaseSettings):
    """Admission: what enters the engine and when (docs/admission.md), and the bounds on what one
    request may cost it."""

    # --- the gate -----------------------------------------------------------------------------
    admission_mode: Literal["adaptive", "fixed"] = Field(
        "adaptive",
        description="adaptive: the limit on requests in the engine follows measured latency against the SLOs, "
        "under a ceiling read from the engine, and the queue holds only what can start within the TTFT SLO; "
        "fixed: max_in_flight, max_queue and queue_timeout_s as set.",
    )
    max_in_flight: int = Field(
        64, description="fixed mode: requests relayed to the engine at once; more wait in the queue."
    )
    max_queue: int = Field(256, description="Requests waiting for a slot (both modes: a hard cap); beyond that 429.")
    queue_timeout_s: float = Field(
        30.0, description="fixed mode: longest wait in the queue before 429 (adaptive derives it from slo_ttft_s)."
    )
    tokenize_max_in_flight: int = Field(
        4,
        ge=1,
        description="/tokenize and /detokenize relayed at once, in a gate of their own (both modes); more wait.",
    )
    tokenize_max_queue: int = Field(16, ge=0, description="/tokenize and /detokenize waiting; beyond that 429.")
    tokenize_queue_timeout_s: float = Field(
        5.0, gt=0, description="Longest a /tokenize or /detokenize waits for its gate before 429."
    )
    slo_ttft_s: float = Field(
        2.0, gt=0, description="Time-to-first-token objective (adaptive admission; bench/validate's)."
    )
    slo_itl_s: float = Field(0.25, gt=0, description="Mean inter-token gap objective (adaptive admission).")
    admission_min_limit: int = Field(2, description="adaptive: the lowest the limit goes.")
    admission_max_limit: int | None = Field(
        None,
        description="adaptive: the highest the limit goes; unset: from the engine at start, "
        "min(max-num-seqs, KV cache / admission_kv_tokens_per_request).",
    )
    admission_initial_limit: int | None = Field(
        None, description="adaptive: where the limit starts; unset: half the ceiling."
    )
    admission_kv_tokens_per_request: int = Field(
        2048, description="adaptive: KV-cache tokens one request is expected to hold (bounds the ceiling)."
    )
    admission_ttft_engine_share: float = Field(
        0.5, description="adaptive: share of slo_ttft_s the engine's own TTFT may use; the rest is queue."
    )
    admission_itl_share: float = Field(
        0.8, description="adaptive: the limit is cut when the ITL p90 passes this share of slo_itl_s."
    )
    admission_queue_headroom: float = Field(
        0.1, description="adaptive: share of slo_ttft_s kept out of the queue's wait (margin for the tail)."
    )
    admission_window_s: float = Field(1.0, description="adaptive: shortest interval between limit changes.")
    retry_after_max_s: int = Field(30, description="adaptive: cap on a computed Retry-After (429).")
    retry_after_s: int = Field(
        1, description="Retry-After seconds on 503 (and on 429 in fixed mode; adaptive computes it from the queue)."
    )

    # --- the cost of one request --------------------------------------------------------------
    max_tokens_cap: int | None = Field(
        None, description="Largest max_tokens / max_completion_tokens / min_tokens (400 beyond); unset: max-model-len."
    )
    max_choices: int = Field(
        8,
        description="Largest n (and best_of), and of prompts x n for a list of prompts: "
        "sequences per request (400 beyond).",
    )
    max_logprobs: int = Field(
        20, description="Largest logprobs / top_logprobs / prompt_logprobs (vLLM's own default cap)."
    )
    prompt_logprobs_max_tokens: int = Field(
        512,
        ge=0,
        description="Longest prompt (estimated tokens) for which prompt logprobs are served (prompt_logprobs, or "
        "echo with logprobs): each prompt position costs a log-softmax over the whole vocabulary.",
    )
    structured_max_repeat: int = Field(
        64,
        ge=0,
        description="Bounded repetitions a request's structured output may ask the grammar compiler to unroll "
        "(maxLength, minLength, {m,n} in patterns, regexes and grammars, summed): at 64, under 2 s of one "
        "compiler thread on a 2-core x86 host (docs/request-fields.md).",
    )
    structured_max_bytes: int = Field(
        16 * 1024, ge=0, description="Largest structured-output field (schema, regex, grammar, tools), serialised."
    )
    structured_max_choices: int = Field(1024, ge=0, description="Most entries of a choice list or a schema's enum.")
    structured_regex_grammar: bool = Field(
        True,
        description="Serve regex- and grammar-constrained output (structured_outputs.regex / .grammar, schema "
        "patterns stay); false refuses them with a 400.",
    )
