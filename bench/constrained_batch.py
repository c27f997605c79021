"""Constrained jobs sharing a batch against as many unconstrained ones of the same length: the
engine process's code (``EngineRunner.run``) in this process, its pipe replaced by a recorder.

For each model, ``--rows`` prompts (the person schema, greedy):
- unconstrained: one batch of the rows, end token off, each row as many tokens as the
  constrained answers' mean length;
- constrained: one batch of the rows with the schema (rows share calls,
  worker/engine/shared_rows.py);
- one constrained row alone (a forced tool call's arguments are such a schema);
- the constrained rows one at a time, each alone (what the sharing gate picks for a model that
  refuses past its break-even, worker/engine/sharing_gate.py; on one lane).
Prints tokens/s of both batches and their ratio (goal >= 0.8), time to first token p50 of each
and their ratio (goal <= 1.5), the constrained batch's time over one row's (goal <= 2), the
rows one at a time against the shared batch, and the gate's verdict: the refusal rate the
shared batch reported against the break-even at the engine's warm-up prices.

    python -m bench.constrained_batch [--models demo,bench] [--rows 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.constrained import GRAMMAR, PROMPT, model_path
from bench.harness.stats import median
from trickle.config.sections import ModelSettings, available_cores
from worker.engine.batch_command import BatchCommand
from worker.engine.process import EngineRunner
from worker.engine.request import EngineRequest, SamplingKey
from worker.engine.sharing_gate import RefusalRate, SharingGate
from worker.engine.step_times import StepTimes


class Recorder:
    """Stands in for a lane's pipe: counts tokens and notes each row's first."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.tokens = 0
        self.first: dict[int, float] = {}
        self.refusals = (0, 0)  # (proposed, refused), from the batch's end

    def send(self, message: tuple[Any, ...]) -> None:
        if message[0] == "end":
            self.refusals = message[3]
        if message[0] != "steps":
            return
        now = time.perf_counter()
        for _, tokens in message[2]:
            self.tokens += len(tokens)
            for position, *_ in tokens:
                self.first.setdefault(position, now - self.started)


def command(runner: EngineRunner, rows: int, max_new: int, grammar: bool) -> BatchCommand:
    tokenizer = runner.tokenizer
    prompts = [tokenizer.to_pieces(tokenizer.encode(f"{PROMPT}{'x ' * i}")) for i in range(rows)]
    return BatchCommand(
        batch_id=0,
        prompts=prompts,
        max_new_tokens=[max_new] * rows,
        slots=list(range(rows)),
        temperature=1.0,
        top_k=1,
        top_p=1.0,
        repetition_penalty=1.0,
        ignore_eos=not grammar,
        grammars=[GRAMMAR] * rows if grammar else [],
        grammar_replays=[""] * rows if grammar else [],
        top_logprobs=[0] * rows if grammar else [],
    )


def timed(
    runner: EngineRunner, batch: BatchCommand, refusals: RefusalRate | None = None
) -> tuple[float, int, float]:
    """Seconds, tokens and the median time to first token of one batch (its refusals noted
    in ``refusals``)."""
    recorder = Recorder()
    runner.run(batch, recorder)  # type: ignore[arg-type]
    seconds = time.perf_counter() - recorder.started
    if refusals is not None:
        refusals.observe(*recorder.refusals)
    return seconds, recorder.tokens, median(list(recorder.first.values())) or 0.0


def one_at_a_time(runner: EngineRunner, rows: int, max_new: int) -> tuple[float, int, float]:
    """The constrained rows each alone, in turn: seconds, tokens and the median time to first
    token from the start of the first."""
    started = time.perf_counter()
    tokens = 0
    first: list[float] = []
    whole = command(runner, rows, max_new, True)
    for row in range(rows):
        single = command(runner, 1, max_new, True)
        single.prompts[0] = whole.prompts[row]
        offset = time.perf_counter() - started
        _, made, ttft = timed(runner, single)
        tokens += made
        first.append(offset + ttft)
    return time.perf_counter() - started, tokens, median(first) or 0.0


def break_even(runner: EngineRunner, rows: int, max_new: int) -> float:
    """The gate's break-even for a row of this prompt, at the engine's warm-up prices."""
    ids = runner.tokenizer.encode(PROMPT)
    request = EngineRequest(ids, max_new, SamplingKey(1.0, 1, 1.0, 1.0, False), grammar=GRAMMAR)
    times = StepTimes(runner.step_seconds)
    gate = SharingGate(RefusalRate(), times, runner.prefill_seconds_per_token, rows)
    return gate.break_even(request)


def measure(key: str, rows: int, runs: int, max_tokens: int) -> dict[str, float]:
    model = ModelSettings(name=key, path=str(model_path(key)), device="cpu")
    runner = EngineRunner(model.with_threads(available_cores()), memoryview(bytearray(rows)))
    timed(runner, command(runner, rows, max_tokens, True))  # compiles the grammar, warms up
    refusals = RefusalRate()
    tight = [timed(runner, command(runner, rows, max_tokens, True), refusals) for _ in range(runs)]
    length = max(1, round(median([float(t[1]) for t in tight]) or 0) // rows)
    free = [timed(runner, command(runner, rows, length, False)) for _ in range(runs)]
    one = [timed(runner, command(runner, 1, max_tokens, True)) for _ in range(runs)]
    alone = [one_at_a_time(runner, rows, max_tokens) for _ in range(runs)]
    alone_s = median([t[0] for t in alone]) or 1.0
    alone_rate = (median([float(t[1]) for t in alone]) or 0.0) / alone_s
    tight_s = median([t[0] for t in tight]) or 1.0
    free_s = median([t[0] for t in free]) or 1.0
    tight_rate = (median([float(t[1]) for t in tight]) or 0.0) / tight_s
    free_rate = (median([float(t[1]) for t in free]) or 0.0) / free_s
    tight_ttft = median([t[2] for t in tight]) or 0.0
    free_ttft = median([t[2] for t in free]) or 1e-9
    return {
        "length": float(length),
        "constrained_tok_s": tight_rate,
        "unconstrained_tok_s": free_rate,
        "throughput_ratio": tight_rate / free_rate,
        "ttft_ratio": tight_ttft / free_ttft,
        "burst_over_one": tight_s / (median([t[0] for t in one]) or 1.0),
        "alone_tok_s": alone_rate,
        "alone_over_shared": alone_s / tight_s,
        "alone_over_one": alone_s / (median([t[0] for t in one]) or 1.0),
        "refusal_rate": refusals.rate,
        "break_even": break_even(runner, rows, max_tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,bench")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=100)
    args = parser.parse_args()
    for key in args.models.split(","):
        row = measure(key, args.rows, args.runs, args.max_tokens)
        print(
            f"{key:>5}: {args.rows} rows of {row['length']:.0f} tokens | unconstrained "
            f"{row['unconstrained_tok_s']:.0f} tok/s | constrained "
            f"{row['constrained_tok_s']:.0f} tok/s (x{row['throughput_ratio']:.2f}, goal >= 0.8)"
            f" | TTFT p50 x{row['ttft_ratio']:.2f} (goal <= 1.5) | burst over one row "
            f"x{row['burst_over_one']:.2f} (goal <= 2)"
        )
        verdict = "share" if row["refusal_rate"] < row["break_even"] else "alone"
        print(
            f"{key:>5}: rows one at a time {row['alone_tok_s']:.0f} tok/s, "
            f"x{row['alone_over_shared']:.2f} the shared batch's time, "
            f"x{row['alone_over_one']:.2f} one row's | refusals per proposed token "
            f"{row['refusal_rate']:.3f}, break-even {row['break_even']:.3f}: the gate runs "
            f"them {verdict}"
        )


if __name__ == "__main__":
    main()
