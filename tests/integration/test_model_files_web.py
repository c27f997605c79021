"""The web tier reads a model directory's own files: a broken file is the server's 503 (naming
the file), never a 500 or the client's 400."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

from flask import Flask

from trickle.config.sections import ModelSettings
from trickle.config.settings import Settings


def test_a_broken_tokenizer_config_is_a_503(
    settings: Settings,
    make_app: Callable[[Settings], Flask],
    demo_model_dir: Path,
    tmp_path: Path,
) -> None:
    path = tmp_path / "broken"
    shutil.copytree(demo_model_dir, path)
    (path / "tokenizer_config.json").write_text("{not json")
    models = {**settings.models, "broken": ModelSettings("broken", str(path))}
    client = make_app(dataclasses.replace(settings, models=models)).test_client()
    for route, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
        ("/v1/responses", {"input": "x"}),
    ):
        reply = client.post(route, json={"model": "broken", **body})
        assert reply.status_code == 503, reply.get_json()
        assert "tokenizer_config.json" in reply.get_json()["error"]["message"]
