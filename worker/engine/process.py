"""The engine process: CTranslate2 alone, so its decoding loop never waits for other Python.

CTranslate2 calls the generation callback once per sequence per step, and each call needs the
GIL. Inside the Celery worker that GIL is shared with Celery's consumer, the publisher,
detokenization, stop strings, metrics and the other lane's callbacks: every bit of Python work
there stalled the engine (a busy Python thread cut a demo-model stream from 3,663 to 751
tokens/s). Here, the only Python that runs while a batch decodes is the callback, which records
the token id, reads the sequence's stop flag from shared memory and, once every sequence of the
batch has spoken in a step, hands the whole step to the worker as one pipe message.

Everything else (detokenization, stop strings, events, Redis) happens in the worker process,
which stops a sequence by setting its flag; the callback returns True on its next token.

Steps faster than ``engine_step_coalesce_ms`` share a message: on a small model a step takes a
fraction of a millisecond, and a message per step (a pickle, a write, a wake-up and an unpickle
on the worker's side) would cost the worker's receiving side more CPU per token than the step
itself (docs/performance.md has the figures). A step with a sequence's
first tokens or its end is sent at once, so time to first token and a job's end are not held;
each step carries its start time on the engine's clock (``time.monotonic``, the same in every
process of a machine), so the worker still times every step.

Wire format, one pair of pipes per lane (pickled tuples, for speed; both ends live in this
package):
  worker -> engine: ``BatchCommand.to_dict()``, or None to stop.
  engine -> worker: ("ready", ``EngineReady.to_dict()``) | ("fatal", message) on lane 0 at
                    start, then per batch
                    ("steps", batch_id, steps)... ("end", batch_id, error or None,
                    (proposed, refused)), where steps is a list of (started_at, tokens), one
                    per decoding step, tokens a list of (position, step, token_id, logprob,
                    is_last), and (proposed, refused) the tokens the batch's grammars were
                    proposed and refused (worker/engine/sharing_gate.py decides by them).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from trickle.config.sections import ModelSettings
from trickle.heap import IdleTrim
from trickle.tokenization import load_tokenizer
from worker.engine.alternatives import Scores, row_logits
from worker.engine.batch_command import BatchCommand
from worker.engine.constrained import ConstrainedRun
from worker.engine.engine_ready import EngineReady
from worker.engine.flags import attach_flags
from worker.engine.grammar_runs import GrammarRuns
from worker.engine.malloc import keep_freed_memory
from worker.engine.model_hints import resolve_compute_type
from worker.engine.parent_watch import exit_with_parent
from worker.engine.request import Logprob
from worker.engine.seeded import SeedGate, job_generator
from worker.engine.shared_rows import SharedRow, SharedRows
from worker.engine.step_stream import StepStream

log = logging.getLogger(__name__)

# One engine thread's pipe ends in this process: (commands from the worker, events to it).
LanePipes = tuple[Connection, Connection]


WARM_UP_STEPS = 8  # decoding steps timed per batch size at start


class EngineRunner:
    """Owns the CTranslate2 generator in the engine process; runs one command per lane."""

    def __init__(self, model: ModelSettings, flags: memoryview):
        import ctranslate2  # only the engine process loads the engine

        self._ct2 = ctranslate2
        self.settings = model
        self.device = resolve_device(model.device)
        self.tokenizer = load_tokenizer(model)
        self._compute_type = resolve_compute_type(model.path, model.compute_type)
        self.generator = ctranslate2.Generator(
            model.path,
            device=self.device,
            device_index=list(model.device_index),
            compute_type=self._compute_type,
            inter_threads=model.inter_threads,
            intra_threads=model.intra_threads,
        )
        # The model's end tokens, not just the vocabulary's: CTranslate2 also keeps them out
        # before min_length (a job's stop_token_ids are ended by the worker, SequenceState).
        self._end_tokens = sorted(self.tokenizer.end_ids)
        self._flags = flags
        self._scores = Scores(self.tokenizer)
        self._grammars = GrammarRuns(self.tokenizer, self._end_tokens, self._scores)
        self.step_seconds = self._warm_up()
        self.prefill_seconds_per_token = self._time_prefill()

    def _warm_up(self) -> dict[int, float]:
        """One small batch per engine thread before the first job: CTranslate2's first calls
        run about twice as slow (allocations), which users would otherwise pay as TTFT. Then a
        decoding step is timed alone and at ``max_batch_size``, for the restart policy."""
        start = self.tokenizer.to_pieces(self.tokenizer.encode("The"))
        for _ in range(self.settings.lanes):
            self.generator.generate_batch([start] * 4, max_length=8, include_prompt_in_result=False)
        sizes = sorted({1, self.settings.max_batch_size})
        return {size: self._time_steps(start, size) for size in sizes}

    def _time_steps(self, prompt: list[str], size: int) -> float:
        """Seconds per decoding step of ``size`` sequences (the prompt's forward pass excluded)."""
        moments: list[float] = []

        def note(step: Any) -> bool:
            if step.batch_id == 0:
                moments.append(time.perf_counter())
            return False

        self.generator.generate_batch(
            [prompt] * size,
            max_length=WARM_UP_STEPS,
            include_prompt_in_result=False,
            end_token=[],
            callback=note,
        )
        if len(moments) < 2:
            return 0.0
        return (moments[-1] - moments[0]) / (len(moments) - 1)

    def _time_prefill(self, tokens: int = 256) -> float:
        """Seconds per prompt token of one forward pass over a long prompt (a restart's
        catch-up feeds prompt + generated tokens again)."""
        piece = self.tokenizer.to_pieces(self.tokenizer.encode("The"))
        prompt = (piece * tokens)[:tokens]
        elapsed = 0.0
        for _ in range(2):  # the first call of a new length pays its allocations
            started = time.perf_counter()
            self.generator.generate_batch([prompt], max_length=1, include_prompt_in_result=False)
            elapsed = time.perf_counter() - started
        return elapsed / tokens

    def run(self, command: BatchCommand, events: Connection) -> None:
        """Run one batch, sending its steps and then its end on this lane's pipe."""
        coalesce = self.settings.tuning.engine_step_coalesce_ms / 1000
        stream = StepStream(command, self._flags, events.send, coalesce)
        error: str | None = None
        runs: list[ConstrainedRun] = []  # the batch's grammar runs, as they are made
        try:
            if command.grammar(0) is not None and len(command.prompts) == 1:
                self._generate_constrained(command, stream, runs)
            elif command.seed is not None:
                self._generate_seeded(command, stream)
            elif command.reads_logits():
                self._generate_shared(command, stream, runs)
            else:
                self._generate(command, stream)
        except Exception as exc:  # the worker fails the batch's jobs with this message
            log.exception("generate_batch failed")
            error = f"{type(exc).__name__}: {exc}"
        stream.flush()
        refusals = (sum(run.proposed for run in runs), sum(run.refused for run in runs))
        events.send(("end", command.batch_id, error, refusals))

    def _generate(self, command: BatchCommand, stream: StepStream) -> None:
        token = stream.token

        def callback(step: Any) -> bool:
            return token(step.batch_id, step.step, step.token_id, step.log_prob, step.is_last)

        self._generate_batch(self.generator, command, command.prompts, callback)

    def _generate_seeded(self, command: BatchCommand, stream: StepStream) -> None:
        """One job alone on a Generator of its own, seeded before its first draw
        (worker.engine.seeded)."""
        token = stream.token
        score = self._scores.for_job(command.alternatives(0), command.top_k, command.temperature)

        def run(generator: Any, drawn: Callable[[], None]) -> None:
            def callback(step: Any) -> bool:
                drawn()  # its token was drawn: the seed is the thread's now
                logprob = score(step, lambda: row_logits(step))
                return token(0, step.step, step.token_id, logprob, step.is_last)

            whole = [*(command.static_prompt or []), *command.prompts[0]]
            self._generate_batch(generator, command, [whole], callback, static=False)

        self._on_seeded_generator(command, run)

    def _generate_shared(
        self, command: BatchCommand, stream: StepStream, runs: list[ConstrainedRun]
    ) -> None:
        """Rows that read their own logits (grammars, alternatives), as shared calls
        (worker/engine/shared_rows.py)."""
        rows = []
        for i, prompt in enumerate(command.prompts):
            grammar = command.grammar(i)
            run = None if grammar is None else self._constrained_run(command, i, grammar, runs)
            if run is not None:
                run.start(command.max_new_tokens[i])
            scorer = self._scores.for_job(
                command.alternatives(i), command.top_k, command.temperature
            )
            rows.append(SharedRow(i, list(prompt), command.max_new_tokens[i], run, scorer, True))
        shared = SharedRows(rows, self._to_piece, stream.token, stream.expect)

        def generate(
            prompts: list[list[str]], max_new: int, callback: Callable[[Any], bool]
        ) -> None:
            # min_tokens only on the first call: a batch that restarts its rows has none
            # (policy.alone); a row of alternatives alone restarts only after a failed check.
            lengths = (max_new, command.min_tokens if shared.calls <= 1 else 0)
            self._generate_batch(
                self.generator, command, prompts, callback, lengths=lengths, logits=True
            )

        shared.run(generate, generate)
        if shared.calls > 1 or shared.lost:
            log.info("batch %d: %d shared calls", command.batch_id, shared.calls)

    def _on_seeded_generator(
        self, command: BatchCommand, run: Callable[[Any, Callable[[], None]], None]
    ) -> None:
        """Run ``run(generator, drawn)`` on a Generator loaded for this job and seeded with its
        seed; ``run`` calls ``drawn`` once its first token is drawn. Its whole prompt goes as
        one: whether the scheduler found a shared prefix must not change a seeded job's
        numbers."""
        generator = job_generator(self._ct2, self.settings, self.device, self._compute_type)
        try:
            with SeedGate(self._ct2, command.seed or 0) as gate:
                run(generator, gate.drawn)
        finally:
            generator.unload_model()

    def _generate_batch(
        self,
        generator: Any,
        command: BatchCommand,
        prompts: list[list[str]],
        callback: Callable[[Any], bool],
        static: bool = True,
        lengths: tuple[int, int] | None = None,
        logits: bool = False,
    ) -> None:
        """One ``generate_batch`` with the command's options; ``lengths``: (max, min) new
        tokens when not the command's (a constrained job's later calls), ``logits``: copy the
        vocabulary's logits every step even without ``top_logprobs``."""
        max_new, min_new = lengths or (max(command.max_new_tokens), command.min_tokens)
        generator.generate_batch(
            prompts,
            max_length=max_new,
            sampling_temperature=command.temperature,
            sampling_topk=command.top_k,
            sampling_topp=command.top_p,
            repetition_penalty=command.repetition_penalty,
            beam_size=1,
            return_scores=True,  # the sampled token's log-probability reaches the callback
            # Copies the vocabulary's logits every step: only for jobs that need them.
            return_logits_vocab=logits or command.reads_logits(),
            include_prompt_in_result=False,
            end_token=[] if command.ignore_eos else self._end_tokens,
            min_length=min_new,
            static_prompt=command.static_prompt if static else None,
            cache_static_prompt=command.cache_static_prompt,
            callback=callback,
        )

    def _generate_constrained(
        self, command: BatchCommand, stream: StepStream, runs: list[ConstrainedRun]
    ) -> None:
        """One sequence whose every token the grammar accepts (worker/engine/constrained.py);
        a seeded one on its own seeded Generator, whose draws then repeat across restarts."""
        if command.seed is None:
            self._constrained(command, stream, self.generator, lambda: None, runs)
        else:
            self._on_seeded_generator(
                command,
                lambda generator, drawn: self._constrained(command, stream, generator, drawn, runs),
            )

    def _constrained_run(
        self, command: BatchCommand, row: int, grammar: str, runs: list[ConstrainedRun]
    ) -> ConstrainedRun:
        """Row ``row``'s grammar run, noted in ``runs`` (the batch's end reports its refusals)."""
        run = self._grammars.run(command, row, grammar, self._to_piece)
        runs.append(run)
        return run

    def _to_piece(self, token: int) -> str:
        return self.tokenizer.to_pieces([token])[0]

    def _constrained(
        self,
        command: BatchCommand,
        stream: StepStream,
        generator: Any,
        drawn: Callable[[], None],
        runs: list[ConstrainedRun],
    ) -> None:
        """One constrained row alone on its calls (seeded, or the batch's only row)."""
        run = self._constrained_run(command, 0, command.grammar(0) or "", runs)
        static = command.seed is None  # a seeded job's whole prompt goes as one

        def generate(
            pieces: list[str], max_new: int, min_new: int, callback: Callable[[Any], bool]
        ) -> None:
            def on_token(step: Any) -> bool:
                drawn()
                return callback(step)

            # A refused token's step: its logits give the replacement's scores.
            lengths = (max_new, min_new)
            self._generate_batch(
                generator, command, [pieces], on_token, static, lengths, logits=True
            )

        steps = itertools.count()

        def sink(token: int, logprob: Logprob, last: bool) -> bool:
            return stream.token(0, next(steps), token, logprob, last)

        prompt = (
            command.prompts[0] if static else [*(command.static_prompt or []), *command.prompts[0]]
        )
        run.run(prompt, command.max_new_tokens[0], generate, sink)

    def close(self) -> None:
        self.generator.unload_model()


def resolve_device(device: str) -> str:
    """``auto`` picks CUDA when CTranslate2 sees a GPU, the CPU otherwise."""
    if device != "auto":
        return device
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


def serve(
    model: ModelSettings, lanes: list[tuple[Connection, Connection]], flags_name: str
) -> None:
    """The engine process: load, then one thread per lane runs that lane's batches.

    Each lane has its own pair of pipes, so a step goes from the engine's callback straight to
    the worker thread waiting for that batch. A closed pipe means the worker is gone.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s engine: %(message)s")
    exit_with_parent()  # first: a worker killed while the model loads leaves nothing behind
    if model.tuning.engine_niceness and resolve_device(model.device) != "cuda":
        # The engine's threads would take every core from the latency-bound Python around it
        # (the web tier answering POSTs, the worker claiming and publishing): yield to them.
        # On a GPU (``auto`` resolved to it included) the engine waits on the device anyway.
        os.nice(model.tuning.engine_niceness)
    if model.tuning.engine_keep_freed_memory:
        keep_freed_memory()  # before the model loads: every buffer after it comes from the heap
    shared = attach_flags(flags_name)
    first_events = lanes[0][1]
    try:
        if shared.buf is None:
            raise RuntimeError("the stop flags' shared memory is not mapped")
        runner = EngineRunner(model, shared.buf)
    except Exception as exc:
        first_events.send(("fatal", f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    ready = EngineReady(runner.device, runner.step_seconds, runner.prefill_seconds_per_token)
    first_events.send(("ready", ready.to_dict()))
    stopped = threading.Event()
    idle_after = model.tuning.engine_trim_after_idle_seconds
    trim = IdleTrim(idle_after) if idle_after > 0 else None

    def lane(commands: Connection, events: Connection) -> None:
        while True:
            try:
                message = commands.recv()
            except (EOFError, OSError):
                break  # the worker is gone: nothing is left to serve
            if message is None:
                break
            if trim is not None:
                trim.begin()
            try:
                runner.run(BatchCommand.from_dict(message), events)
            finally:
                if trim is not None:
                    trim.end()
        stopped.set()

    for commands, events in lanes:
        threading.Thread(target=lane, args=(commands, events), daemon=True).start()
    stopped.wait()
    # Skip interpreter teardown: a Generator freed there, mid-batch, can abort the process.
    os._exit(0)
