"""A model whose greedy output is a script: a fixed cycle of token ids, chosen to be hard on
detokenization (multi-byte characters split into byte-fallback pieces, a stray continuation
byte that forms no character, pieces with and without the word-boundary marker).

Built like the demo model (``ops.model_builders.demo.save_bigram_model``) from a table where each
id of the cycle has one likely successor, so CTranslate2 itself produces the ids at serving time.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import sentencepiece as spm

from ops.model_builders.demo import save_bigram_model

# After the prompt "The" (whose last piece starts the cycle) the model writes these pieces
# in a loop. Every id occurs once, so a bigram table can script it.
CYCLE = [
    "▁The", "<0xC3>", "<0xAF>", "ve", "<0xE6>", "<0x97>", "<0xA5>", "▁c", "a",
    "<0xE2>", "<0x98>", "<0x83>", "f", "<0xF0>", "<0x9F>", "<0x8E>", "<0x89>",
    "▁x", "<0xD0>", "<0xB6>", "<0xBF>", "▁of",
]  # fmt: skip
PROMPT = "The"
# After "end" the script ends at once: greedy output is empty unless min_tokens holds the end
# token back (then the next likeliest piece enters the cycle).
ENDING_PROMPT = "end"


def cycle_ids(sp: spm.SentencePieceProcessor) -> list[int]:
    ids = [sp.piece_to_id(piece) for piece in CYCLE]
    assert sp.unk_id() not in ids and len(set(ids)) == len(ids), ids
    return ids


def build_scripted_model(output_dir: Path, tokenizer_path: Path) -> Path:
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    vocab = sp.get_piece_size()
    ids = cycle_ids(sp)
    table = np.full((vocab, vocab), -30.0, dtype=np.float32)
    table[:, ids[0]] = -1.0  # from anywhere else (the start token too), enter the cycle
    for current, following in zip(ids, ids[1:] + ids[:1], strict=True):
        table[current, :] = -30.0
        table[current, following] = 0.0
    ending = sp.piece_to_id("▁" + ENDING_PROMPT)
    assert ending not in ids and ending != sp.unk_id()
    table[ending, :] = -30.0
    table[ending, sp.eos_id()] = 0.0
    table[ending, ids[0]] = -5.0
    pieces = [sp.id_to_piece(i) for i in range(vocab)]
    save_bigram_model(table, pieces, output_dir)
    shutil.copy(tokenizer_path, output_dir / "tokenizer.model")
    return output_dir
