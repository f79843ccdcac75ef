"""A script that runs vLLM's own OpenAI-server argument parser over a JSON map of argv lists and
prints what each parsed to (or its exit code): the static tier holds the launcher's engine
commands against vLLM 0.18.0's source (the Ascend image) and the CUDA image's vLLM with it.
PARSER_MODULE is replaced by the module that defines FlexibleArgumentParser in that version."""

from __future__ import annotations

PARSE = r"""
import json, sys
import vllm, vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()
from vllm.entrypoints.openai.cli_args import make_arg_parser
from PARSER_MODULE import FlexibleArgumentParser
results = {}
for key, argv in json.loads(sys.argv[1]).items():
    parser = make_arg_parser(FlexibleArgumentParser())
    try:
        args = parser.parse_args(argv)
        cc = args.compilation_config
        if isinstance(cc, dict):
            sizes = cc.get("cudagraph_capture_sizes")
        else:
            sizes = getattr(cc, "cudagraph_capture_sizes", None)
        results[key] = {"ok": True, "model": args.model, "served": args.served_model_name, "len": args.max_model_len,
                        "eager": args.enforce_eager, "capture_sizes": sizes,
                        "additional": getattr(args, "additional_config", None),
                        "policy": getattr(args, "scheduling_policy", None),
                        "otlp": getattr(args, "otlp_traces_endpoint", None)}
    except SystemExit as exc:
        results[key] = {"ok": False, "code": exc.code}
print("PARSED " + json.dumps({"vllm": vllm.__file__, "results": results}))
"""
