"""deploy/autoscaling: the KEDA ScaledObject, the HPA and prometheus-adapter's rules scale on metrics
Kernel really exports. The HPA and the ConfigMap are checked against the Kubernetes schemas
(strict); the ScaledObject, whose CRD schema is not kept here, for the fields KEDA's prometheus
scaler reads; and every metric name in a query is looked up in a real server's /metrics after a
streamed chat completion, with the flags the manifests name."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import EXAMPLES, KernelProcess, free_port
from test_manifests import k8s_validate, load_all

AUTOSCALING = Path(__file__).resolve().parents[2] / "deploy" / "autoscaling"
METRIC = re.compile(r"\bnv_[a-z_]+")
# What the Deployment must run for the manifests' metrics to exist (keda-scaledobject.yaml says so).
FLAGS = ["--metrics-config=histogram_latencies=true"]


def keda() -> dict:
    return load_all(AUTOSCALING / "keda-scaledobject.yaml")[0]


def queries() -> list[str]:
    """Every PromQL query and series selector of the three manifests."""
    out = [t["metadata"]["query"] for t in keda()["spec"]["triggers"]]
    rules = yaml.safe_load(load_all(AUTOSCALING / "prometheus-adapter-rules.yaml")[0]["data"]["config.yaml"])["rules"]
    out += [r["seriesQuery"] for r in rules]
    hpa = load_all(AUTOSCALING / "hpa.yaml")[0]
    out += [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    return out


def test_hpa_and_adapter_rules_validate_against_kubernetes():
    for name in ("hpa.yaml", "prometheus-adapter-rules.yaml"):
        for doc in load_all(AUTOSCALING / name):
            k8s_validate(doc)


def test_scaled_object_has_what_kedas_prometheus_scaler_reads():
    doc = keda()
    assert (doc["apiVersion"], doc["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = doc["spec"]
    assert spec["scaleTargetRef"]["name"] == "kernel"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["triggers"]
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus"
        assert trigger["metricType"] in ("AverageValue", "Value")
        meta = trigger["metadata"]
        assert meta["serverAddress"].startswith("http")
        # KEDA takes metadata values as strings only.
        assert all(isinstance(v, str) for v in meta.values()), meta
        float(meta["threshold"])
        assert METRIC.search(meta["query"]), meta["query"]


@pytest.fixture(scope="module")
def scraped() -> str:
    """A real server's /metrics after one streamed chat completion, with the manifests' flags."""
    port = free_port()
    k = KernelProcess([EXAMPLES], "--openai-port", str(port), *FLAGS)
    try:
        k.wait_ready()
        from openai import OpenAI

        with OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", max_retries=0) as client:
            chunks = list(client.chat.completions.create(
                model="tiny_lm", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
                extra_body={"ignore_eos": True}))
            assert len(chunks) == 4
        with urllib.request.urlopen(f"http://localhost:{k.metrics_port}/metrics") as r:
            return r.read().decode()
    finally:
        k.stop()


def test_every_metric_the_manifests_name_is_exported(scraped):
    names = {m for q in queries() for m in METRIC.findall(q)}
    assert {"nv_inference_inflight_request_count", "nv_inference_pending_request_count",
            "nv_inference_first_response_histogram_ms_bucket", "nv_inference_inter_response_histogram_ms_bucket"} <= names
    for name in names:
        assert re.search(rf'^{name}\{{model="tiny_lm",version="1"', scraped, re.M), name
