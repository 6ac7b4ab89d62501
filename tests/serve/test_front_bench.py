"""The measuring parts of the front-process benchmarks (issue 32): benchmarks/procs.py tells a
server's processes apart and counts their CPU and connections, benchmarks/scale_run.py describes a
stalled load, scripts/scale-check.sh refuses a box too small to say anything.

The figures in results/front_processes.md and a 16-core run's scale.md are only as good as these:
a front counted as a worker, CPU read from the wrong process or a connection counted on the
wrong front would move every "CPU per request per process type" cell.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, KernelProcess

sys.path.insert(0, str(ROOT / "benchmarks"))
import procs  # noqa: E402
import scale_run  # noqa: E402

sys.path.remove(str(ROOT / "benchmarks"))

ADD_SUB = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]}
SLOW_MODEL = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(4)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.float32))]) for _ in requests]
'''
SLOW_CONFIG = '''name: "slow"
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
'''


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    repo = scale_run.build_repo(tmp_path_factory.mktemp("front_bench") / "repo", ["add_sub"], 2)
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    k = KernelProcess([repo])
    try:
        yield k.wait_until_ok(["/v2/health/ready", "/v2/models/add_sub/ready", "/v2/models/slow/ready"])
    finally:
        k.stop()


def _infer(conn: http.client.HTTPConnection, model: str = "add_sub", body: dict = ADD_SUB) -> dict:
    conn.request("POST", f"/v2/models/{model}/infer", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    return json.loads(r.read())


def test_build_repo_sets_every_instance_count(tmp_path):
    repo = scale_run.build_repo(tmp_path / "r", ["add_sub", "tiny_lm"], 8)
    for name in ("add_sub", "tiny_lm"):
        assert "count: 8" in (repo / name / "config.pbtxt").read_text()
        assert (repo / name / "1" / "model.py").exists()


def test_one_front_server_is_one_front_and_its_workers(kernel):
    kinds = procs.classify(kernel.proc.pid)
    assert kinds[kernel.proc.pid] == procs.FRONT  # one front: `kernel serve` serves the clients itself
    assert list(kinds.values()).count(procs.WORKER) >= 3  # add_sub x2 and slow (standbys count as workers)
    assert procs.SUPERVISOR not in kinds.values() and procs.OTHER not in kinds.values()


def test_cpu_and_connections_are_read_from_the_right_processes(kernel):
    """Requests on one keep-alive connection: the front and the workers both spent CPU on them
    (ticks of 10 ms, so a few hundred requests), and the connection is counted on the front."""
    conn = http.client.HTTPConnection("127.0.0.1", kernel.http_port, timeout=10)
    try:
        _infer(conn)
        assert procs.connections_per_process([kernel.proc.pid], kernel.http_port) == {kernel.proc.pid: 1}
        before = procs.Snapshot.take(kernel.proc.pid)
        deadline, n = time.monotonic() + 30, 0
        while n < 600 and time.monotonic() < deadline:
            assert _infer(conn)["outputs"][0]["data"] == [2, 3, 4, 5]
            n += 1
        after = procs.Snapshot.take(kernel.proc.pid)
    finally:
        conn.close()
    cpu, changed = procs.cpu_between(before, after)
    assert changed == 0
    assert cpu[procs.FRONT].seconds > 0 and cpu[procs.FRONT].processes == 1
    assert cpu[procs.WORKER].seconds > 0 and cpu[procs.WORKER].processes >= 3
    assert procs.SUPERVISOR not in cpu
    # every tick of the tree is in some kind: nothing double-counted or lost
    total = sum(after.ticks[p] - before.ticks[p] for p in after.ticks)
    assert round(sum(k.seconds for k in cpu.values()) * procs.TICK) == total


def test_a_stalled_load_is_described(kernel):
    """What scale_run reports when a load stops progressing: the connection, nothing left unread in
    the socket queues (the request is inside the server), and the in-flight gauge showing it."""
    conn = http.client.HTTPConnection("127.0.0.1", kernel.http_port, timeout=15)
    try:
        conn.request("POST", "/v2/models/slow/infer", json.dumps(
            {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1], "data": [1]}]}), {"Content-Type": "application/json"})
        time.sleep(1.0)
        srv = scale_run.harness.Server("Kernel", kernel.http_port, kernel.grpc_port, kernel.metrics_port,
                                       log=Path(kernel.log_path), main_pid=kernel.proc.pid)
        report = scale_run.stall_report(srv, scale_run.Scenario("slow", "", "slow", "http", 1), kernel.http_port, [0.0])
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    q = report["queues"]
    assert q["connections"] >= 1 and q["server_rx_bytes"] == 0 and q["client_rx_bytes"] == 0
    assert report["gauges"].get("inflight_request_count", report["gauges"].get("pending_request_count")) >= 1
    assert report["connections_per_front"] == [1]


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_scale_check_runs_nothing_below_four_cpus(tmp_path):
    """On fewer than 4 CPUs scale-check says so and exits 0 without starting anything."""
    out = subprocess.run(["taskset", "-c", "0", "bash", str(ROOT / "scripts" / "scale-check.sh"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "OUT": ""})
    assert out.returncode == 0, out.stderr
    assert "scale-check: skipped: 1 CPUs here, it needs at least 4" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scale-check.txt"]


@pytest.mark.skipif(not scale_run.kernel_has_front_processes(sys.executable),
                    reason="kernel serve has no --front-processes yet")
def test_several_fronts_are_told_apart(tmp_path):
    """With --front-processes 2: a supervisor, two fronts, the workers; connections are counted on
    whichever front accepted them and add up to what the client opened."""
    repo = scale_run.build_repo(tmp_path / "repo", ["add_sub"], 2)
    k = KernelProcess([repo], "--front-processes", "2")
    conns = []
    try:
        k.wait_until_ok(["/v2/health/ready", "/v2/models/add_sub/ready"])
        kinds = procs.classify(k.proc.pid)
        assert kinds[k.proc.pid] == procs.SUPERVISOR
        assert list(kinds.values()).count(procs.FRONT) == 2
        assert list(kinds.values()).count(procs.WORKER) >= 2
        for _ in range(6):
            c = http.client.HTTPConnection("127.0.0.1", k.http_port, timeout=10)
            _infer(c)
            conns.append(c)
        fronts = [p for p, kind in kinds.items() if kind == procs.FRONT]
        assert sum(procs.connections_per_process(fronts, k.http_port).values()) == 6
    finally:
        for c in conns:
            c.close()
        k.stop()
