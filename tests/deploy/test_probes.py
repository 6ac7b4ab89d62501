"""The deployments' probes against a real `kernel serve` whose model loads for two minutes (issue 27).

The KServe runtimes had a liveness probe and no startup probe: a pod whose models loaded for more
than about 70 s (initialDelaySeconds + periodSeconds * failureThreshold) was restarted, and again,
forever. Here each manifest's container args start Kernel (ports and repository swapped for the
test's), and its probes are sent as the kubelet sends them: the startup probe must succeed within
its budget (failureThreshold * periodSeconds), and liveness must then hold while the model is still
loading, with readiness false, so no load is too long. The manifests themselves are validated
against the Kubernetes and KServe schemas in test_manifests.py.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from conftest import TEST_MODELS, ServerProcess, free_ports
from test_manifests import KSERVE, load_all, render

REPO = TEST_MODELS / "slow_start"  # long_init: initialize() sleeps 120 s
LIVENESS_WATCH_S = 6.0  # how long liveness is watched while the model loads


def kserve_container(name: str) -> dict:
    (c,) = load_all(KSERVE / name)[0]["spec"]["containers"]
    return c


def helm_container() -> dict:
    deployment = next(d for d in render() if d["kind"] == "Deployment")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


CONTAINERS = {
    "clusterservingruntime": lambda: kserve_container("clusterservingruntime.yaml"),
    "servingruntime": lambda: kserve_container("servingruntime.yaml"),
    "helm": helm_container,
}


def status(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # nothing listens yet: the kubelet counts a failure


def probe_url(container: dict, probe: dict, ports: dict[int, int]) -> str:
    """The URL the kubelet asks, on the test's port for the container port the probe names."""
    port = probe["httpGet"]["port"]
    if isinstance(port, str):  # a named container port
        port = next(p["containerPort"] for p in container["ports"] if p.get("name") == port)
    return f"http://127.0.0.1:{ports[port]}{probe['httpGet']['path']}"


@pytest.mark.parametrize("which", sorted(CONTAINERS))
def test_a_long_model_load_passes_the_probes(which, tmp_path):
    c = CONTAINERS[which]()
    assert "startupProbe" in c, "no startup probe: liveness alone decides while models load"
    startup, liveness, readiness = c["startupProbe"], c["livenessProbe"], c["readinessProbe"]
    # The container's own command line, with the test's ports and repository.
    args = c["args"]
    assert args[:2] == ["kernel", "serve"]
    container_ports = {int(a.split("=", 1)[1]): a.split("=", 1)[0] for a in args
                       if a.startswith(("--http-port=", "--grpc-port=", "--metrics-port="))}
    ports = dict(zip(container_ports, free_ports(len(container_ports))))
    swapped = [f"{container_ports[int(a.split('=', 1)[1])]}={ports[int(a.split('=', 1)[1])]}"
               if a.split("=", 1)[0] in ("--http-port", "--grpc-port", "--metrics-port") else a
               for a in args[2:] if not a.startswith("--model-repository=")]
    import sys

    k = ServerProcess([sys.executable, "-m", "kernel", "serve", f"--model-repository={REPO}", *swapped],
                      tmp_path / "kernel.log")
    try:
        # The startup probe, as the kubelet runs it from the container's start.
        url = probe_url(c, startup, ports)
        budget = startup.get("initialDelaySeconds", 0) + startup["periodSeconds"] * startup["failureThreshold"]
        started = time.monotonic()
        while status(url, startup.get("timeoutSeconds", 1)) != 200:
            assert time.monotonic() - started < budget, f"the startup probe gave up after {budget} s:\n{k.log()}"
            assert k.proc.poll() is None, k.log()
            time.sleep(0.2)
        assert k.wait_for_log("long_init initializing in pid", timeout=60), k.log()
        # Liveness from now on, the model still loading: every answer 200, readiness false.
        live, ready = probe_url(c, liveness, ports), probe_url(c, readiness, ports)
        deadline = time.monotonic() + LIVENESS_WATCH_S
        while time.monotonic() < deadline:
            assert status(live, liveness.get("timeoutSeconds", 1)) == 200, k.log()
            assert status(ready, readiness.get("timeoutSeconds", 1)) != 200
            time.sleep(0.5)
        assert "successfully loaded" not in k.log()  # all of it happened during the load
    finally:
        assert k.stop(20) == 0
