"""The tuning knobs' old names: still read at their old place, with one warning per key."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from trickle.config.renamed import MODEL_KNOBS, OLD_GLOBAL_SECTIONS
from trickle.config.settings import DEFAULT_CONFIG_PATH, ConfigError, load_settings
from trickle.config.tuning import ModelTuning, TuningSettings

RENAMED = "trickle.config.renamed"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == RENAMED]


def changed(value: object) -> object:
    """A valid value other than the default, so that a dropped key would show."""
    if isinstance(value, bool):
        return not value
    return value + 7  # type: ignore[operator]


def test_every_process_wide_knob_has_its_old_section() -> None:
    assert set(OLD_GLOBAL_SECTIONS) == {f.name for f in dataclasses.fields(TuningSettings)}
    assert set(OLD_GLOBAL_SECTIONS.values()) <= {"worker", "web"}
    assert {f.name for f in dataclasses.fields(ModelTuning)} == MODEL_KNOBS


@pytest.mark.parametrize("key", sorted(OLD_GLOBAL_SECTIONS))
def test_an_old_global_key_in_the_file_lands_in_tuning(
    key: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    section = OLD_GLOBAL_SECTIONS[key]
    value = changed(getattr(TuningSettings(), key))
    path = tmp_path / "old.toml"
    path.write_text(f"[{section}]\n{key} = {str(value).lower()}\n")
    with caplog.at_level(logging.WARNING, logger=RENAMED):
        settings = load_settings(path, environ={})
    assert getattr(settings.tuning, key) == value
    assert warnings_of(caplog) == [
        f"config: {section}.{key} is deprecated and will be removed; set tuning.{key} instead"
    ]


@pytest.mark.parametrize("key", sorted(MODEL_KNOBS))
def test_an_old_model_key_in_the_file_lands_in_the_models_tuning(
    key: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    value = changed(getattr(ModelTuning(), key))
    path = tmp_path / "old.toml"
    path.write_text(
        f'default_model = "a"\n[models.a]\npath = "m"\n{key} = {str(value).lower()}\n'
        f'[models.b]\npath = "m"\n'
    )
    with caplog.at_level(logging.WARNING, logger=RENAMED):
        settings = load_settings(path, environ={})
    assert getattr(settings.models["a"].tuning, key) == value
    assert settings.models["b"].tuning == ModelTuning()
    (warning,) = warnings_of(caplog)
    assert f"models.a.{key} is deprecated" in warning
    assert f"set models.a.tuning.{key} instead" in warning


def test_old_environment_names_still_override(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "new.toml"
    path.write_text(
        "[tuning]\npublish_interval_ms = 5.0\ngil_switch_interval_ms = 1.5\n"
        '[models.demo]\npath = "m"\n'
        "tuning.overflow_lanes = 2\ntuning.engine_niceness = 7\n"
    )
    env = {
        "TRICKLE__WORKER__PUBLISH_INTERVAL_MS": "11",
        "TRICKLE__WEB__STREAM_FLUSH_INTERVAL_MS": "3",
        "trickle__models__demo__overflow_lanes": "1",
    }
    with caplog.at_level(logging.WARNING, logger=RENAMED):
        settings = load_settings(path, environ=env)
    assert settings.tuning.publish_interval_ms == 11.0  # the environment still wins the file
    assert settings.tuning.stream_flush_interval_ms == 3.0
    assert settings.models["demo"].tuning.overflow_lanes == 1
    # Their neighbours in the file's tables are kept.
    assert settings.tuning.gil_switch_interval_ms == 1.5
    assert settings.models["demo"].tuning.engine_niceness == 7
    assert sorted(warnings_of(caplog)) == [
        "config: TRICKLE__WEB__STREAM_FLUSH_INTERVAL_MS is deprecated and will be removed; "
        "set TRICKLE__TUNING__STREAM_FLUSH_INTERVAL_MS instead",
        "config: TRICKLE__WORKER__PUBLISH_INTERVAL_MS is deprecated and will be removed; "
        "set TRICKLE__TUNING__PUBLISH_INTERVAL_MS instead",
        "config: trickle__models__demo__overflow_lanes is deprecated and will be removed; "
        "set TRICKLE__MODELS__DEMO__TUNING__OVERFLOW_LANES instead",
    ]


def test_new_environment_names_override_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "TRICKLE__TUNING__GIL_SWITCH_INTERVAL_MS": "2",
        "TRICKLE__MODELS__DEMO__TUNING__REBATCH_WAIT_RATIO": "0",
    }
    with caplog.at_level(logging.WARNING, logger=RENAMED):
        settings = load_settings(DEFAULT_CONFIG_PATH, environ=env)
    assert settings.tuning.gil_switch_interval_ms == 2.0
    assert settings.models["demo"].tuning.rebatch_wait_ratio == 0.0
    assert settings.models["demo"].tuning.rebatch_max_stall_ms == 40.0  # its neighbour kept
    assert warnings_of(caplog) == []


@pytest.mark.parametrize(
    ("content", "env", "names"),
    [
        (
            "[worker]\nshare_lag_tokens = 1\n[tuning]\nshare_lag_tokens = 2\n",
            {},
            ("worker.share_lag_tokens", "tuning.share_lag_tokens"),
        ),
        (
            '[models.demo]\npath = "m"\nengine_niceness = 1\ntuning.engine_niceness = 2\n',
            {},
            ("models.demo.engine_niceness", "models.demo.tuning.engine_niceness"),
        ),
        (
            "",
            {"TRICKLE__WORKER__SHARE_LAG_TOKENS": "1", "TRICKLE__TUNING__SHARE_LAG_TOKENS": "2"},
            ("TRICKLE__WORKER__SHARE_LAG_TOKENS", "TRICKLE__TUNING__SHARE_LAG_TOKENS"),
        ),
    ],
)
def test_an_old_and_a_new_name_together_are_refused(
    tmp_path: Path, content: str, env: dict[str, str], names: tuple[str, str]
) -> None:
    path = tmp_path / "both.toml"
    path.write_text(content)
    with pytest.raises(ConfigError) as raised:
        load_settings(path, environ=env)
    assert all(name in str(raised.value) for name in names)


def test_the_shipped_file_uses_no_old_name(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=RENAMED):
        load_settings(DEFAULT_CONFIG_PATH, environ={})
    assert warnings_of(caplog) == []
