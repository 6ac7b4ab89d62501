"""model_repo_examples/tiny_lm follows Triton's vLLM tensor convention: real tritonserver 2.51 serves it
unmodified, its generate_stream answers what Kernel's does, and Kernel's OpenAI API streams the
same words for the same sampling parameters (the convention's mapping, checked against Triton).

Real Triton comes from benchmarks/peers.py (KERNEL_PEERS_DIR, or benchmarks/.peers; installed on
first use), started from /tmp so Kernel's own triton_python_backend_utils cannot shadow Triton's.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import EXAMPLES, ROOT, free_ports

_spec = importlib.util.spec_from_file_location("kernel_bench_peers", ROOT / "benchmarks" / "peers.py")
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)

SAMPLING = {"seed": 3, "max_tokens": 6, "temperature": 0.8, "top_p": 0.95}
PROMPT = "tell me about the river"


def _wait(proc, url: str, log, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} not ready:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    peers.ensure()
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(EXAMPLES / "tiny_lm", repo / "tiny_lm")
    logs = tmp_path_factory.mktemp("logs")
    t_http, t_grpc, t_metrics, k_http, k_grpc, k_metrics, k_openai = free_ports(7)
    started = []
    try:
        log = logs / "triton.log"
        with open(log, "wb") as out:
            triton = subprocess.Popen(peers.tritonserver_cmd(repo, t_http, t_grpc, t_metrics), env=peers.env(),
                                      cwd="/tmp", stdout=out, stderr=subprocess.STDOUT)
        started.append(triton)
        _wait(triton, f"http://localhost:{t_http}/v2/health/ready", log)
        klog = logs / "kernel.log"
        with open(klog, "wb") as out:
            kernel = subprocess.Popen([sys.executable, "-m", "kernel", "serve", f"--model-repository={repo}",
                                       f"--http-port={k_http}", f"--grpc-port={k_grpc}", f"--metrics-port={k_metrics}",
                                       f"--openai-port={k_openai}"], cwd="/tmp", stdout=out, stderr=subprocess.STDOUT)
        started.append(kernel)
        _wait(kernel, f"http://localhost:{k_http}/v2/health/ready", klog)
        yield {"triton": t_http, "kernel": k_http, "openai": k_openai}
    finally:
        for proc in started:
            proc.terminate()
            proc.wait(60)


def _events(port: int, body: dict, stream: bool = True):
    conn = http.client.HTTPConnection("localhost", port, timeout=60)
    try:
        conn.request("POST", f"/v2/models/tiny_lm/{'generate_stream' if stream else 'generate'}", json.dumps(body))
        response = conn.getresponse()
        data = response.read().decode()
    finally:
        conn.close()
    if not stream:
        return response.status, json.loads(data)
    return response.status, [json.loads(e[len("data: "):]) for e in data.split("\n\n") if e.startswith("data: ")]


def test_generate_stream_answers_as_under_triton(servers):
    body = {"text_input": PROMPT, "stream": True, "exclude_input_in_output": True,
            "sampling_parameters": json.dumps(SAMPLING), "return_num_output_tokens": True,
            "return_num_input_tokens": True, "return_finish_reason": True}
    triton = _events(servers["triton"], body)
    kernel = _events(servers["kernel"], body)
    assert triton[0] == kernel[0] == 200
    assert len(triton[1]) == 6 and triton == kernel
    assert triton[1][-1]["finish_reason"] == "length"
    whole = dict(body, stream=False, exclude_input_in_output=False)
    assert _events(servers["triton"], whole, False) == _events(servers["kernel"], whole, False)
    refused = dict(whole, sampling_parameters=json.dumps({"max_tokens": 9999}))
    t_status, t_doc = _events(servers["triton"], refused, False)
    k_status, k_doc = _events(servers["kernel"], refused, False)
    assert t_status == k_status == 400 and t_doc == k_doc


def test_the_openai_api_streams_the_words_triton_generates(servers):
    from openai import OpenAI

    body = {"text_input": PROMPT, "stream": True, "exclude_input_in_output": True,
            "sampling_parameters": json.dumps(SAMPLING)}
    words = [e["text_output"] for e in _events(servers["triton"], body)[1]]
    with OpenAI(base_url=f"http://localhost:{servers['openai']}/v1", api_key="unused", max_retries=0) as client:
        chunks = list(client.completions.create(model="tiny_lm", prompt=PROMPT, stream=True, **SAMPLING))
    assert [c.choices[0].text for c in chunks] == words
