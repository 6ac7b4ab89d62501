"""Start-up time and idle memory (issue 17): what keeps `kernel serve` quick to ready and small.

- models start at the same time, not one after the other;
- `kernel serve` starts standby workers (backends/python/standby.py; all but one forked from the
  first, standby_fork.py) before the front imports the server, each instance takes one, the ones
  nobody took are gone once the server is ready, and a forked one's exit is reported as any worker's;
- a worker imports nothing of the front (the backend plug-in, the core's requests, execenv);
- the CLI module imports nothing of the server before the standbys are started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, KernelProcess

SLOW_MODEL = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(0.5)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
'''

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
'''


def make_model(repo: Path, name: str, count: int = 1, source: str = SLOW_MODEL) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, count=count))


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_models_start_concurrently(tmp_path):
    # Two models whose initialize() each sleeps 0.5 s: one after the other they could not be ready
    # within 1 s of the loading line of the first.
    for name in ("slow_a", "slow_b"):
        make_model(tmp_path, name)
    k = KernelProcess([tmp_path], "--log-verbose", "1")
    try:
        k.wait_until_ok(["/v2/health/ready", "/v2/models/slow_a/ready", "/v2/models/slow_b/ready"])
        log = k.log()
        stamps = [line.split()[1] for line in log.splitlines()
                  if '"loading: slow_' in line or "successfully loaded 'slow_" in line]
        assert len(stamps) == 4, log

        def seconds(stamp: str) -> float:
            h, m, s = stamp.split(":")
            return int(h) * 3600 + int(m) * 60 + float(s)

        assert seconds(stamps[-1]) - seconds(stamps[0]) < 1.0, log
    finally:
        k.stop()


def test_standby_workers_serve_the_instances_and_the_rest_leave(tmp_path):
    make_model(tmp_path, "two", count=2, source=SLOW_MODEL.replace("time.sleep(0.5)", "pass"))
    make_model(tmp_path, "one", source=SLOW_MODEL.replace("time.sleep(0.5)", "pass"))
    # Counted as a Python model but never loaded (its config cannot be parsed): its standby is let go.
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "config.pbtxt").write_text('backend: "python"\nthis is not pbtxt')
    k = KernelProcess([tmp_path], "--exit-on-error", "false", "--strict-readiness", "false")
    try:
        k.wait_ready()
        deadline = time.monotonic() + 10
        while True:
            workers = [cmdline(p) for p in children(k.proc.pid)]
            if len(workers) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(workers) == 3, workers  # the three instances; the fourth standby exited
        assert all("kernel.backends.python.standby" in c for c in workers), workers
        body = b'{"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [1]}]}'
        import urllib.request

        for model in ("one", "two"):
            with urllib.request.urlopen(f"http://{k.url}/v2/models/{model}/infer", data=body, timeout=10) as r:
                assert r.status == 200
    finally:
        k.stop()


def test_estimate_reads_the_repository(tmp_path, monkeypatch):
    from kernel.backends.python import standby

    monkeypatch.setattr(standby, "MAX_STANDBYS", 8)
    make_model(tmp_path, "a", count=3)
    make_model(tmp_path, "b")
    (tmp_path / "ens").mkdir()
    (tmp_path / "ens" / "config.pbtxt").write_text('platform: "ensemble"\n')
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "config.pbtxt").write_text(
        'backend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value { string_value: "/x.tar.gz" } }\n')
    (tmp_path / "no_config" / "1").mkdir(parents=True)  # auto-completed: one instance
    (tmp_path / "not_a_model.txt").write_text("")
    assert standby.estimate([tmp_path]) == 3 + 1 + 1
    assert standby.estimate([tmp_path / "missing"]) == 0
    assert standby.estimate([tmp_path], names={"a", "ens"}) == 3
    assert standby.estimate([tmp_path], names=set()) == 0
    for i in range(40):
        make_model(tmp_path, f"many_{i}")
    assert standby.estimate([tmp_path]) == 8


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, cwd=ROOT, check=True, env={**os.environ}).stdout
    return set(out.split())


def test_worker_imports_nothing_of_the_front():
    modules = _modules_after("import kernel.backends.python.worker")
    front_only = {"kernel.backends.python.backend", "kernel.backends.python.instance", "kernel.backends.python.execenv",
                  "kernel.backends.python.envarchive", "kernel.core.request", "kernel.core.server", "tarfile"}
    assert not modules & front_only, sorted(modules & front_only)


def test_cli_imports_nothing_of_the_server():
    # `kernel serve` starts its standby workers first; everything heavy comes after.
    modules = _modules_after("import kernel.serve.cli, kernel.backends.python.standby")
    heavy = {"numpy", "google.protobuf", "kernel.core.server", "kernel.loading.control", "prometheus_client", "grpc",
             "uvicorn", "kernel.backends.python.backend", "kernel.transports.grpc"}
    assert not modules & heavy, sorted(modules & heavy)


def test_explicit_mode_starts_standbys_for_the_models_it_loads_only(tmp_path):
    for name in ("idle", "wanted"):
        make_model(tmp_path, name, source=SLOW_MODEL.replace("time.sleep(0.5)", "pass"))
    k = KernelProcess([tmp_path], "--model-control-mode", "explicit")
    try:
        k.wait_ready()
        assert children(k.proc.pid) == []
    finally:
        k.stop()
    k = KernelProcess([tmp_path], "--model-control-mode", "explicit", "--load-model", "wanted")
    try:
        k.wait_until_ok(["/v2/health/ready", "/v2/models/wanted/ready"])
        workers = [cmdline(p) for p in children(k.proc.pid)]
        assert len(workers) == 1 and "kernel.backends.python.standby" in workers[0], workers
    finally:
        k.stop()


def test_front_without_grpc_does_not_import_it(tmp_path):
    code = (
        "from kernel.serve import cli\n"
        f"args = cli.build_parser().parse_args(['serve', '--model-repository', {str(tmp_path)!r}, '--allow-grpc', 'false'])\n"
        "cli.build_server(args)"
    )
    modules = _modules_after(code)
    assert "kernel.transports.http" in modules  # the check sees what build_server imports
    assert not {m for m in modules if m.startswith(("kernel.transports.grpc", "grpc"))}
    assert "kernel.transports.metrics" in modules and "prometheus_client" not in modules  # until the first scrape


def test_python_backend_leaves_the_archive_code_to_models_that_name_an_environment():
    modules = _modules_after("from kernel.backends.python import PythonBackend\nPythonBackend()")
    archive = {"tarfile", "kernel.backends.python.envarchive", "kernel.backends.python.envboot"}
    assert not modules & archive, sorted(modules & archive)


def test_assigning_a_standby_that_died_meanwhile_is_not_an_error():
    # Its exit (not a BrokenPipeError from the front) reports the failed start, as for any worker.
    import socket

    from kernel.backends.python import standby

    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the standby is gone
    a, b = socket.socketpair()
    dead = standby.Standby(process=None, channel=a, fd_channel=b, assign_fd=write_fd, env={})
    dead.assign(["--model-file", "x"])
    with pytest.raises(OSError):
        os.fstat(write_fd)  # closed all the same
    a.close()
    b.close()


def test_forked_standbys_are_the_fronts_children_and_report_their_exit(tmp_path):
    # Three standbys: one started, two forked from it and re-parented to the front. A worker that
    # dies is reported with its exit status and restarted, whichever kind it was.
    import signal as signals

    for name in ("m1", "m2", "m3"):
        make_model(tmp_path, name, source=SLOW_MODEL.replace("time.sleep(0.5)", "pass"))
    k = KernelProcess([tmp_path])
    try:
        k.wait_ready()
        workers = children(k.proc.pid)
        assert len(workers) == 3 and all("kernel.backends.python.standby" in cmdline(p) for p in workers)
        # The template and its two clones (each titled as the worker it became: standby._retitle).
        assert sum("(forked from kernel.backends.python.standby)" in cmdline(p) for p in workers) == 2
        for pid in workers:
            os.kill(pid, signals.SIGKILL)
        assert k.wait_for_log("exited unexpectedly with code -9", times=3, timeout=20), k.log()
        assert k.wait_for_log("restarted", times=3, timeout=60), k.log()
        k.wait_until_ok(["/v2/models/m1/ready", "/v2/models/m2/ready", "/v2/models/m3/ready"])
    finally:
        k.stop()


def test_standby_workers_can_be_turned_off(tmp_path):
    # KERNEL_STANDBY_WORKERS=0: every worker is a fresh interpreter started for its instance.
    make_model(tmp_path, "plain", count=2, source=SLOW_MODEL.replace("time.sleep(0.5)", "pass"))
    k = KernelProcess([tmp_path], env={"KERNEL_STANDBY_WORKERS": "0"})
    try:
        k.wait_until_ok(["/v2/health/ready", "/v2/models/plain/ready"])
        workers = [cmdline(p) for p in children(k.proc.pid)]
        assert len(workers) == 2, workers
        assert all("kernel.backends.python.worker" in c and "kernel.backends.python.standby" not in c for c in workers), workers
    finally:
        k.stop()
