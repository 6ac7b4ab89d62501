"""deploy/kserve and deploy/helm validated offline.

- Kubernetes objects (the chart's Deployment, Service, ConfigMap, PVC, HPA) against the Kubernetes
  OpenAPI schemas shipped by `kubernetes-validate`, strict (unknown fields refused), for the oldest
  Kubernetes the chart declares (1.25) and the newest the package knows.
- KServe objects (ClusterServingRuntime, ServingRuntime, InferenceService) against KServe's own CRD
  schemas, copied in deploy/kserve/schemas (see SOURCE.md), unknown fields refused as well.
- The chart is rendered by Helm itself (helm-python-sdk: Helm's Go SDK behind a C ABI), not by a
  stand-in, and linted with Helm's linter.
- The flags that the manifests pass to Kernel are parsed by Kernel's own argument parser.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import re
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KSERVE = DEPLOY / "kserve"
CHART = DEPLOY / "helm" / "kernel"
EXAMPLES = ROOT / "model_repo_examples"

# The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest with schemas here.
K8S_VERSIONS = ["1.25.0", kubernetes_validate.latest_version() + ".0"]

# deploy/kserve/schemas/SOURCE.md: KServe v0.20.0 config/crd/full/<file>, git blob ids
CRD_BLOBS = {
    "serving.kserve.io_servingruntimes.yaml.gz": "59deb0d14aed7be7edfd32ca0577f9ba789fa747",
    "serving.kserve.io_clusterservingruntimes.yaml.gz": "1ce0a2e5b3d7c05192f7c817eff4d614a80cb432",
    "serving.kserve.io_inferenceservices.yaml.gz": "1e37d05b7a741eb40b9eb01c378dc9dc80eab3d9",
}


# ---- validators ------------------------------------------------------------------------------------


def check_name(doc: dict) -> None:
    """The OpenAPI schemas type metadata.name as a string; the API server also wants a DNS name
    (RFC 1035 label, the strictest rule: Services and InferenceServices follow it)."""
    name = doc["metadata"]["name"]
    assert len(name) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), f"bad name {name!r}"


def k8s_validate(doc: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)
    check_name(doc)


def _structural_to_jsonschema(node):
    """A CRD's openAPIV3Schema as JSON Schema: unknown fields refused where the CRD does not
    preserve them (kube-apiserver's strict field validation), OpenAPI's `nullable` honoured."""
    if isinstance(node, list):
        return [_structural_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _structural_to_jsonschema(v) for k, v in node.items()}
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd_text(name: str) -> bytes:
    return gzip.decompress((KSERVE / "schemas" / name).read_bytes())


def _load_crd_validators() -> dict:
    validators = {}
    for name in CRD_BLOBS:
        crd = yaml.safe_load(crd_text(name))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            if v.get("served"):
                schema = _structural_to_jsonschema(v["schema"]["openAPIV3Schema"])
                jsonschema.Draft7Validator.check_schema(schema)
                validators[(f"{group}/{v['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return validators


CRD_VALIDATORS = _load_crd_validators()


def crd_validate(doc: dict) -> None:
    validator = CRD_VALIDATORS[(doc["apiVersion"], doc["kind"])]
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    # the CRD schema leaves metadata open; check it as Kubernetes checks any ObjectMeta
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                 K8S_VERSIONS[-1], strict=True)
    check_name(doc)


def kernel_parses(args: list[str]) -> None:
    """The container's args (kernel serve ...) are accepted by Kernel's own parser."""
    from kernel.serve import cli

    assert args[:2] == ["kernel", "serve"], args
    cli.build_parser().parse_args(args[1:])


def load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def flag(args: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    assert len(values) == 1, (name, args)
    return values[0]


# ---- the validators refuse what they should ------------------------------------------------------------


def test_crd_copies_are_kserves_files():
    for name, blob in CRD_BLOBS.items():
        data = crd_text(name)
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, name
    assert set(CRD_BLOBS) == {p.name for p in (KSERVE / "schemas").glob("*.gz")}


def test_validators_catch_mistakes():
    runtime = load_all(KSERVE / "clusterservingruntime.yaml")[0]
    for mutate in (
        lambda d: d["spec"]["containers"][0].update(argz=["x"]),               # unknown field
        lambda d: d["spec"]["supportedModelFormats"][0].update(priority=0),    # minimum 1
        lambda d: d["spec"].pop("containers"),                                 # required
        lambda d: d["spec"]["containers"][0]["readinessProbe"]["httpGet"].pop("port"),
        lambda d: d["metadata"].update(name="Kernel_Runtime"),                 # not a DNS name
        lambda d: d["metadata"].update(labels={"app": ["kernel"]}),            # ObjectMeta: labels are strings
    ):
        bad = copy.deepcopy(runtime)
        mutate(bad)
        with pytest.raises((AssertionError, kubernetes_validate.ValidationError)):
            crd_validate(bad)
    deployment = next(d for d in render() if d["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(bad)
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45"
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(bad)


# ---- KServe ------------------------------------------------------------------------------------------


def runtime_docs() -> dict:
    return {p.name: load_all(p)[0] for p in (KSERVE / "clusterservingruntime.yaml", KSERVE / "servingruntime.yaml")}


def test_kserve_manifests_validate_against_kserve_crds():
    files = sorted(KSERVE.glob("*.yaml"))
    assert [p.name for p in files] == ["clusterservingruntime.yaml", "inferenceservice.yaml", "servingruntime.yaml"]
    kinds = []
    for path in files:
        for doc in load_all(path):
            crd_validate(doc)
            kinds.append(doc["kind"])
    assert sorted(kinds) == ["ClusterServingRuntime", "InferenceService", "ServingRuntime"]


def test_serving_runtime():
    docs = runtime_docs()
    cluster, namespaced = docs["clusterservingruntime.yaml"], docs["servingruntime.yaml"]
    assert cluster["spec"] == namespaced["spec"], "the two runtimes drifted apart"
    assert cluster["metadata"]["name"] == namespaced["metadata"]["name"] == "kernel"
    spec = cluster["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert formats["triton-python"]["autoSelect"] is True
    assert formats["triton"]["autoSelect"] is False  # kserve-tritonserver keeps `triton`
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container"
    args = c["args"]
    kernel_parses(args)
    assert flag(args, "--model-repository") == "/mnt/models"
    assert flag(args, "--http-port") == "8080" and flag(args, "--grpc-port") == "9000"
    assert flag(args, "--metrics-port") == spec["annotations"]["prometheus.kserve.io/port"] == "8002"
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    # Without a startup probe, liveness alone decides while models load (tests/deploy/test_probes.py).
    assert c["startupProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] != 0 and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False


def test_inference_service_uses_the_runtime_and_drains():
    (isvc,) = load_all(KSERVE / "inferenceservice.yaml")
    runtime = runtime_docs()["clusterservingruntime.yaml"]
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    fmt = model["modelFormat"]
    assert any(f["name"] == fmt["name"] and f["version"] == fmt["version"]
               for f in runtime["spec"]["supportedModelFormats"])
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert re.match(r"(gs|s3|pvc|https?)://", model["storageUri"])
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/enable-prometheus-scraping"] == "true"
    ports = {p["containerPort"] for p in model["ports"]}
    args = runtime["spec"]["containers"][0]["args"]
    assert ports == {int(flag(args, "--http-port")), int(flag(args, "--grpc-port"))}
    # graceful rollout: preStop sleep + Kernel's exit timeout fit in the grace period
    sleep = model["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    need = int(sleep[1]) + int(flag(args, "--exit-timeout-secs"))
    assert predictor["terminationGracePeriodSeconds"] >= need + 5


# ---- Helm --------------------------------------------------------------------------------------------

CASES = {
    "defaults": {},
    "hpa+pvc": {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 80},
                "modelRepository": {"source": "pvc", "pvc": {"create": True, "storageClassName": "standard"}}},
    "existing-pvc": {"modelRepository": {"source": "pvc", "pvc": {"claimName": "models", "subPath": "repo"}}},
    "existing-configmap": {"modelRepository": {"configMap": {"existing": "my-models", "items": [
        {"key": "cfg", "path": "m/config.pbtxt"}, {"key": "py", "path": "m/1/model.py"}]}}},
    "image": {"modelRepository": {"source": "image"}, "kernel": {"extraArgs": ["--log-verbose=1"]},
              "image": {"repository": "registry.example.com/kernel", "tag": "1.2.3"}},
}


def render(values: dict | None = None) -> list[dict]:
    out = helm.Chart.load(CHART).render(values or {}, name="kernel", namespace="serving")
    docs = []
    for name, text in sorted(out.items()):
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict]) -> dict:
    out = {}
    for d in docs:
        assert d["kind"] not in out
        out[d["kind"]] = d
    return out


def test_chart_lints():
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2], report


@pytest.mark.parametrize("case", sorted(CASES))
def test_chart_renders_valid_kubernetes(case):
    docs = render(CASES[case])
    for doc in docs:
        k8s_validate(doc)
    kinds = sorted(d["kind"] for d in docs)
    expected = {
        "defaults": ["ConfigMap", "Deployment", "Service"],
        "hpa+pvc": ["Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "Service"],
        "existing-pvc": ["Deployment", "Service"],
        "existing-configmap": ["Deployment", "Service"],
        "image": ["Deployment", "Service"],
    }[case]
    assert kinds == expected


@pytest.mark.parametrize("case", sorted(CASES))
def test_chart_deployment(case):
    objs = by_kind(render(CASES[case]))
    dep = objs["Deployment"]
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    kernel_parses(c["args"])
    assert c["image"] == ("registry.example.com/kernel:1.2.3" if case == "image" else "localhost/kernel:0.1.0")
    # ports, probes, metrics
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert [int(flag(c["args"], f"--{n}-port")) for n in ("http", "grpc", "metrics")] == [8000, 8001, 8002]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/live"  # answered while models load
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8002"
    # security
    psc, sc = pod["spec"]["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 1000
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "/tmp" in mounts  # writable scratch under a read-only root
    # graceful rollout
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    sleep = c["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and grace >= int(sleep[1]) + int(flag(c["args"], "--exit-timeout-secs")) + 5
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # the model repository
    repo = flag(c["args"], "--model-repository")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    if case == "image":
        assert repo not in mounts and "models" not in volumes
    else:
        assert mounts[repo]["readOnly"] is True and mounts[repo]["name"] == "models"
    # the Service reaches the container's named ports
    svc = objs["Service"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        "http": (8000, "http"), "grpc": (8001, "grpc"), "metrics": (8002, "metrics")}
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]


def test_chart_configmap_repository_is_model_repo_examples_add_sub():
    objs = by_kind(render())
    cm, pod = objs["ConfigMap"], objs["Deployment"]["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "models")["configMap"]
    assert vol["name"] == cm["metadata"]["name"]
    files = {item["path"]: cm["data"][item["key"]] for item in vol["items"]}
    assert set(files) == {"add_sub/config.pbtxt", "add_sub/1/model.py"}
    for path, text in files.items():
        assert text == (EXAMPLES / path).read_text(), path
    assert set(cm["data"]) == {item["key"] for item in vol["items"]}


def test_chart_hpa_and_pvc():
    objs = by_kind(render(CASES["hpa+pvc"]))
    dep, hpa, pvc = objs["Deployment"], objs["HorizontalPodAutoscaler"], objs["PersistentVolumeClaim"]
    assert "replicas" not in dep["spec"]  # the HPA owns it
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": dep["metadata"]["name"]}
    pods_metric = next(m for m in hpa["spec"]["metrics"] if m["type"] == "Pods")["pods"]
    assert pods_metric["metric"]["name"] == "nv_inference_pending_request_count"
    assert pods_metric["target"] == {"type": "AverageValue", "averageValue": "4"}
    assert any(m["type"] == "Resource" for m in hpa["spec"]["metrics"])
    vol = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "models")
    assert vol["persistentVolumeClaim"] == {"claimName": pvc["metadata"]["name"], "readOnly": True}
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    objs = by_kind(render(CASES["existing-pvc"]))
    c = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert next(m for m in c["volumeMounts"] if m["name"] == "models")["subPath"] == "repo"


@pytest.mark.parametrize("values, message", [
    ({"terminationGracePeriodSeconds": 20}, "terminationGracePeriodSeconds (20) must be at least"),
    ({"kernel": {"exitTimeoutSecs": 60}}, "must be at least"),
    ({"modelRepository": {"source": "s3"}}, "value must be one of"),
    ({"modelRepository": {"source": "pvc"}}, "set modelRepository.pvc.claimName"),
    ({"modelRepository": {"configMap": {"files": None}}}, "set modelRepository.configMap.files"),
    ({"service": {"httpPort": "eighty"}}, "httpPort"),
])
def test_chart_refuses_bad_values(values, message):
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(values)
