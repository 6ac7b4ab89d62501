"""What an operator meets while a model takes long to load (issue 27), against a real `kernel serve`
whose only model spends two minutes in initialize():

- Ctrl-C or SIGTERM during the load is logged at once, the load is abandoned, its worker is
  stopped and the server exits within seconds (it used to finish the load, start every listener,
  and only then stop; a pod deleted meanwhile waited for SIGKILL);
- a port that is taken is reported before any model loads, in tritonserver's one line (it used to
  be found after the last load);
- /v2/health/live (and gRPC ServerLive) answer while the load runs, readiness staying false, so a
  liveness probe does not kill the pod that is loading. tritonserver 2.51 listens on nothing until
  its models are loaded; its "Started <service> at <address>" lines still follow the model table.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import EXAMPLES, TEST_MODELS, KernelProcess

REPO = TEST_MODELS / "slow_start"  # long_init: initialize() sleeps 120 s


def worker_pid(k: KernelProcess) -> int:
    """The pid of the model's worker, once its initialize() is running."""
    assert k.wait_for_log("long_init initializing in pid ", timeout=60), k.log()
    return int(re.search(r"long_init initializing in pid (\d+)", k.log()).group(1))


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_long_load_stops_the_server_within_seconds(start_kernel, sig):
    k = start_kernel([REPO])
    worker = worker_pid(k)
    sent = time.monotonic()
    k.proc.send_signal(sig)
    assert k.wait_exit(20) == 0, k.log()
    took = time.monotonic() - sent
    assert took < 5.0, f"stopped {took:.1f} s after the signal"
    deadline = time.monotonic() + 2
    while running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(worker), "the model's worker outlived the server"
    log = k.log()
    assert f"Received signal {int(sig)} ({sig.name}), shutting down" in log
    assert "start-up interrupted: stopped loading 'long_init' version 1" in log
    assert "Started HTTPService" not in log  # it never served
    assert "successfully loaded" not in log and "successfully unloaded" not in log
    assert "Traceback" not in log


# Makes the front's import of kernel.serve.compose (part of building the server, before anything
# listens) take 30 s, as a very busy box stretches the real imports; it says when it starts.
SLOW_IMPORT = """
import sys, time

class SlowCompose:
    def find_spec(self, name, path=None, target=None):
        if name == "kernel.serve.compose":
            sys.stderr.write("slow import of kernel.serve.compose started\\n")
            sys.stderr.flush()
            time.sleep(30)
        return None

sys.meta_path.insert(0, SlowCompose())
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_server_is_built_stops_it_at_once(start_kernel, tmp_path, sig):
    """The front imports and builds the server on the event loop's thread, where the loop sees no
    signal: a Ctrl-C there used to wait for the imports to end (1.8 s seen on a busy box)."""
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(SLOW_IMPORT)
    path = os.pathsep.join(p for p in (str(tmp_path / "hook"), os.environ.get("PYTHONPATH", "")) if p)
    k = start_kernel([REPO], env={"PYTHONPATH": path})
    assert k.wait_for_log("slow import of kernel.serve.compose started", timeout=60), k.log()
    sent = time.monotonic()
    k.proc.send_signal(sig)
    assert k.wait_exit(40) == 0, k.log()
    took = time.monotonic() - sent
    assert took < 3.0, f"stopped {took:.1f} s after the signal"
    log = k.log()
    assert f"Received signal {int(sig)} ({sig.name}), shutting down" in log
    assert "Traceback" not in log and "listening at" not in log and "loading:" not in log


@pytest.mark.parametrize("service, flag, address, extra", [
    ("HTTP", "--http-port", "127.0.0.1", []),
    ("GRPC", "--grpc-port", "127.0.0.1", []),
    # starts after the models (its start checks the endpoint's model), so its port is only checked before
    ("Sagemaker", "--sagemaker-port", "0.0.0.0", ["--allow-sagemaker=true"]),
])
def test_a_taken_port_is_reported_before_any_model_loads(service, flag, address, extra):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        k = KernelProcess([REPO], "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                          "--metrics-address=127.0.0.1", *extra, f"{flag}={port}")
        try:
            assert k.wait_exit(30) == 1, k.log()
        finally:
            k.stop()
    log = k.log()
    assert f"failed to start {service} service: Unavailable - Socket '{address}:{port}' already in use " in log
    assert "loading: long_init" not in log and "long_init initializing" not in log


def test_live_while_a_long_load_runs_ready_only_when_loaded(start_kernel):
    import tritonclient.grpc as grpcclient

    k = start_kernel([REPO])
    worker_pid(k)
    assert status(f"http://{k.url}/v2/health/live") == 200
    assert status(f"http://{k.url}/v2/health/ready") == 400
    with grpcclient.InferenceServerClient(k.grpc_url) as c:
        assert c.is_server_live() and not c.is_server_ready()
    log = k.log()
    assert f"HTTPService listening at 0.0.0.0:{k.http_port} while models load (live, not ready)" in log
    assert "Started HTTPService" not in log  # scripts that wait for it must not see it before the models load
    assert k.stop(20) == 0


def test_started_lines_follow_the_model_table(start_kernel):
    """tritonserver's order, which start-up scripts rely on: the model table, then one "Started" line
    per service, the first once every model is loaded."""
    k = start_kernel([EXAMPLES]).wait_ready()
    lines = k.log().splitlines()
    table = next(i for i, line in enumerate(lines) if "| Model" in line)
    started = [i for i, line in enumerate(lines) if re.search(r'"Started (HTTPService|GRPCInferenceService|'
                                                                 r'Metrics Service) at ', line)]
    assert len(started) == 3 and min(started) > table, "\n".join(lines)


SLOWISH = """
import os, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"slowish initializing in pid {os.getpid()}")
        time.sleep(4)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
"""


def test_repository_calls_wait_for_the_start_up_load_of_their_model(start_kernel, tmp_path):
    """Explicit mode: Kernel listens while --load-model models load, so the repository API can be
    called meanwhile. An unload of a model still loading at start-up waits for that load and then
    unloads it (it used to answer at once, and the start-up load then left the model READY)."""
    folder = tmp_path / "repo" / "slowish"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text((REPO / "long_init" / "config.pbtxt").read_text().replace("long_init", "slowish"))
    (folder / "1" / "model.py").write_text(SLOWISH)
    k = start_kernel([tmp_path / "repo"], "--model-control-mode=explicit", "--load-model=slowish")
    assert k.wait_for_log("slowish initializing in pid", timeout=60), k.log()
    base = f"http://{k.url}"
    request = urllib.request.Request(f"{base}/v2/repository/models/slowish/unload", data=b"", method="POST")
    sent = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as r:
        assert r.status == 200
    assert time.monotonic() - sent > 1.0, "answered while the start-up load still ran"
    for _ in range(3):  # and it stays unloaded
        assert status(f"{base}/v2/models/slowish/ready") == 400
        time.sleep(0.5)
    assert "successfully loaded 'slowish'" in k.log()  # the start-up load ended first
    assert k.stop(20) == 0
