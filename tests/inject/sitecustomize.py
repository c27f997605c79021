"""Fault injection for a worker started with this folder on PYTHONPATH (test_faults_recovery).

Python imports ``sitecustomize`` at start-up, so this wraps the third-party libraries the worker
uses, never Trickle's own modules (which are being rewritten), and only for prompts carrying a
marker character, so warm-up and ordinary jobs run untouched:

- a prompt with U+2622 (radioactive) makes CTranslate2's ``generate_batch`` raise: the whole
  engine call fails, with every job batched into it;
- a prompt with U+2620 (skull) makes SentencePiece's ``decode`` raise on that job's ids: one
  job's tokens cannot be processed while the rest of its batch goes on.

The first two characters are byte-fallback pieces in the demo vocabulary; their last byte marks
the job. A third marker (below) makes the worker die as it stores the result.
"""

from __future__ import annotations

from typing import Any

import ctranslate2
import sentencepiece

ENGINE_MARKER = "<0xA2>"  # last byte of U+2622
TOKEN_MARKER = "<0xA0>"  # last byte of U+2620


class _FailingGenerator(ctranslate2.Generator):  # type: ignore[misc]
    def generate_batch(self, prompts: list[list[str]], *args: Any, **kwargs: Any) -> Any:
        if any(ENGINE_MARKER in prompt for prompt in prompts):
            raise RuntimeError("injected engine failure")
        return super().generate_batch(prompts, *args, **kwargs)


_decode = sentencepiece.SentencePieceProcessor.decode


def _failing_decode(self: Any, ids: Any, *args: Any, **kwargs: Any) -> Any:
    if (
        isinstance(ids, list)
        and ids
        and isinstance(ids[0], int)
        and self.piece_to_id(TOKEN_MARKER) in ids
    ):
        raise ValueError("injected detokenizer failure")
    return _decode(self, ids, *args, **kwargs)


ctranslate2.Generator = _FailingGenerator
sentencepiece.SentencePieceProcessor.decode = _failing_decode


# --- a worker that dies as it stores a marked job's result -----------------------------------
# A prompt with U+2623 (biohazard): when a pipeline carries that job's final state (a script
# call whose arguments set "status" to a terminal value), the rest of the pipeline (its last
# tokens) is sent, then the process is SIGKILLed before the final state is.

import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402

import redis  # noqa: E402

KILL_MARKER = "\u2623"
_TERMINAL = {"succeeded", "failed", "canceled"}
_execute = redis.client.Pipeline.execute


def _is_final_write(args: tuple[Any, ...]) -> bool:
    if not args or str(args[0]).upper() not in ("EVALSHA", "EVAL"):
        return False
    values = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
    return any(values[i] == "status" and values[i + 1] in _TERMINAL for i in range(len(values) - 1))


def _marked(pipe: Any, args: tuple[Any, ...]) -> bool:
    numkeys = int(args[2])
    # A job's hash is the key that ends in ":job:<job id>" (its other keys add a suffix).
    job_keys = [str(k) for k in args[3 : 3 + numkeys] if re.search(r":job:job_[0-9a-f]+$", str(k))]
    probe = redis.Redis(connection_pool=pipe.connection_pool)
    for key in job_keys:
        prompt = probe.hget(key, "prompt")
        if isinstance(prompt, bytes):
            prompt = prompt.decode()
        if prompt and KILL_MARKER in prompt:
            return True
    return False


def _dying_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
    doomed = [
        entry
        for entry in self.command_stack
        if _is_final_write(entry[0]) and _marked(self, entry[0])
    ]
    if not doomed:
        return _execute(self, *args, **kwargs)
    self.command_stack = [entry for entry in self.command_stack if entry not in doomed]
    if self.command_stack:
        _execute(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
    return None


redis.client.Pipeline.execute = _dying_execute
