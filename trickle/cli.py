"""The ``trickle`` command.

Operators: ``demo-model`` builds the offline demo model, ``up`` runs the whole stack.
Clients (talking to ``TRICKLE_URL``, default http://127.0.0.1:8000, with ``TRICKLE_API_KEY``
as bearer token if set): ``generate``, ``jobs get``, ``batch submit``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from worker.config import DEFAULT_MODEL_DIR, PROJECT_ROOT, load_settings

PR_SET_PDEATHSIG = 1
DEFAULT_URL = "http://127.0.0.1:8000"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trickle", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo-model", help="build the offline demo model if missing")
    demo.add_argument("--output", type=Path, default=DEFAULT_MODEL_DIR)
    demo.add_argument("--force", action="store_true", help="rebuild even if present")
    up = commands.add_parser("up", help="embedded Redis + the Procfile (web and worker)")
    up.add_argument("-c", "--concurrency", default="", help="honcho concurrency, e.g. worker=2")
    gen = commands.add_parser("generate", help="generate text for a prompt")
    gen.add_argument("prompt")
    gen.add_argument("--model")
    gen.add_argument("--max-tokens", type=int)
    gen.add_argument("--temperature", type=float)
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
    if args.command == "up":
        return run_stack(args.concurrency)
    return run_client_command(args)


def run_client_command(args: argparse.Namespace) -> int:
    from trickle import commands
    from trickle.client import ApiError, TrickleClient

    client = TrickleClient(
        os.environ.get("TRICKLE_URL", DEFAULT_URL), os.environ.get("TRICKLE_API_KEY", "")
    )
    try:
        if args.command == "generate":
            return commands.generate(
                client, args.prompt, args.model, args.max_tokens, args.temperature, args.stream
            )
        if args.command == "jobs":
            return commands.get_job(client, args.job_id)
        return commands.submit_batch(client, args.file, args.wait, args.output)
    except (ApiError, OSError) as exc:
        print(f"trickle: {exc}", file=sys.stderr)
        return 2


def build_demo(output: Path, force: bool) -> int:
    from worker.demo_model import build_demo_model, demo_model_ready

    if demo_model_ready(output) and not force:
        print(f"demo model present at {output}")
        return 0
    print(f"building the demo model into {output} ...", flush=True)
    build_demo_model(output, force=force)
    print(f"demo model ready at {output}")
    return 0


def _die_with_parent() -> None:
    """Children get SIGTERM if `trickle up` dies, so nothing it started outlives it."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def run_stack(concurrency: str) -> int:
    _die_with_parent()  # make's SIGTERM kills only make; this carries it on to us
    env = dict(os.environ)
    # The Procfile's gunicorn and celery are the ones installed beside this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    settings = load_settings(environ=env)
    redis_process = None
    if "TRICKLE_REDIS_URL" not in env:
        from trickle.redis_server import port_in_use, start_redis

        port = urlparse(settings.redis.url).port or 6399
        if port_in_use(port):
            print(f"port {port} is taken; set TRICKLE_REDIS_URL or free it", file=sys.stderr)
            return 1
        print(f"starting embedded Redis on 127.0.0.1:{port} (AOF on, data in .trickle/redis)")
        redis_process = start_redis(port, PROJECT_ROOT / ".trickle" / "redis", new_session=True)
        env["TRICKLE_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    honcho = [sys.executable, "-m", "honcho", "-f", str(PROJECT_ROOT / "Procfile"), "start"]
    if concurrency:
        honcho += ["-c", concurrency]
    stack = subprocess.Popen(
        honcho, env=env, cwd=PROJECT_ROOT, start_new_session=True, preexec_fn=_die_with_parent
    )

    def stop(signum: int, _frame: object) -> None:
        if stack.poll() is None:
            stack.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        code = stack.wait()
    finally:
        if redis_process is not None:
            from trickle.redis_server import stop_redis

            stop_redis(redis_process)
    return 0 if code in (0, -signal.SIGTERM, 128 + signal.SIGTERM) else code


if __name__ == "__main__":
    raise SystemExit(main())
