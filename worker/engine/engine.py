"""The engine as the worker sees it: a tokenizer here, CTranslate2 in its own process.

One ``Engine`` per served model per worker process. The generator lives in a child process
(``worker.engine.process``) so that no Python work in the worker (Celery, the publisher,
detokenization, stop strings) ever holds the GIL its decoding loop needs. ``generate`` keeps a
simple, blocking contract: it runs one batch and calls ``on_step`` for every token, on the
calling thread, as whole decoding steps arrive; ``on_step`` returning True stops that sequence
(through a shared-memory flag the engine's callback reads at its next token). This module never
imports CTranslate2, so the worker process stays light and starts fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

from trickle.config.sections import ModelSettings, available_cores
from trickle.params import GenerationParams
from trickle.tokenization import load_tokenizer
from worker.engine.batch_command import BatchCommand
from worker.engine.engine_ready import EngineReady
from worker.engine.flags import create_flags
from worker.engine.prefix import SHARED
from worker.engine.prefix_cache import PrefixCacheState
from worker.engine.process import serve
from worker.engine.request import (
    EngineError,
    EngineRequest,
    StepCallback,
    StepClock,
    reads_logits,
)
from worker.engine.sharing_gate import RefusalRate

log = logging.getLogger(__name__)

# Stop-flag slots per engine: one per sequence in flight (batch size x lanes stays far below).
MAX_SLOTS = 4096
START_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class Lane:
    """One engine thread's pipes: commands to it, its steps back."""

    commands: Connection
    events: Connection
    generation: int  # which engine process these pipes lead to


class Engine:
    def __init__(self, model: ModelSettings, shares_slots: bool = False):
        """The engine runs the model's spare lanes besides its ordinary ones (``self.lanes``,
        trickle/config/lanes.py): with ``shares_slots`` (two API keys or more:
        ``Settings.shares_slots``) the tenants' reserve, else overflow lanes. ``settings``
        still says the ordinary ones."""
        if not (Path(model.path) / "model.bin").is_file():
            raise ValueError(
                f"model {model.name!r}: no CTranslate2 model at {model.path} "
                "(run `trickle demo-model` or fix models.<name>.path)"
            )
        self.settings = model = model.with_threads(available_cores())
        self.lanes = model.engine_lanes(shares_slots)
        # What the engine process runs: the spare lanes' replicas on every device too.
        self._process_settings = dataclasses.replace(model, inter_threads=self.lanes.per_device)
        self.tokenizer = load_tokenizer(model)
        # Each engine start maps a segment of its own (worker/engine/flags.py); the ones of
        # earlier starts stay mapped here (a thread may still write a stale flag) until close.
        self._segments: list[SharedMemory] = []
        self._free_slots = list(range(MAX_SLOTS))
        self._batch_ids = itertools.count()
        self._lock = threading.Lock()
        self._restart_lock = threading.Lock()
        self._in_flight = 0  # batches between _enter and _leave (under the restart lock)
        self._recycle_wanted = False
        self._broken = False  # a lane's pipe broke: the process is dead or dying
        self._generation = 0
        self.device = "cpu"
        self.warm_step_seconds: dict[int, float] = {}  # step time by batch size, from warm-up
        self.prefill_seconds_per_token = 0.0  # one prompt token's share of a forward pass
        self._cache = PrefixCacheState(model.prefix_cache_tokens)
        # The model's grammar refusals, as each batch's end reports them (the sharing gate's).
        self.refusals = RefusalRate()
        self._start()

    def _start(self) -> None:
        """Spawn the engine process and wait until its model is loaded and warm."""
        context = multiprocessing.get_context("spawn")
        segment = create_flags(MAX_SLOTS)
        try:
            self._spawn(context, segment)
        finally:
            segment.unlink()  # the engine has attached (or failed): no name is left behind
        self._segments.append(segment)
        self._flags = _buffer(segment)
        for lane in self._all_lanes:
            self._lanes.put(lane)

    def _spawn(self, context: Any, segment: SharedMemory) -> None:
        self._generation += 1
        ours: list[Lane] = []
        theirs: list[tuple[Connection, Connection]] = []
        self._cache = self._cache.emptied()  # a new process starts with CTranslate2's empty
        for _ in range(self._process_settings.lanes):
            commands_out, commands_in = context.Pipe(duplex=False)
            events_out, events_in = context.Pipe(duplex=False)
            ours.append(Lane(commands_in, events_out, self._generation))
            theirs.append((commands_out, events_in))
        self._process = context.Process(
            target=serve,
            args=(self._process_settings, theirs, segment.name),
            name=f"trickle-engine-{self.settings.name}",
            daemon=True,
        )
        self._process.start()
        # Keep only our ends, so either side sees EOF the moment the other one dies.
        for commands_out, events_in in theirs:
            commands_out.close()
            events_in.close()
        self._all_lanes = ours
        self._lanes: queue.SimpleQueue[Lane] = queue.SimpleQueue()
        first = ours[0].events
        if not first.poll(START_TIMEOUT_SECONDS):
            self._process.kill()
            raise ValueError(f"model {self.settings.name!r}: the engine did not start in time")
        try:
            kind, detail = first.recv()
        except EOFError:
            kind, detail = "fatal", f"the engine process exited (code {self._process.exitcode})"
        if kind != "ready":
            self._process.join(timeout=5)
            raise ValueError(f"model {self.settings.name!r} could not be loaded: {detail}")
        ready = EngineReady.from_dict(detail)
        self.device = ready.device
        self.warm_step_seconds = ready.step_seconds
        self.prefill_seconds_per_token = ready.prefill_seconds_per_token

    def _enter(self) -> None:
        """Before a batch: start a new engine process if this one died, or if its prefix
        cache is spent on prefixes the table evicted and no batch runs (CTranslate2 frees a
        cached state only with its process); then count the batch in."""
        with self._restart_lock:
            if self._recycle_wanted and self._in_flight == 0:
                log.info("engine process for %s: recycled to free evicted prefixes", self.name)
                self._recycle_wanted = False
                self._restart()
            elif not self._process.is_alive() or self._broken:
                log.error("engine process for %s died; starting a new one", self.name)
                self._restart()
            self._in_flight += 1

    def _leave(self) -> None:
        with self._restart_lock:
            self._in_flight -= 1

    def _restart(self) -> None:
        self._process.kill()  # dead or idle: make sure, and reap it
        self._process.join(timeout=10)
        self._close_lanes()
        self._broken = False
        self._start()

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def process_id(self) -> int | None:
        """The engine process's pid: a new one after a restart or a recycle."""
        pid: int | None = self._process.pid
        return pid

    def forget_prefix(self, prefix: tuple[int, ...]) -> None:
        """The prefix table evicted ``prefix`` (in every partition): its cached state, if any,
        is dead weight until the engine process is recycled."""
        with self._lock:
            self._cache.forget(prefix)

    def _close_lanes(self) -> None:
        for lane in self._all_lanes:
            lane.commands.close()
            lane.events.close()

    def close(self) -> None:
        """Stop the engine process and free the shared flags."""
        for lane in self._all_lanes:
            with contextlib.suppress(OSError, ValueError):
                lane.commands.send(None)
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)
        self._close_lanes()
        for segment in self._segments:
            with contextlib.suppress(BufferError):  # a view still held: freed at exit
                segment.close()

    @property
    def end_ids(self) -> frozenset[int]:
        """Every token that ends a sequence: the tokenizer's and the model's extra ones."""
        return self.tokenizer.end_ids

    def stop_ids(self, params: GenerationParams) -> frozenset[int]:
        """The ids that end one job: the end tokens (unless ignore_eos) and its stop_token_ids."""
        ends = frozenset() if params.ignore_eos else self.end_ids
        return ends | frozenset(params.stop_token_ids)

    def prefix_cached(self, prefix: tuple[int, ...], partition: str = SHARED) -> bool:
        """Whether a batch of ``partition`` with this static prompt starts from CTranslate2's
        cached state."""
        with self._lock:
            return self._cache.warm(partition, prefix)

    def generate(
        self,
        requests: Sequence[EngineRequest],
        on_step: StepCallback,
        clock: StepClock | None = None,
    ) -> None:
        """Run one batch to completion; every request must share one ``SamplingKey``.
        ``clock`` says, while ``on_step`` runs, when the engine began that token's step."""
        sampling = requests[0].sampling
        if any(request.sampling != sampling for request in requests):
            raise ValueError("a batch must share one sampling configuration")
        seed = requests[0].seed
        if seed is not None and len(requests) != 1:
            raise ValueError("seeded requests run one at a time")
        if len({reads_logits(request) for request in requests}) != 1:
            raise ValueError("rows that read their logits share batches only with each other")
        if any(not request.prompt_ids for request in requests):
            raise ValueError("the prompt is empty and the model adds no start token")
        prefix = requests[0].prefix
        partition = requests[0].cache_partition
        if any(r.prefix != prefix or (prefix and r.cache_partition != partition) for r in requests):
            raise ValueError("a batch must share one static prompt and its partition")
        if any(len(request.prompt_ids) <= len(prefix) for request in requests):
            raise ValueError("a prompt must be longer than its shared prefix")
        self._enter()
        try:
            self._run(requests, on_step, clock, prefix, partition)
        finally:
            self._leave()

    def _run(
        self,
        requests: Sequence[EngineRequest],
        on_step: StepCallback,
        clock: StepClock | None,
        prefix: tuple[int, ...],
        partition: str,
    ) -> None:
        sampling = requests[0].sampling
        seed = requests[0].seed
        with self._lock:
            use_cache = bool(prefix) and self._cache.may_use(partition, prefix)
            if prefix and not use_cache and self._cache.wants_recycle(partition, prefix):
                self._recycle_wanted = True  # at the next batch that finds the engine idle
        slots = self._take_slots(len(requests))
        batch_id = next(self._batch_ids)
        reading = requests if reads_logits(requests[0]) else []  # per-row logits options
        command = BatchCommand(
            batch_id=batch_id,
            prompts=[self.tokenizer.to_pieces(list(r.prompt_ids[len(prefix) :])) for r in requests],
            static_prompt=self.tokenizer.to_pieces(list(prefix)) if prefix else None,
            cache_static_prompt=use_cache,
            max_new_tokens=[r.max_new_tokens for r in requests],
            slots=slots,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            repetition_penalty=sampling.repetition_penalty,
            ignore_eos=sampling.ignore_eos,
            min_tokens=sampling.min_tokens,
            seed=seed,
            grammars=[r.grammar for r in reading],
            grammar_replays=[r.grammar_replay for r in reading],
            top_logprobs=[r.top_logprobs for r in reading],
        )
        flags = self._flags
        lanes = self._lanes
        lane = lanes.get()  # a free engine thread (the scheduler never asks for more)
        try:
            lane.commands.send(command.to_dict())
            while True:
                message = lane.events.recv()
                if message[0] == "end":
                    self.refusals.observe(*message[3])
                    if message[2] is not None:
                        raise EngineError(message[2])
                    if prefix:
                        with self._lock:
                            self._cache.ran(partition, prefix, use_cache)
                    return
                for started_at, tokens in message[2]:
                    if clock is not None:
                        clock.started_at = started_at
                    for position, step, token_id, logprob, is_last in tokens:
                        if on_step(position, step, token_id, logprob, is_last):
                            flags[slots[position]] = 1
        except (EOFError, OSError) as exc:
            if lane.generation == self._generation:
                self._broken = True  # the next batch starts a new engine process
            self._process.join(timeout=1)
            code = self._process.exitcode
            raise EngineError(f"the engine process exited (code {code})") from exc
        finally:
            lanes.put(lane)
            with self._lock:
                self._free_slots.extend(slots)

    def _take_slots(self, count: int) -> list[int]:
        with self._lock:
            if count > len(self._free_slots):
                raise EngineError("too many sequences in flight for the engine's stop flags")
            slots = [self._free_slots.pop() for _ in range(count)]
        flags = self._flags
        for slot in slots:
            flags[slot] = 0
        return slots


def _buffer(shared: SharedMemory) -> memoryview:
    if shared.buf is None:
        raise EngineError("shared memory for the engine's stop flags is not mapped")
    return shared.buf
