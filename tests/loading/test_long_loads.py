"""Long model loads: `stub-timeout-seconds` bounds the worker's start, not the model's initialize()
(tritonserver 2.51 with stub-timeout-seconds=2 loads a model whose initialize sleeps 4 s), and
Kernel logs progress while a load takes long ("still loading '<model>' version <v> (N s)")."""

from __future__ import annotations

import urllib.request

import numpy as np
import tritonclient.http as httpclient

from conftest import TEST_MODELS

REPO = TEST_MODELS / "long_loads"


def test_initialize_longer_than_the_stub_timeout_loads_and_logs_progress(start_kernel):
    k = start_kernel([REPO], "--backend-config", "python,stub-timeout-seconds=2").wait_ready(timeout=60)
    c = httpclient.InferenceServerClient(k.url)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([7], dtype=np.float32))
    assert c.infer("slow_init", [x]).as_numpy("OUTPUT0").tolist() == [7.0]
    c.close()
    log = k.log()
    assert "still loading 'slow_init' version 1 (5 s)" in log
    assert "Timed out" not in log
    with urllib.request.urlopen(f"http://localhost:{k.metrics_port}/metrics") as r:
        metrics = r.read().decode()
    load_s = float(next(line.split()[-1] for line in metrics.splitlines()
                        if line.startswith('nv_model_load_duration_secs{model="slow_init"')))
    assert load_s >= 6.5


def test_the_stub_timeout_still_bounds_the_worker_start(start_kernel):
    # No Python interpreter starts in 10 ms: the worker never reports in time. Without standby
    # workers, that is: a standby has done its imports before the model is assigned to it and may
    # report within 10 ms (then the load goes on, correctly), so this test starts fresh interpreters.
    k = start_kernel([REPO], "--backend-config", "python,stub-timeout-seconds=0.01",
                     env={"KERNEL_STANDBY_WORKERS": "0"})
    assert k.wait_exit(60) != 0
    log = k.log()
    assert "Timed out occurred while waiting for the stub process 'slow_init_0_0' to become ready" in log
    assert "still loading" not in log
