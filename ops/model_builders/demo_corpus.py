"""The demo model's corpus: docstring paragraphs of the standard library, which every Python
install has, so the demo tokenizer and bigram table need no download."""

from __future__ import annotations

import ast
import functools
import os
import re
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

# Enough text for a 2000-piece vocabulary while keeping the build a few seconds on two cores.
MAX_CORPUS_CHARS = 1_000_000
MIN_PARAGRAPH_CHARS = 40
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"})


@functools.cache
def collect_corpus(max_chars: int = MAX_CORPUS_CHARS) -> tuple[str, ...]:
    """Docstring paragraphs of the stdlib, in a fixed order, up to ``max_chars`` characters.

    Cached because tests and the verifier ask for the same corpus more than once.
    """
    paragraphs: list[str] = []
    total = 0
    for path in iter_stdlib_files():
        for docstring in extract_docstrings(path):
            for paragraph in split_paragraphs(docstring):
                paragraphs.append(paragraph)
                total += len(paragraph)
                if total >= max_chars:
                    return tuple(paragraphs)
    return tuple(paragraphs)


def iter_stdlib_files() -> Iterator[Path]:
    """Every stdlib ``.py`` file outside tests and tools, in sorted (deterministic) order."""
    root = sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def extract_docstrings(path: Path) -> Iterator[str]:
    """Module, class and function docstrings of one file; unparsable files yield nothing."""
    try:
        source = path.read_bytes()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Invalid escape sequences in old stdlib code.
            tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node)
            if docstring:
                yield docstring


def split_paragraphs(docstring: str) -> Iterator[str]:
    """Blank-line separated paragraphs with whitespace collapsed; short ones are dropped."""
    for block in re.split(r"\n\s*\n", docstring):
        paragraph = " ".join(block.split())
        if len(paragraph) >= MIN_PARAGRAPH_CHARS:
            yield paragraph
