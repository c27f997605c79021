"""A model directory with a Hugging Face tokenizer.json (byte-level BPE, ChatML special tokens),
laid out as ``ct2-transformers-converter --copy_files`` leaves it, served with no configuration
but its path, by a real worker.

Two models over the tokenizer of tests/bpe_tokenizer.py: a random-weight Llama
(ops/model_builders/random_llama.py), whose greedy ids CTranslate2 computes here too (the
oracle: the stream and the stored output must equal the library's decode of all ids at once),
and a bigram model scripted (as tests/scripted_model.py) to write characters split across
byte tokens and a stray continuation byte, for stop strings and logprobs' bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import openai
import pytest
import requests

from ops.model_builders.demo import save_bigram_model
from ops.model_builders.random_llama import HUGGINGFACE_FILES, build_random_llama
from tests.bpe_tokenizer import CHAT_TEMPLATE, IM_END
from tests.clients import read_sse, submit
from tests.faultstack import FaultStack, build_fault_stack
from trickle.config.sections import ModelSettings
from trickle.tokenization import load_tokenizer
from trickle.tokenization.huggingface_tokenizer import HuggingFaceTokenizer
from web.common.chat_template import ChatTurn, render_chat
from worker.engine.model_hints import write_hints

# The scripted model's cycle, by each token's bytes: "é", "😀" and "中" split into single bytes,
# and a continuation byte (0xBF) that forms no character.
CYCLE = [
    b" c", b"a", b"f", b"\xc3", b"\xa9", b" x", b"\xf0", b"\x9f", b"\x98", b"\x80",
    b"\xe4", b"\xb8", b"\xad", b"\xbf", b" of",
]  # fmt: skip
CYCLE_TEXT = " café x😀中\ufffd of"
ENDING_PROMPT = "end"  # the scripted model ends at once after it
CONTEXT_TOKENS = 256
PROMPT = "Café, naïve 中文 😀:"


def scripted_ids(tokenizer: HuggingFaceTokenizer) -> list[int]:
    spelled = tokenizer.token_bytes()
    ids = [spelled.index(token) for token in CYCLE]
    assert len(set(ids)) == len(ids)
    return ids


def build_scripted_bpe_model(output_dir: Path, tokenizer_dir: Path) -> Path:
    """Greedy output after any prompt but "end": the cycle, over and over."""
    tokenizer = HuggingFaceTokenizer(tokenizer_dir / "tokenizer.json")
    vocab = tokenizer.vocab_size
    ids = scripted_ids(tokenizer)
    table = np.full((vocab, vocab), -30.0, dtype=np.float32)
    table[:, ids[0]] = -1.0
    for current, following in zip(ids, ids[1:] + ids[:1], strict=True):
        table[current, :] = -30.0
        table[current, following] = 0.0
    (ending,) = tokenizer.encode(ENDING_PROMPT)
    assert ending not in ids
    table[ending, :] = -30.0
    table[ending, tokenizer.piece_id(IM_END)] = 0.0
    output_dir.mkdir(parents=True, exist_ok=True)
    save_bigram_model(table, tokenizer.to_pieces(list(range(vocab))), output_dir)
    for name in HUGGINGFACE_FILES:
        (output_dir / name).write_bytes((tokenizer_dir / name).read_bytes())
    return output_dir


@pytest.fixture(scope="module")
def bpe_llama(bpe_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_random_llama(tmp_path_factory.mktemp("bpe-llama") / "model", bpe_tokenizer_dir)
    write_hints(path, "float32", "the test compares greedy output with CTranslate2's own")
    return path


@pytest.fixture(scope="module")
def bpe_script(bpe_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_scripted_bpe_model(
        tmp_path_factory.mktemp("bpe-script") / "model", bpe_tokenizer_dir
    )


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    demo_model_dir: Path,
    bpe_llama: Path,
    bpe_script: Path,
) -> Iterator[FaultStack]:
    models = (
        f'[models.demo]\npath = "{demo_model_dir}"\n'
        f'[models.bpe-llama]\npath = "{bpe_llama}"\nmax_context_tokens = {CONTEXT_TOKENS}\n'
        f'[models.bpe-script]\npath = "{bpe_script}"\ninter_threads = 1\n'
    )
    settings = "[limits]\nmax_tokens_ceiling = 512\ndefault_max_tokens = 16\n"
    faults = build_fault_stack(tmp_path_factory.mktemp("bpe-stack"), models, settings)
    faults.worker("bpe", ("bpe-llama", "bpe-script"))
    yield faults
    faults.close()


@pytest.fixture(scope="module")
def client(stack: FaultStack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{stack.web_url}/v1", api_key="x", max_retries=0) as opened:
        yield opened


def tokenizer_of(path: Path) -> HuggingFaceTokenizer:
    tokenizer = load_tokenizer(ModelSettings("oracle", str(path)))
    assert isinstance(tokenizer, HuggingFaceTokenizer)
    return tokenizer


def greedy_ids(path: Path, prompt: str, count: int) -> list[int]:
    import ctranslate2

    tokenizer = tokenizer_of(path)
    generator = ctranslate2.Generator(str(path), device="cpu", compute_type="float32")
    (result,) = generator.generate_batch(
        [tokenizer.to_pieces(tokenizer.encode(prompt))],
        max_length=count,
        sampling_topk=1,
        end_token=[],
        include_prompt_in_result=False,
    )
    return list(result.sequences_ids[0])


def streamed_and_stored(base: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    job = submit(base, body)
    stream = read_sse(base, job["id"], timeout=120)
    assert stream.done is not None and stream.done["status"] == "succeeded", stream.done
    return stream.text, stream.done


def greedy(model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}


def test_random_model_streams_the_decode_of_all_its_ids(stack: FaultStack, bpe_llama: Path) -> None:
    ids = greedy_ids(bpe_llama, PROMPT, 200)
    tokenizer = tokenizer_of(bpe_llama)
    expected = tokenizer.decode(ids)
    assert any(ord(char) > 0x7F for char in expected), "the output should hold non-ASCII text"
    body = greedy("bpe-llama", PROMPT, 200, ignore_eos=True)
    streamed, done = streamed_and_stored(stack.web_url, body)
    assert streamed == done["output"] == expected
    assert done["usage"]["prompt_tokens"] == len(tokenizer.encode(PROMPT))


@pytest.mark.parametrize("max_tokens", [39, 42, 44])  # ends inside "😀", inside "中", on 0xBF
def test_split_characters_are_sent_once_and_whole(
    stack: FaultStack, bpe_script: Path, max_tokens: int
) -> None:
    """A character split across ids is released once, whole, when its last byte arrives; one
    the output ends inside is U+FFFD, as the decode of all ids has it."""
    tokenizer = tokenizer_of(bpe_script)
    expected = tokenizer.decode((scripted_ids(tokenizer) * 4)[:max_tokens])
    assert expected.startswith(CYCLE_TEXT * 2)
    streamed, done = streamed_and_stored(stack.web_url, greedy("bpe-script", "Hello", max_tokens))
    assert streamed == done["output"] == expected
    assert done["usage"]["completion_tokens"] == max_tokens


def test_stop_strings_across_split_characters(client: openai.OpenAI) -> None:
    for stop, before in (("中", " café x😀"), ("😀中", " café x"), ("é x", " caf")):
        result = client.completions.create(
            model="bpe-script", prompt="Hello", max_tokens=40, temperature=0, stop=[stop]
        )
        assert result.choices[0].text == before and result.choices[0].finish_reason == "stop"


def test_logprobs_bytes_add_up_to_the_text(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model="bpe-script",
        messages=[{"role": "user", "content": "Grüß dich 👋"}],
        max_tokens=30,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    choice = result.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert len(entries) == 30
    assert (
        bytes(b for entry in entries for b in entry.bytes or [])
        == (choice.message.content or "").encode()
    )
    assert all(bytes(entry.bytes or []).decode() == entry.token for entry in entries)
    # The likeliest alternative is the scripted token, a lone byte of a character written as
    # OpenAI writes it ("bytes:\\xc3"), with that byte.
    assert all(len(entry.top_logprobs) == 2 for entry in entries)
    tops = [entry.top_logprobs[0] for entry in entries]
    assert [bytes(top.bytes or []) for top in tops] == (CYCLE * 2)[:30]
    assert tops[3].token == "bytes:\\xc3" and tops[1].token == "a"


def test_echo_and_end_token(client: openai.OpenAI) -> None:
    echoed = client.completions.create(
        model="bpe-script", prompt="Grüß 👋", max_tokens=5, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "Grüß 👋" + CYCLE_TEXT[:5]
    ended = client.completions.create(
        model="bpe-script", prompt=ENDING_PROMPT, max_tokens=5, temperature=0
    )
    assert ended.choices[0].text == "" and ended.choices[0].finish_reason == "stop"


def test_chat_template_special_tokens_are_single_ids(
    client: openai.OpenAI, stack: FaultStack, bpe_script: Path
) -> None:
    messages = [
        {"role": "system", "content": "Réponds en français."},
        {"role": "user", "content": "中文? 😀"},
    ]
    prompt = render_chat(
        [ChatTurn(**m) for m in messages], CHAT_TEMPLATE, "<|im_start|>", IM_END, drop_bos=False
    )
    tokenizer = tokenizer_of(bpe_script)
    ids = tokenizer.encode(prompt)
    assert ids.count(tokenizer.piece_id("<|im_start|>")) == 3 and ids[0] == tokenizer.bos_id
    result = client.chat.completions.create(model="bpe-script", messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert result.usage is not None and result.usage.prompt_tokens == len(ids)
    assert result.choices[0].message.content == CYCLE_TEXT[:4]
    with anthropic.Anthropic(base_url=stack.web_url, api_key="x") as messages_client:
        counted = messages_client.messages.count_tokens(
            model="bpe-script",
            system=messages[0]["content"],
            messages=[messages[1]],  # type: ignore[list-item]
        )
    assert counted.input_tokens == len(ids)


def test_a_prompt_over_the_context_limit_is_a_400(stack: FaultStack) -> None:
    reply = requests.post(
        f"{stack.web_url}/v1/completions",
        json={"model": "bpe-llama", "prompt": "中文字符 " * 60, "max_tokens": 4},
        timeout=30,
    )
    assert reply.status_code == 400
    assert str(CONTEXT_TOKENS) in reply.json()["error"]["message"]


def test_json_schema_answers_parse_on_the_byte_level_vocabulary(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "rank": {"type": "integer"}},
        "required": ["city", "rank"],
        "additionalProperties": False,
    }
    result = client.chat.completions.create(
        model="bpe-llama",
        messages=[{"role": "user", "content": "Une ville? 城市"}],
        max_tokens=60,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": schema, "strict": True},
        },
    )
    answer = json.loads(result.choices[0].message.content or "")
    assert set(answer) == {"city", "rank"} and isinstance(answer["rank"], int)
