"""Client commands of the `trickle` CLI: generate, jobs get, batch submit."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ops.client import TrickleClient

FINAL_STATUSES = ("succeeded", "failed", "canceled", "expired")


def generate(
    client: TrickleClient,
    prompt: str,
    model: str | None,
    max_tokens: int | None,
    temperature: float | None,
    stream: bool,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    *,
    ignore_eos: bool = False,
) -> int:
    """Print the answer (token by token with --stream), then a line of TTFT and tokens/s."""
    body: dict[str, Any] = {"prompt": prompt}
    for name, value in (("model", model), ("max_tokens", max_tokens), ("temperature", temperature)):
        if value is not None:
            body[name] = value
    if ignore_eos:
        body["ignore_eos"] = True
    started = time.monotonic()
    job = client.submit_job(body, wait=0 if stream else 60)
    first_token: float | None = None
    tokens = 0
    if stream:
        for event in client.events(job["id"]):
            if event.event == "token":
                text = json.loads(event.data)["text"]
                tokens += 1
                if first_token is None:
                    first_token = time.monotonic()
                out.write(text)
                out.flush()
            elif event.event == "done":
                job = json.loads(event.data)
            elif event.event == "error":
                err.write(f"\nstream error: {json.loads(event.data)['error']['message']}\n")
                return 1
        out.write("\n")
    else:
        while job["status"] not in FINAL_STATUSES:
            time.sleep(0.2)
            job = client.get_job(job["id"])
        out.write(job["output"] + "\n")
    elapsed = time.monotonic() - started
    metrics = job.get("metrics") or {}
    ttft = (first_token - started) if first_token else metrics.get("time_to_first_token_seconds")
    tps = (tokens - 1) / (time.monotonic() - first_token) if first_token and tokens > 1 else None
    tps = tps or metrics.get("tokens_per_second")
    err.write(
        f"{job['id']} · {job['status']} ({job.get('finish_reason')}) · "
        f"{job['usage']['completion_tokens']} tokens · "
        f"TTFT {_seconds(ttft)} · {_rate(tps)} · {elapsed:.2f} s total\n"
    )
    return 0 if job["status"] == "succeeded" else 1


def print_job(client: TrickleClient, job_id: str, out: TextIO = sys.stdout) -> int:
    out.write(json.dumps(client.get_job(job_id), indent=2) + "\n")
    return 0


def submit_batch(
    client: TrickleClient,
    path: Path,
    wait: bool,
    output: Path | None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Submit a JSONL file; with --wait, show progress, then write the output JSONL."""
    batch = client.create_batch(path.read_bytes())
    err.write(f"{batch['id']}: {batch['request_counts']['total']} requests\n")
    if not wait:
        out.write(json.dumps(batch) + "\n")
        return 0
    while batch["status"] not in ("completed", "cancelled", "failed"):
        _progress(batch, err)
        time.sleep(0.5)
        batch = client.get_batch(batch["id"])
    _progress(batch, err)
    err.write("\n")
    result = client.batch_output(batch["id"])
    if output is not None:
        output.write_text(result)
        err.write(f"output written to {output}\n")
    else:
        out.write(result)
    return 0 if batch["request_counts"]["failed"] == 0 else 1


def _progress(batch: dict[str, Any], err: TextIO, width: int = 30) -> None:
    counts = batch["request_counts"]
    done = counts["completed"] + counts["failed"]
    filled = int(width * done / max(counts["total"], 1))
    err.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{counts['total']} "
        f"({counts['failed']} failed) {batch['status']}"
    )
    err.flush()


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} tokens/s"
