"""Named keys: their tables, the validation that names them, and their queues."""

from __future__ import annotations

import hashlib

import pytest

from trickle import keys
from trickle.config.settings import ConfigError, Settings, settings_from_dict
from trickle.queue import TenantQueues, make_celery, tenant_queues
from trickle.tenants import DEFAULT_TENANT, TenantTable

MODELS = {"demo": {"path": "/m/demo"}, "big": {"path": "/m/big"}}


def with_keys(tables: dict[str, dict[str, object]], **extra: object) -> Settings:
    return settings_from_dict({"models": MODELS, "keys": tables, **extra})


def test_a_key_table_reads_every_field() -> None:
    digest = hashlib.sha256(b"secret-b").hexdigest()
    settings = with_keys(
        {
            "alice": {
                "key": "secret-a",
                "requests_per_minute": 20,
                "tokens_per_minute": 5000,
                "max_running_jobs": 4,
                "max_queued_jobs": 100,
                "allowed_models": ["demo"],
                "max_priority": 9,
                "weight": 2,
            },
            "bob": {"key": f"sha256:{digest.upper()}"},
        }
    )
    alice, bob = settings.keys["alice"], settings.keys["bob"]
    assert (alice.name, alice.requests_per_minute, alice.max_priority) == ("alice", 20, 9)
    assert alice.allowed_models == ("demo",) and alice.weight == 2
    assert bob.digest == digest and bob.requests_per_minute is None and bob.weight == 1
    table = TenantTable(settings.keys)
    assert table.name_of_digest(digest) == "bob"
    assert table.name_of_digest("someone-else") == DEFAULT_TENANT


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ({"key": "k", "weight": 0}, "keys.alice.weight"),
        ({"key": "k", "max_priority": 10}, "keys.alice.max_priority"),
        ({"key": "k", "allowed_models": ["nope"]}, "keys.alice.allowed_models"),
        ({"key": "k", "max_running_jobs": -1}, "keys.alice.max_running_jobs"),
        ({"key": "k", "requests_per_minute": -1}, "keys.alice.requests_per_minute"),
        ({"key": "sha256:abc"}, "keys.alice.key"),
        ({"key": ""}, "keys.alice.key"),
        ({"key": "k", "colour": "red"}, "keys.alice.colour"),
        ({"key": "k", "weight": "heavy"}, "keys.alice.weight"),
    ],
)
def test_a_bad_key_table_names_its_field_and_never_the_key(
    table: dict[str, object], names: str
) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")) as caught:
        with_keys({"alice": {**table}})
    assert "sha256:abc" not in str(caught.value) or table["key"] == "sha256:abc"
    assert "'k'" not in str(caught.value)


def test_a_key_given_twice_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"keys\.bob\.key is the same key as keys\.alice"):
        with_keys({"alice": {"key": "same"}, "bob": {"key": "same"}})
    with pytest.raises(ConfigError, match=r"auth\.api_keys"):
        with_keys({"alice": {"key": "same"}}, auth={"api_keys": ["same"]})


def test_a_key_name_must_fit_queue_names_and_labels() -> None:
    with pytest.raises(ConfigError, match=r"keys\.Bad Name"):
        with_keys({"Bad Name": {"key": "k"}})


def test_each_key_gets_one_queue_per_weight_unit_on_its_allowed_models() -> None:
    settings = with_keys(
        {"a": {"key": "ka", "weight": 2}, "b": {"key": "kb", "allowed_models": ["big"]}}
    )
    queues = TenantQueues(settings.models, settings.keys)
    assert queues.of_tenant("demo", "a") == ["trickle.demo.key.a", "trickle.demo.key.a.1"]
    assert queues.of_tenant("demo", "b") == ["trickle.demo"]  # not allowed there: never used
    assert queues.of_model("big") == [
        "trickle.big",
        "trickle.big.key.a",
        "trickle.big.key.a.1",
        "trickle.big.key.b",
    ]
    assert [queues.next_queue("demo", "a") for _ in range(3)] == [
        "trickle.demo.key.a",
        "trickle.demo.key.a.1",
        "trickle.demo.key.a",
    ]
    assert queues.next_queue("demo", DEFAULT_TENANT) == keys.model_queue("demo")


def test_keys_from_the_environment() -> None:
    from trickle.config.settings import load_settings

    settings = load_settings(
        environ={"TRICKLE__KEYS__CARL__KEY": "kc", "TRICKLE__KEYS__CARL__WEIGHT": "3"}
    )
    assert settings.keys["carl"].weight == 3


def test_every_accepted_key_is_a_tenant_named_never_by_its_key() -> None:
    digest_b = hashlib.sha256(b"plain-b").hexdigest()
    settings = with_keys(
        {"alice": {"key": "secret-a"}},
        auth={"api_keys": ["plain-a", f"sha256:{digest_b}", "plain-a"]},
    )
    digest_a = hashlib.sha256(b"plain-a").hexdigest()
    names = {"alice", f"key-{digest_a[:12]}", f"key-{digest_b[:12]}"}
    assert set(settings.tenants) == names and settings.shares_slots
    plain = settings.tenants[f"key-{digest_a[:12]}"]
    assert plain.digest == digest_a and "plain-a" not in repr(plain)
    assert (plain.weight, plain.max_running_jobs, plain.requests_per_minute) == (1, 0, None)
    table = TenantTable(settings.tenants)
    # A plain key and its sha256: form are one tenant.
    assert table.name_of_digest(digest_b) == f"key-{digest_b[:12]}"
    queues = TenantQueues(settings.models, settings.tenants)
    assert (
        queues.next_queue("demo", f"key-{digest_a[:12]}") == f"trickle.demo.key.key-{digest_a[:12]}"
    )
    assert all("plain" not in name for name in queues.names())


def test_without_keys_every_caller_is_the_one_default_tenant() -> None:
    settings = with_keys({})
    assert settings.tenants == {} and not settings.shares_slots
    assert TenantQueues(settings.models, settings.tenants).names() == [
        "trickle.demo",
        "trickle.big",
    ]
    one = with_keys({}, auth={"api_keys": ["only"]})
    assert len(one.tenants) == 1 and not one.shares_slots  # one key is served as one tenant
    assert tenant_queues(make_celery(one, one.models)).of_model("demo") == ["trickle.demo"]
    two = with_keys({}, auth={"api_keys": ["one", "two"]})
    assert len(tenant_queues(make_celery(two, two.models)).of_model("demo")) == 3


def test_a_named_key_may_not_take_a_plain_keys_tenant_name() -> None:
    name = "key-" + hashlib.sha256(b"plain").hexdigest()[:12]
    with pytest.raises(ConfigError, match=rf"keys\.{name}: .*auth\.api_keys\[0\]") as caught:
        with_keys({name: {"key": "other"}}, auth={"api_keys": ["plain"]})
    assert "'plain'" not in str(caught.value)


def test_two_hundred_plain_keys_are_two_hundred_queues_per_model() -> None:
    api_keys = [f"team-{i}" for i in range(200)]
    settings = with_keys({}, auth={"api_keys": api_keys})
    queues = TenantQueues(settings.models, settings.tenants)
    assert len(settings.tenants) == 200
    assert len(queues.of_model("demo")) == 201  # and the model's own, for jobs of no key


def test_a_key_has_queues_only_on_its_allowed_models() -> None:
    settings = with_keys({"a": {"key": "ka", "allowed_models": ["big"]}, "b": {"key": "kb"}})
    queues = TenantQueues(settings.models, settings.tenants)
    assert queues.has("big", "a") and not queues.has("demo", "a") and queues.has("demo", "b")
