"""A large request to a model with the response cache costs its own client time, not every client's.

The local cache made a request's key from a copy of its input bytes and compared them on a hit,
and copied a response's outputs into its entry, all on the front's event loop: a 256 MiB request
held every client of the front for 0.4-0.6 s, each time (measured with a loop watchdog; the
cache's own nv_cache_*_duration metrics said the same). Now a large input is in the key as its
SHA-256 digest, hashed on a thread before the request is admitted, and a large response is copied
into its entry on a thread (kernel.core.cache, kernel.core.admission). This test sends the same
512 MiB request twice (a miss, then a hit) to a real `kernel serve`, from a process of its own,
with the liveness probe running, and checks both answers byte for byte.
"""

from __future__ import annotations

import re
import shutil
import sys
import urllib.request

import pytest

from conftest import ROOT, KernelProcess, running
from liveness import probe_client

MAX_FREEZE_MS = 500  # generous for a loaded 2-core box; the unfixed front froze ~1 s on the hit
MIB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cache-large")
    shutil.copytree(ROOT / "benchmarks" / "model_repo_suite" / "identity_fp32", repo / "identity_fp32")
    config = repo / "identity_fp32" / "config.pbtxt"
    config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    yield from running(KernelProcess([repo], "--cache-config", f"local,size={2048 * MIB}",
                                     "--http-max-input-size", str(1024 * MIB)))


CLIENT = r"""
import sys
import numpy as np
import tritonclient.http as httpclient
data = np.arange(512 << 18, dtype=np.uint32).view(np.float32)  # 512 MiB, every word different
tensor = httpclient.InferInput("INPUT0", [data.size], "FP32")
tensor.set_data_from_numpy(data, binary_data=True)
print("ready", flush=True)
sys.stdin.readline()
for _ in range(2):  # a miss, then a hit
    # A connection each: checking 512 MiB on a loaded box can outlast the server's keep-alive
    # timeout, and the client would then send its next request into a closed connection.
    with httpclient.InferenceServerClient(sys.argv[1], network_timeout=300, connection_timeout=300) as client:
        result = client.infer("identity_fp32", [tensor],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    assert np.array_equal(result.as_numpy("OUTPUT0").view(np.uint32), data.view(np.uint32)), "not the input"
    del result
print("answered byte for byte, twice", flush=True)
"""


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://localhost:{port}/metrics") as r:
        text = r.read().decode()
    m = re.search(rf'^{name}{{model="identity_fp32",version="1"}} (\S+)$', text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_a_512_mib_request_to_a_caching_model_does_not_freeze_the_front(server):
    probe, out, err, status = probe_client(server.url, [sys.executable, "-c", CLIENT, server.url])
    assert status == 0 and "byte for byte, twice" in out, f"the client failed:\n{out}\n{err}"
    assert metric(server.metrics_port, "nv_cache_num_hits_per_model") == 1  # the second one was a hit
    assert metric(server.metrics_port, "nv_inference_exec_count") == 1  # the model ran once
    assert len(probe.latencies_ms) >= 10, probe.summary()
    assert probe.max_ms() < MAX_FREEZE_MS, f"/v2/health/live froze while the request was keyed or stored: {probe.summary()}"
