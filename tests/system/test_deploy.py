"""deploy/: the compose file and the Kubernetes manifests, checked structurally offline.

Parsed as YAML, then held against the code they describe: the queue names KEDA watches are
the ones kombu writes, the scaling endpoint answers the field KEDA reads, probes hit routes
that exist, and every container's TRICKLE_* environment loads as a valid configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from trickle.capacity import slots_per_worker
from trickle.config.settings import PROJECT_ROOT, load_settings

DEPLOY = PROJECT_ROOT / "deploy"
LABELS = "app.kubernetes.io/component"


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc, f"empty document in {path.name}"
            for field in ("apiVersion", "kind", "metadata"):
                assert field in doc, f"{path.name}: a {doc.get('kind')} lacks {field}"
            assert doc["metadata"]["name"].startswith("trickle-")
            docs.append(doc)
    return docs


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]  # type: ignore[no-any-return]


def environment(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: str(item["value"]) for item in container.get("env", [])}


def test_workloads_select_their_own_pods_and_load_a_valid_config() -> None:
    workloads = {**by_kind("Deployment"), **by_kind("StatefulSet")}
    assert set(workloads) == {
        "trickle-web",
        "trickle-worker-demo",
        "trickle-batch",
        "trickle-redis",
    }
    services = by_kind("Service")
    for name, workload in workloads.items():
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{name} selects pods it does not make"
        for container in containers(workload):
            assert container["image"] and (container.get("command") or container.get("args"))
            env = environment(container)
            if any(key.startswith("TRICKLE") for key in env):
                settings = load_settings(environ=env)  # raises ConfigError naming a bad key
                assert settings.redis.url == "redis://trickle-redis:6379/0"
    for service in services.values():
        wanted = service["spec"]["selector"].items()
        selected = [
            w
            for w in workloads.values()
            if wanted <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected, f"service {service['metadata']['name']} selects nothing"


def test_probes_hit_routes_the_web_tier_serves(stack_url: str) -> None:
    (web,) = containers(by_kind("Deployment")["trickle-web"])
    for probe in ("readinessProbe", "livenessProbe"):
        path = web[probe]["httpGet"]["path"]
        assert requests.get(f"{stack_url}{path}", timeout=10).status_code == 200
    # KEDA starts the workers, so the web tier must be ready while there are none.
    assert environment(web)["TRICKLE__AUTOSCALE__EXTERNAL_SCALER"] == "true"
    worker = by_kind("Deployment")["trickle-worker-demo"]
    assert "replicas" not in worker["spec"], "KEDA owns the worker count"
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > load_settings(environ={}).limits.max_job_seconds


def test_keda_watches_the_scaling_endpoint_and_no_broker_key(stack_url: str) -> None:
    scaled = by_kind("ScaledObject")["trickle-worker-demo"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] in by_kind("Deployment")
    assert scaled["spec"]["minReplicaCount"] == 0
    triggers = scaled["spec"]["triggers"]
    assert [t["type"] for t in triggers] == ["metrics-api"]
    (api,) = [t for t in triggers if t["type"] == "metrics-api"]
    assert api["metadata"]["url"].endswith("/scaling/demo")
    answer = requests.get(f"{stack_url}/scaling/demo", timeout=10).json()
    assert api["metadata"]["valueLocation"] in answer
    per_worker = slots_per_worker(load_settings(environ={}).model("demo"))
    assert int(api["metadata"]["targetValue"]) == per_worker


def test_compose_runs_redis_with_aof_web_and_workers() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"redis", "web", "worker", "batch"}
    assert "--appendonly" in services["redis"]["command"]
    assert (
        services["redis"]["command"][services["redis"]["command"].index("--appendonly") + 1]
        == "yes"
    )
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    procfile = (PROJECT_ROOT / "Procfile").read_text()
    for name in ("web", "worker", "batch"):
        service = services[name]
        assert service["environment"]["TRICKLE_REDIS_URL"] == "redis://redis:6379/0"
        assert "redis" in service["depends_on"]
        program = service["command"][0]
        assert f"{name}: {program} " in procfile, f"compose {name} runs what the Procfile runs"
        load_settings(environ={k: str(v) for k, v in service["environment"].items()})
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert services["web"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert "trickle demo-model" in dockerfile


@pytest.mark.parametrize("path", sorted(p.name for p in DEPLOY.rglob("*.y*ml")))
def test_every_file_is_plain_yaml(path: str) -> None:
    (found,) = list(DEPLOY.rglob(path))
    assert list(yaml.safe_load_all(Path(found).read_text()))
