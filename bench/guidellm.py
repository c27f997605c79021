"""Load Trickle's /v1/chat/completions with GuideLLM: Poisson arrivals, one run per rate.

GuideLLM (0.8.1) pulls in torch, so it lives in a venv of its own, kept out of CI and out of
the project's dependencies (sentencepiece converts our tokenizer for it):

    python -m venv /opt/guidellm
    /opt/guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1 sentencepiece

Then, with a stack running (`make up`), from the project venv (standard library only):

    .venv/bin/python bench/guidellm.py --guidellm /opt/guidellm/bin/guidellm \
        --url http://127.0.0.1:8000 --model demo --tokenizer-model models/demo/tokenizer.model \
        --rates 1,4,8,20 --requests 100,100,200,200 --output-tokens 128 --out bench/results/guidellm

GuideLLM runs unchanged and offline. Its synthetic prompts need a Hugging Face tokenizer, so
the model's SentencePiece file is converted once into OUT/hf-tokenizer (checked against
sentencepiece). Each request is `stream: true`, `stream_options: {include_usage,
continuous_usage_stats}`, `max_completion_tokens: N`, `ignore_eos: true` (so exactly N tokens)
and one user message whose content is a list of text parts. GuideLLM's TTFT runs from sending
the request headers to the first chunk with non-empty `delta.content` (the role chunk does not
count); its ITL is per request (last token - first token) / (tokens - 1), and the percentiles
are over those per-request means, weighted by tokens, not over single gaps. Output tokens/s is
the usage count GuideLLM reads from the stream, over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CONVERT = """
import shutil, sys, tempfile
import sentencepiece
from transformers.tokenization_utils_tokenizers import TokenizersBackend
model, out = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as src:
    shutil.copy(model, src + "/tokenizer.model")
    tok = TokenizersBackend.from_pretrained(src)
sample = "Return the socket's address.\\n  If x > 2: \\u00e9 {} [1, 2]"
expected = sentencepiece.SentencePieceProcessor(model_file=model).encode(sample)
if tok.encode(sample, add_special_tokens=False) != expected:
    sys.exit("converted tokenizer disagrees with sentencepiece")
tok.save_pretrained(out)
"""

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
COLUMNS = ("rate", "ok", "err", "ttft_p50", "ttft_p95", "ttft_p99", "itl_p50", "itl_p99",
           "out_tok/s", "tok/req")  # fmt: skip


def build_tokenizer(guidellm: Path, model: Path, out: Path) -> None:
    """Convert the SentencePiece model to a HF tokenizer dir with GuideLLM's own Python."""
    if (out / "tokenizer.json").exists():
        return
    python = guidellm.parent / "python"
    env = {**os.environ, **OFFLINE}
    subprocess.run([str(python), "-c", CONVERT, str(model), str(out)], check=True, env=env)


def run_rate(args: argparse.Namespace, rate: float, requests: int, tokenizer: Path) -> Path:
    """One `guidellm run` at a Poisson rate; returns its JSON report."""
    report: Path = args.out / f"rate-{rate:g}.json"
    command = [
        str(args.guidellm), "run",
        "--backend", f"kind=openai_http,target={args.url},model={args.model}",
        "--profile", f"kind=poisson,rate={rate:g}",
        "--constraint", f"kind=max_requests,count={requests}",
        "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                  f"output_tokens={args.output_tokens}",
        "--tokenizer", f"kind=hf_auto,model={tokenizer}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, **OFFLINE}
    if args.worker_processes:
        env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(args.worker_processes)
    log = args.out / f"rate-{rate:g}.log"
    print(f"rate {rate:g}/s, {requests} requests -> {report} (log {log})", flush=True)
    with log.open("w") as log_file:
        done = subprocess.run(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise SystemExit(f"guidellm failed at rate {rate:g} (exit {done.returncode})")
    return report


def summarize(report: Path) -> tuple[list[str], list[str]]:
    """One table row from a GuideLLM JSON report, plus the distinct error messages."""
    bench = json.loads(report.read_text())["benchmarks"][0]
    metrics = bench["metrics"]

    def pct(name: str, p: str) -> str:
        return f"{metrics[name]['successful']['percentiles'][p]:.1f}"

    totals = metrics["request_totals"]
    errors = sorted({str(r["info"].get("error")) for r in bench["requests"]["errored"]})
    row = [
        f"{bench['config']['strategy']['rate']:g}",
        str(totals["successful"]),
        str(totals["errored"] + totals["incomplete"]),
        pct("time_to_first_token_ms", "p50"),
        pct("time_to_first_token_ms", "p95"),
        pct("time_to_first_token_ms", "p99"),
        pct("inter_token_latency_ms", "p50"),
        pct("inter_token_latency_ms", "p99"),
        f"{metrics['output_tokens_per_second']['total']['mean']:.1f}",
        f"{metrics['output_token_count']['successful']['median']:g}",
    ]
    return row, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--guidellm", type=Path, required=True, help="its venv's bin/guidellm")
    parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--tokenizer-model", type=Path, required=True, help="tokenizer.model")
    parser.add_argument("--rates", default="1,4,8,20", help="requests/s, comma-separated")
    parser.add_argument("--requests", default="100", help="per rate: N, or one N per rate")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--worker-processes", type=int, default=0, help="GuideLLM's (10)")
    parser.add_argument("--out", type=Path, required=True, help="reports go here")
    parser.add_argument("--no-run", action="store_true", help="only summarize reports in --out")
    args = parser.parse_args()

    rates = [float(r) for r in args.rates.split(",")]
    counts = [int(n) for n in args.requests.split(",")]
    if len(counts) not in (1, len(rates)):
        parser.error("--requests takes one count or one per rate")
    counts = counts * len(rates) if len(counts) == 1 else counts
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = (args.out / "hf-tokenizer").resolve()
    if not args.no_run:
        build_tokenizer(args.guidellm, args.tokenizer_model.resolve(), tokenizer)
        for rate, count in zip(rates, counts, strict=True):
            run_rate(args, rate, count, tokenizer)

    rows, errors = [list(COLUMNS)], {}
    for rate in rates:
        row, errs = summarize(args.out / f"rate-{rate:g}.json")
        rows.append(row)
        errors.update({e: rate for e in errs})
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    table = "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    table += "\n(ms; ITL percentiles over per-request means; err includes incomplete)\n"
    table += "".join(f"error at rate {rate:g}: {e}\n" for e, rate in errors.items())
    print(table, end="")
    (args.out / "summary.txt").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
