"""Configuration: embedded defaults, then the file, then the environment, one key at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from trickle.config.sections import available_cores, derive_threads
from trickle.config.settings import DEFAULT_CONFIG_PATH, ConfigError, Settings, load_settings
from trickle.tokenization.loading import tokenizer_file


def test_default_file_matches_embedded_defaults() -> None:
    from_file = load_settings(DEFAULT_CONFIG_PATH, environ={})
    embedded = Settings()
    assert from_file.redis == embedded.redis
    assert from_file.broker == embedded.broker
    assert from_file.web == embedded.web
    assert from_file.limits == embedded.limits
    assert from_file.tuning == embedded.tuning
    # The loader derives engine threads left at 0 (the default) from the cores.
    assert list(from_file.models) == list(embedded.models) == ["smollm2", "demo"]
    for name, model in embedded.models.items():
        assert from_file.models[name] == model.with_threads(available_cores())
    assert from_file.default_model == embedded.default_model == "smollm2"


def test_without_models_the_embedded_ones_are_served(tmp_path: Path) -> None:
    path = tmp_path / "bare.toml"
    path.write_text("[web]\nport = 9000\n")
    settings = load_settings(path, environ={})
    assert list(settings.models) == ["smollm2", "demo"]
    assert settings.default_model == "smollm2"
    assert settings.models["smollm2"].max_context_tokens == 8192


@pytest.mark.parametrize(
    ("tables", "expected"),
    [(["a", "demo"], "demo"), (["demo", "smollm2"], "smollm2"), (["b", "a"], "b")],
)
def test_an_unnamed_default_model_is_an_embedded_one_else_the_first(
    tmp_path: Path, tables: list[str], expected: str
) -> None:
    path = tmp_path / "models.toml"
    path.write_text("".join(f'[models.{name}]\npath = "m"\n' for name in tables))
    assert load_settings(path, environ={}).default_model == expected


@pytest.mark.parametrize(
    ("inter", "intra", "cores", "expected"),
    [
        (0, 0, 1, (1, 1)),
        (0, 0, 2, (2, 1)),
        (0, 0, 16, (2, 8)),
        (0, 0, 3, (2, 1)),
        (1, 0, 8, (1, 8)),
        (4, 3, 2, (4, 3)),  # pinned values are kept, even when they oversubscribe
    ],
)
def test_engine_threads_are_derived_from_the_cores(
    inter: int, intra: int, cores: int, expected: tuple[int, int]
) -> None:
    assert derive_threads(inter, intra, cores) == expected


def test_environment_overrides_single_keys(tmp_path: Path) -> None:
    env = {
        "TRICKLE_REDIS_URL": "redis://example:1/2",
        "TRICKLE_PORT": "9001",
        "TRICKLE__LIMITS__MAX_PROMPT_TOKENS": "77",
        "TRICKLE__MODELS__DEMO__DEVICE": "cuda",
        "TRICKLE__MODELS__DEMO__DEVICE_INDEX": "0,1",
        "TRICKLE__MODELS__DEMO__ADD_BOS": "false",
        "UNRELATED": "x",
    }
    settings = load_settings(DEFAULT_CONFIG_PATH, environ=env)
    assert settings.redis.url == "redis://example:1/2"
    assert settings.web.port == 9001
    assert settings.limits.max_prompt_tokens == 77
    assert settings.limits.max_tokens_ceiling == 2048  # untouched neighbour
    assert settings.models["demo"].device == "cuda"
    assert settings.models["demo"].device_index == (0, 1)
    assert settings.models["demo"].add_bos is False


def test_trickle_config_selects_file_and_resolves_relative_paths(tmp_path: Path) -> None:
    path = tmp_path / "other.toml"
    path.write_text('default_model = "m"\n[models.m]\npath = "weights/m"\n')
    settings = load_settings(environ={"TRICKLE_CONFIG": str(path)})
    assert settings.default_model == "m"
    assert settings.models["m"].path == str((tmp_path / "weights" / "m").resolve())
    tokenizer = tmp_path / "weights" / "m" / "tokenizer.model"
    tokenizer.parent.mkdir(parents=True)
    tokenizer.touch()
    assert tokenizer_file(settings.models["m"]) == tokenizer.resolve()


@pytest.mark.parametrize(
    ("content", "env", "message"),
    [
        ("[limits]\nmax_prompt_tokens = 'many'\n", {}, "limits.max_prompt_tokens"),
        ("[limits]\nmax_prompt_tokenz = 1\n", {}, "max_prompt_tokenz"),
        ("[surprise]\n", {}, "surprise"),
        ('default_model = "nope"\n', {}, "default_model"),
        ("", {"TRICKLE_PORT": "eighty"}, "web.port"),
        ("", {"TRICKLE__MODELS__DEMO__DEVICE": "tpu"}, "device"),
        ("[web\n", {}, "line 1"),
        ("", {"TRICKLE_BROKER_URL": "kafka://x"}, "broker.url"),
        ("[files]\nbatch_sweep_seconds = 0\n", {}, "files.batch_sweep_seconds"),
        ("[tuning]\ngil_switch_interval_ms = -1\n", {}, "tuning.gil_switch_interval_ms"),
        ("", {"TRICKLE__TUNING__PUBLISH_MAX_INTERVAL_MS": "-5"}, "tuning.publish_max_interval_ms"),
        (
            "",
            {"TRICKLE__MODELS__DEMO__TUNING__OVERFLOW_LANES_PER_DEVICE": "-1"},
            "demo.tuning.overflow_lanes_per_device",
        ),
        ("[tuning]\npublish_intervall_ms = 1\n", {}, "tuning.publish_intervall_ms: unknown key"),
        ("[models.demo.tuning]\nlanes = 1\n", {}, "models.demo.tuning.lanes: unknown key"),
        # The tuning knobs' old places are gone (CHANGELOG.md): unknown keys, named.
        ("[worker]\npublish_interval_ms = 5\n", {}, "worker.publish_interval_ms: unknown key"),
        (
            "[models.demo]\noverflow_lanes_per_device = 1\n",
            {},
            "models.demo.overflow_lanes_per_device: unknown key",
        ),
        (
            "",
            {"TRICKLE__MODELS__DEMO__TOOL_CALL_PARSER": "mistral"},
            "models.demo.tool_call_parser",
        ),
        ("[models.demo.sampling]\ntop_p = 0\n", {}, "models.demo.sampling.top_p"),
        ("[models.demo.sampling]\nmin_p = 0.1\n", {}, "models.demo.sampling.min_p: unknown key"),
        # A nice value a process may not take without privileges (or at all).
        ("[supervisor]\nbatch_niceness = 20\n", {}, "supervisor.batch_niceness"),
        ("", {"TRICKLE__SUPERVISOR__BATCH_NICENESS": "-1"}, "supervisor.batch_niceness"),
    ],
)
def test_bad_configuration_names_the_key(
    tmp_path: Path, content: str, env: dict[str, str], message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_settings(path, environ=env)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(environ={"TRICKLE_CONFIG": str(tmp_path / "missing.toml")})


def test_broker_defaults_to_redis_and_trickle_broker_url_moves_it(tmp_path: Path) -> None:
    env = {"TRICKLE_REDIS_URL": "redis://state:6379/0"}
    assert load_settings(DEFAULT_CONFIG_PATH, environ=env).broker_url == "redis://state:6379/0"
    env["TRICKLE_BROKER_URL"] = "amqp://u:p@mq:5672/trickle"
    settings = load_settings(DEFAULT_CONFIG_PATH, environ=env)
    assert settings.broker_url == "amqp://u:p@mq:5672/trickle"
    assert settings.redis.url == "redis://state:6379/0"  # state and tokens stay on Redis
    path = tmp_path / "mq.toml"
    path.write_text('[broker]\nurl = "amqp://mq//"\n')
    assert load_settings(path, environ={}).broker_url == "amqp://mq//"


def test_web_processes_reach_gunicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    """``[web] processes`` is gunicorn's worker count (the config module reads it at import)."""
    import importlib

    import web.gunicorn_conf as conf

    monkeypatch.setenv("TRICKLE__WEB__PROCESSES", "3")
    assert importlib.reload(conf).workers == 3
    monkeypatch.delenv("TRICKLE__WEB__PROCESSES")
    assert importlib.reload(conf).workers == 1
