"""Settings: embedded defaults, then a TOML file, then environment variables.

Loaded once per process by ``load_settings`` and passed down; nothing here reads the environment at
import time, so tests build settings explicitly. The sections are frozen dataclasses
(``trickle.config.sections``: cheap to pass and to copy with ``dataclasses.replace``); here they
are assembled into ``Settings``, layered and checked: pydantic-settings layers the file and the
environment (``TRICKLE__SECTION__KEY``, ``env_nested_delimiter="__"``) and pydantic validates and
coerces every value, so an error names its key path (``limits.max_prompt_tokens``).
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import Field, TypeAdapter, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources import PydanticBaseSettingsSource

from trickle.config.sampling import ModelSampling
from trickle.config.sections import (
    AuthSettings,
    AutoscaleSettings,
    BrokerSettings,
    FileSettings,
    LimitSettings,
    ModelSettings,
    RateLimitSettings,
    RedisSettings,
    SupervisorSettings,
    WebhookSettings,
    WebSettings,
    WorkerSettings,
    available_cores,
)
from trickle.config.tuning import TuningSettings
from trickle.tenants import KeySettings, build_keys, check_keys, every_tenant

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG_PATH = PROJECT_ROOT / "configs" / "default.toml"
DEFAULT_MODEL_DIR = PROJECT_ROOT / "models" / "demo"
# The default model `make up` serves: SmolLM2-135M-Instruct, built by `trickle smollm2-model`.
SMOLLM2_MODEL_DIR = PROJECT_ROOT / "models" / "smollm2"
SMOLLM2_CONTEXT_TOKENS = 8192
# SmolLM2's own template never reads tools: requests with tools get ChatML with Hermes calls.
SMOLLM2_TOOL_TEMPLATE = "chatml"
# Its defaults for requests that leave them out: the model card's sampling, a repetition
# penalty that ends its greedy loops, room for a whole answer (configs/default.toml says why).
SMOLLM2_SAMPLING = ModelSampling(
    temperature=0.2, top_p=0.9, repetition_penalty=1.1, max_tokens=1024
)
# Downloaded model inputs (the SmolLM2 wheel), kept so a rebuild needs no network.
WHEEL_CACHE_DIR = PROJECT_ROOT / "models" / ".cache"
# Without default_model, the first of these the configuration serves is the default.
EMBEDDED_MODELS = ("smollm2", "demo")

ENV_PREFIX = "TRICKLE__"
# Short names operators type often; every other key is reachable as TRICKLE__SECTION__KEY.
ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "TRICKLE_REDIS_URL": ("redis", "url"),
    "TRICKLE_BROKER_URL": ("broker", "url"),
    "TRICKLE_HOST": ("web", "host"),
    "TRICKLE_PORT": ("web", "port"),
    "TRICKLE_MODELS": ("worker", "models"),
    "TRICKLE_DEFAULT_MODEL": ("default_model",),
    "TRICKLE_API_KEYS": ("auth", "api_keys"),
}


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key to fix."""


def embedded_models() -> dict[str, ModelSettings]:
    """The models served without a [models] table: the default real model, then the demo."""
    return {
        "smollm2": ModelSettings(
            name="smollm2",
            path=str(SMOLLM2_MODEL_DIR),
            max_context_tokens=SMOLLM2_CONTEXT_TOKENS,
            tool_chat_template=SMOLLM2_TOOL_TEMPLATE,
            sampling=SMOLLM2_SAMPLING,
        ),
        "demo": ModelSettings(name="demo", path=str(DEFAULT_MODEL_DIR)),
    }


@dataclass(frozen=True)
class Settings:
    redis: RedisSettings = field(default_factory=RedisSettings)
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    web: WebSettings = field(default_factory=WebSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    files: FileSettings = field(default_factory=FileSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    rate_limits: RateLimitSettings = field(default_factory=RateLimitSettings)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    supervisor: SupervisorSettings = field(default_factory=SupervisorSettings)
    # The process-wide tuning knobs; each model's are ``models[name].tuning``.
    tuning: TuningSettings = field(default_factory=TuningSettings)
    models: dict[str, ModelSettings] = field(default_factory=embedded_models)
    default_model: str = "smollm2"
    # Named API keys and their limits, by name (trickle/tenants.py).
    keys: dict[str, KeySettings] = field(default_factory=dict)

    def model(self, name: str) -> ModelSettings:
        return self.models[name]

    @functools.cached_property
    def tenants(self) -> dict[str, KeySettings]:
        """Every accepted key as a tenant (named keys and ``[auth] api_keys``), by name; empty
        without keys (every caller is then the one default tenant)."""
        return every_tenant(self.keys, self.auth.api_keys)

    @property
    def shares_slots(self) -> bool:
        """Whether keys share the workers' slots by turns (a reserve lane, holds, token
        shares): with two tenants or more. One key alone is served as the single tenant is."""
        return len(self.tenants) >= 2

    @property
    def broker_url(self) -> str:
        """Celery's broker: broker.url, or the Redis that holds job state when that is empty."""
        return self.broker.url or self.redis.url

    def served_models(self) -> list[str]:
        """Models this worker process should load: its list, or all of them."""
        return list(self.worker.models) or list(self.models)


class _Layers(BaseSettings):
    """The raw layers: the file's tables (passed in) under the environment (``TRICKLE__...``)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    redis: RedisSettings = Field(default_factory=RedisSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    web: WebSettings = Field(default_factory=WebSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    files: FileSettings = Field(default_factory=FileSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    rate_limits: RateLimitSettings = Field(default_factory=RateLimitSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    autoscale: AutoscaleSettings = Field(default_factory=AutoscaleSettings)
    supervisor: SupervisorSettings = Field(default_factory=SupervisorSettings)
    tuning: TuningSettings = Field(default_factory=TuningSettings)
    # Tables until each is built as ModelSettings (its name is its key).
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Empty: the first of EMBEDDED_MODELS in [models], else the first table.
    default_model: str = ""
    keys: dict[str, dict[str, Any]] = Field(default_factory=dict)


class _GivenEnvironment(EnvSettingsSource):
    """The environment ``load_settings`` was given, never ``os.environ`` behind its back."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
        self._given = {name.lower(): value for name, value in environ.items()}
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return self._given


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from the file (``path``, ``TRICKLE_CONFIG`` or the default), then environment."""
    env = dict(environ or {})
    config_path = Path(path or env.get("TRICKLE_CONFIG") or DEFAULT_CONFIG_PATH)
    raw: dict[str, Any] = {}
    if config_path.exists():
        with config_path.open("rb") as fh:
            try:
                raw = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{config_path}: {exc}") from exc
    elif path or env.get("TRICKLE_CONFIG"):
        raise ConfigError(f"config file {config_path} does not exist (TRICKLE_CONFIG)")
    if "models" not in raw:
        # No [models] in the file: the embedded models, still overridable key by key.
        raw["models"] = {
            name: {"path": model.path, "max_context_tokens": model.max_context_tokens}
            for name, model in embedded_models().items()
        }
    return _layered(raw, _expand_aliases(env), base_dir=config_path.parent)


def settings_from_dict(raw: Mapping[str, Any], base_dir: Path | None = None) -> Settings:
    """Validate a raw mapping (TOML shape) into ``Settings``; relative model paths use base_dir."""
    return _layered(dict(raw), {}, base_dir)


def _layered(raw: dict[str, Any], env: Mapping[str, str], base_dir: Path | None) -> Settings:
    class Layers(_Layers):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (_GivenEnvironment(settings_cls, env), init_settings)  # env over the file

    try:
        layers = Layers(**raw)
        models = {
            name: _model(name, table, base_dir) for name, table in (layers.models or {}).items()
        }
        named_keys = build_keys(layers.keys or {})
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    except ValueError as exc:  # build_keys names the key path
        raise ConfigError(str(exc)) from None
    if not models:
        raise ConfigError("[models] must contain at least one [models.<name>] table")
    tables = ("models", "keys")
    sections = {name: getattr(layers, name) for name in _Layers.model_fields if name not in tables}
    # No default named: an embedded model if served, else the first.
    first = next((name for name in EMBEDDED_MODELS if name in models), next(iter(models)))
    sections["default_model"] = layers.default_model or first
    settings = Settings(**sections, models=models, keys=named_keys)
    _check(settings)
    return settings


_MODEL = TypeAdapter(ModelSettings)


def _model(name: str, table: Mapping[str, Any], base_dir: Path | None) -> ModelSettings:
    try:
        model = _MODEL.validate_python({**table, "name": name})
    except ValidationError as exc:
        raise ConfigError(_describe(exc, prefix=f"models.{name}")) from None
    return dataclasses.replace(
        model,
        path=_resolve(model.path, base_dir),
        tokenizer=_resolve(model.tokenizer, base_dir) if model.tokenizer else "",
    ).with_threads(available_cores())


def _describe(exc: ValidationError, prefix: str = "") -> str:
    """Every problem as ``key.path: what is wrong``."""
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join([prefix, *map(str, error["loc"])] if prefix else map(str, error["loc"]))
        if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            problems.append(f"{where}: unknown key")
        else:
            problems.append(f"{where}: {error['msg']} (got {error.get('input')!r})")
    return "; ".join(problems)


def _expand_aliases(env: Mapping[str, str]) -> dict[str, str]:
    """Short names (``TRICKLE_PORT``) as the long ones (``TRICKLE__WEB__PORT``) they stand for;
    a long name set too wins."""
    expanded = dict(env)
    for alias, key_path in ENV_ALIASES.items():
        long_name = ENV_PREFIX + "__".join(key_path).upper()
        if alias in env and long_name not in env:
            expanded[long_name] = env[alias]
    return expanded


def _resolve(path: str, base_dir: Path | None) -> str:
    candidate = Path(path).expanduser()
    if not candidate.is_absolute() and base_dir is not None:
        candidate = base_dir / candidate
    return str(candidate.resolve()) if base_dir is not None else str(candidate)


def _check(settings: Settings) -> None:
    if settings.default_model not in settings.models:
        raise ConfigError(f"default_model {settings.default_model!r} is not in [models]")
    for name in settings.worker.models:
        if name not in settings.models:
            raise ConfigError(f"worker.models names unknown model {name!r}")
    for model in settings.models.values():
        if model.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"models.{model.name}.device must be auto, cpu or cuda")
        if model.max_batch_size < 1:
            raise ConfigError(f"models.{model.name}.max_batch_size must be >= 1")
        _check_engine_knobs(model)
    for origin in settings.web.cors_origins:
        if origin != "*" and not _is_origin(origin):
            raise ConfigError(
                f"web.cors_origins: {origin!r} is not an origin (scheme://host[:port], or *)"
            )
    scheme = settings.broker.url.partition("://")[0]
    if settings.broker.url and scheme not in ("redis", "rediss", "amqp", "amqps", "pyamqp"):
        raise ConfigError(f"broker.url must be a redis:// or amqp:// URL, got {scheme!r}://")
    if (settings.autoscale.max_batch_workers or 0) < 0:
        raise ConfigError("autoscale.max_batch_workers must be >= 0 (0: idle capacity only)")
    if settings.worker.republish_after_seconds <= 0:
        raise ConfigError("worker.republish_after_seconds must be > 0")
    if settings.files.batch_sweep_seconds <= 0:  # the sweep is what settles a batch
        raise ConfigError("files.batch_sweep_seconds must be > 0")
    if "+cluster://" in settings.broker_url:
        raise ConfigError(
            "broker.url: Celery's queue cannot live on a Redis Cluster (kombu's Redis transport "
            "needs one server); with redis.url on a cluster, set broker.url "
            "(TRICKLE_BROKER_URL) to a single Redis or to RabbitMQ"
        )
    try:
        check_keys(settings.keys, settings.models, settings.auth.api_keys)
        every_tenant(settings.keys, settings.auth.api_keys)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    limits = settings.limits
    if limits.default_max_tokens > limits.max_tokens_ceiling:
        raise ConfigError("limits.default_max_tokens must not exceed limits.max_tokens_ceiling")


def _check_engine_knobs(model: ModelSettings) -> None:
    """The scheduler's knobs: every error names its key."""
    where = f"models.{model.name}"
    if model.prefix_cache_entries < 0:
        raise ConfigError(f"{where}.prefix_cache_entries must be >= 0 (0 learns no prefix)")
    if model.prefix_min_tokens < 1:
        raise ConfigError(f"{where}.prefix_min_tokens must be >= 1")
    if model.prefix_cache_tokens < 0:
        raise ConfigError(f"{where}.prefix_cache_tokens must be >= 0 (0: no token bound)")
    if any(not text.strip() for text in model.static_prompts):
        raise ConfigError(f"{where}.static_prompts: an entry is empty")
    if not model.device_index:
        raise ConfigError(f"{where}.device_index must name at least one device")


def _is_origin(value: str) -> bool:
    """What a browser sends in ``Origin``: a scheme and a host, no path, query or credentials."""
    parsed = urlparse(value)
    return (
        parsed.scheme in ("http", "https")
        and bool(parsed.hostname)
        and value == f"{parsed.scheme}://{parsed.netloc}"
        and "@" not in parsed.netloc
    )
