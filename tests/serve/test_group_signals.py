"""A stop signal sent to the server's whole process group (systemd's control-group kill mode,
`timeout`, Ctrl-C in a terminal) drains like one sent to the front alone: the workers keep
running the requests in flight and the server exits cleanly (issue 27 follow-up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import free_ports, wait_until_ok

MODELS = Path(__file__).resolve().parents[1] / "models" / "good"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_process_group_lets_requests_in_flight_finish(tmp_path, sig):
    http, grpc, metrics = free_ports(3)
    log = open(tmp_path / "server.log", "w+b")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel", "serve", "--model-repository", str(MODELS), "--model-control-mode=explicit",
         "--load-model=slow_add_sub", "--http-port", str(http), "--grpc-port", str(grpc),
         "--metrics-port", str(metrics)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its own process group
    try:
        wait_until_ok(_Log(proc, tmp_path), [f"http://localhost:{http}/v2/health/ready"], 60)
        answer: dict = {}

        def infer() -> None:
            client = httpclient.InferenceServerClient(f"localhost:{http}", network_timeout=30)
            a = np.arange(4, dtype=np.float32)
            inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
            for t in inputs:
                t.set_data_from_numpy(a)
            try:
                answer["out"] = client.infer("slow_add_sub", inputs).as_numpy("OUTPUT0").tolist()
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                answer["error"] = repr(exc)

        t = threading.Thread(target=infer)
        t.start()
        time.sleep(0.7)  # the request is inside the model's 2 s execute
        os.killpg(proc.pid, sig)  # every process of the group: the front and its workers
        t.join(30)
        assert answer == {"out": [0.0, 2.0, 4.0, 6.0]}, (tmp_path / "server.log").read_text()
        assert proc.wait(30) == 0
        text = (tmp_path / "server.log").read_text()
        assert "not healthy" not in text and "Traceback" not in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


class _Log:
    """What wait_until_ok needs of a server: its process and its log."""

    def __init__(self, proc, tmp_path):
        self.proc = proc
        self._path = tmp_path / "server.log"

    def log(self) -> str:
        return self._path.read_text(errors="replace")
