"""A model that calls tools on cue: a bigram model (built like ``tests.scripted_model``) whose
tokenizer is the demo one plus whole pieces of tool-call text, so a greedy answer is a script.

Its chat template (configuration-only, as a served model's would be) ends the prompt with a
cue piece chosen by the conversation, and the bigram table follows each cue with its script:

- the last message is a tool result: ``ANSWER``, a plain final answer;
- the last message mentions "two": ``TWO``, text and then two calls;
- otherwise: ``CALL``, one ``get_weather`` call whose tag and name are cut across tokens.

Every script ends with the end token, so each answer finishes with ``stop``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from ops.model_builders.demo import save_bigram_model

CALL = [
    "<tool_",
    'call>{"name":"get_',
    'weather","arguments":{"city":',
    '"Paris"}}',
    "</tool_call>",
]
TWO = [
    "Checking:",
    '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>',
    '<tool_call>{"name":"get_time","arguments":{"zone":"CET"}}</tool_call>',
]
ANSWER = ["Sunny▁in▁Paris,", "▁22C."]
CUES = {"<|call|>": CALL, "<|two|>": TWO, "<|answer|>": ANSWER}
ANSWER_TEXT = "Sunny in Paris, 22C."

TEMPLATE = (
    "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}"
    "<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "</tool_call>{% endfor %}{{ '\\n' }}{% endfor %}"
    "{% if messages[-1].role == 'tool' %}<|answer|>"
    "{% elif 'two' in messages[-1].content %}<|two|>"
    "{% else %}<|call|>{% endif %}"
)


def build_tool_model(output_dir: Path, demo_tokenizer: Path) -> Path:
    model_pb2: Any = sentencepiece_model_pb2  # generated code, without type stubs
    proto = model_pb2.ModelProto()
    proto.ParseFromString(demo_tokenizer.read_bytes())
    for text in [*CUES, *CALL, *TWO, *ANSWER]:
        piece = proto.pieces.add()
        piece.piece, piece.score = text, 0.0
        piece.type = model_pb2.ModelProto.SentencePiece.USER_DEFINED
    (output_dir / "tokenizer.model").write_bytes(proto.SerializeToString())
    sp = spm.SentencePieceProcessor(model_file=str(output_dir / "tokenizer.model"))
    vocab = sp.get_piece_size()
    table = np.full((vocab, vocab), -30.0, dtype=np.float32)
    table[:, sp.eos_id()] = -1.0  # outside a script, end at once
    for cue, script in CUES.items():
        ids = [sp.piece_to_id(piece) for piece in [cue, *script]]
        assert sp.unk_id() not in ids, script
        for current, following in zip(ids, [*ids[1:], sp.eos_id()], strict=True):
            table[current, :] = -30.0
            table[current, following] = 0.0
    pieces = [sp.id_to_piece(i) for i in range(vocab)]
    save_bigram_model(table, pieces, output_dir)
    return output_dir
