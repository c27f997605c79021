"""A model directory that brings its own configuration, served by a real worker: its chat template
(which may refuse a conversation), its start-token choice and an extra end token from
generation_config.json; and stop_token_ids on the OpenAI routes and the job API.

The directory is the demo model plus the two JSON files, built offline; the extra end token is a
token the model is known to produce greedily (found with CTranslate2 here, before any worker).
Its weights are the demo's bigram table without the end-of-turn circuit: that circuit reads the
position from the start token, which this configuration drops (every sentence end would then
end the answer, before the extra end token)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import requests

from ops.model_builders.demo import (
    bigram_log_probs,
    encode_corpus,
    load_tokenizer,
    save_bigram_model,
)
from ops.model_builders.demo_corpus import collect_corpus
from tests.faultstack import FaultStack, build_fault_stack
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from web.common.chat_template import ChatTurn, render_chat

PROMPT = "The socket module"
TEMPLATE = (
    "{% if messages[0].role == 'assistant' %}"
    "{{ raise_exception('the conversation must not start with the assistant') }}"
    "{% endif %}"
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}\n"
    "{% endfor %}<|assistant|>"
)


@dataclass(frozen=True)
class OwnModel:
    path: Path
    end_id: int  # generation_config.json's extra end token
    tokens_before_end: int  # greedy tokens of PROMPT before it


def greedy_ids(model_dir: Path, prompt: str, count: int) -> list[int]:
    import ctranslate2

    pieces = SentencePieceTokenizer(model_dir / "tokenizer.model", add_bos=False).to_pieces(
        SentencePieceTokenizer(model_dir / "tokenizer.model", add_bos=False).encode(prompt)
    )
    generator = ctranslate2.Generator(str(model_dir), device="cpu", compute_type="float32")
    result = generator.generate_batch(
        [pieces], max_length=count, sampling_topk=1, end_token=[], include_prompt_in_result=False
    )
    return list(result[0].sequences_ids[0])


@pytest.fixture(scope="module")
def own_model(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> OwnModel:
    path = tmp_path_factory.mktemp("own") / "model"
    shutil.copytree(demo_model_dir, path)
    sp = load_tokenizer(path / "tokenizer.model")
    table = bigram_log_probs(encode_corpus(sp, collect_corpus()))
    save_bigram_model(table, [sp.id_to_piece(i) for i in range(sp.get_piece_size())], path)
    tokenizer = SentencePieceTokenizer(path / "tokenizer.model")
    ids = greedy_ids(path, PROMPT, 24)
    k = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i] and ids[i] != tokenizer.eos_id)
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": TEMPLATE,
                "bos_token": {"content": "<s>", "special": True},
                "eos_token": "</s>",
                "add_bos_token": False,
            }
        )
    )
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [tokenizer.eos_id, ids[k]]})
    )
    return OwnModel(path, ids[k], k)


@pytest.fixture(scope="module")
def own_stack(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path, own_model: OwnModel
) -> Iterator[FaultStack]:
    stack = build_fault_stack(
        tmp_path_factory.mktemp("own-stack"),
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\n'
            f'[models.own]\npath = "{own_model.path}"\nmax_batch_size = 4\n'
        ),
        settings_toml="[limits]\nmax_tokens_ceiling = 64\ndefault_max_tokens = 16\n",
    )
    stack.worker("own", ("own",))
    yield stack
    stack.close()


@pytest.fixture(scope="module")
def client(own_stack: FaultStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{own_stack.web_url}/v1", api_key="x", max_retries=0)


def test_generation_config_end_token_ends_the_output(
    client: openai.OpenAI, own_model: OwnModel
) -> None:
    args = {"model": "own", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    full = client.completions.create(**args, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    ended = client.completions.create(**args)  # type: ignore[call-overload]
    assert ended.choices[0].finish_reason == "stop"
    assert ended.usage.completion_tokens == own_model.tokens_before_end + 1  # the end token counts
    text = ended.choices[0].text
    assert text and full.choices[0].text.startswith(text) and full.choices[0].text != text


def test_stop_token_ids_on_completions_chat_and_jobs(
    client: openai.OpenAI, own_stack: FaultStack, own_model: OwnModel
) -> None:
    """stop_token_ids end a job even with ignore_eos (as in vLLM); the token is never shown."""
    args = {"model": "own", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    full = client.completions.create(**args, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    stop = {"stop_token_ids": [own_model.end_id], "ignore_eos": True}
    cut = client.completions.create(**args, extra_body=stop)  # type: ignore[call-overload]
    assert cut.choices[0].finish_reason == "stop"
    assert full.choices[0].text.startswith(cut.choices[0].text)
    assert cut.usage.completion_tokens == own_model.tokens_before_end + 1
    job = requests.post(
        f"{own_stack.web_url}/v1/jobs",
        json={**args, **stop},
        headers={"Prefer": "wait=30"},
        timeout=60,
    ).json()
    assert job["output"] == cut.choices[0].text and job["finish_reason"] == "stop"
    assert job["params"]["stop_token_ids"] == [own_model.end_id]
    chat = client.chat.completions.create(
        model="own", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, extra_body=stop
    )
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_the_models_own_template_and_start_token(
    client: openai.OpenAI, own_model: OwnModel
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a socket?"},
    ]
    result = client.chat.completions.create(model="own", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    prompt = render_chat([ChatTurn(**m) for m in messages], TEMPLATE, "<s>", "</s>")
    assert prompt.startswith("<|system|>Be brief.</s>\n")  # the template's bos_token stripped
    no_bos = SentencePieceTokenizer(own_model.path / "tokenizer.model", add_bos=False)
    assert result.usage is not None and result.usage.prompt_tokens == no_bos.count(prompt)
    response = client.responses.create(
        model="own", instructions="Be brief.", input="What is a socket?", max_output_tokens=2
    )
    assert response.usage is not None and response.usage.input_tokens == no_bos.count(prompt)


def test_a_template_that_raises_is_a_400_with_its_message(own_stack: FaultStack) -> None:
    assistant_first = [{"role": "assistant", "content": "Hello"}]
    for path, body, param in (
        ("/v1/chat/completions", {"messages": assistant_first}, "messages"),
        ("/v1/responses", {"input": assistant_first}, "input"),
    ):
        reply = requests.post(
            f"{own_stack.web_url}{path}", json={"model": "own", **body}, timeout=10
        )
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["param"] == param
        assert "must not start with the assistant" in error["message"]
