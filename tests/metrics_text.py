"""/metrics as the tests read it: parsed by prometheus_client's own parser, so output it cannot
read fails the test (label escaping included)."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families


def parse_samples(text: str) -> dict[str, float]:
    """``{'name{label="value",...}': value}``, labels sorted with a bucket's ``le`` last
    (``name{}`` when it has none)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            ordered = sorted(sample.labels.items(), key=lambda kv: (kv[0] == "le", kv[0]))
            labels = ",".join(f'{k}="{v}"' for k, v in ordered)
            samples[f"{sample.name}{{{labels}}}"] = float(sample.value)
    return samples


def scrape(base: str) -> dict[str, float]:
    """A running web tier's /metrics, parsed."""
    response = requests.get(f"{base}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    return parse_samples(response.text)
