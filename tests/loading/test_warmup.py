"""Model warmup (`model_warmup` in config.pbtxt, `ModelConfig(model_warmup=[...])` for bound
callables), against a real `kernel serve` and an in-process Triton. Expectations follow what
tritonserver 2.51 did with the same kind of Python-backend models: every sample runs `count`
times on every instance before the model is READY, batch_size N is N batch-1 requests in one
execution, zero/random/file data, the first failure fails the load with Triton's message, and
warmup requests count in the statistics. The models record what they execute in seen.jsonl."""

from __future__ import annotations

import json
import shutil
from collections import Counter
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

from conftest import TEST_MODELS, free_ports

MODELS = TEST_MODELS / "warmup"


def seen(repo: Path, model: str) -> list[dict]:
    path = repo / model / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def repo_with(tmp_path: Path, *models: str) -> Path:
    repo = tmp_path / "repo"
    for m in models:
        shutil.copytree(MODELS / m, repo / m)
    return repo


def get(k, path: str):
    with urllib.request.urlopen(f"http://{k.url}{path}") as r:
        return json.loads(r.read())


def test_samples_run_count_times_on_every_instance_before_ready(start_kernel, tmp_path):
    repo = repo_with(tmp_path, "warm_samples", "warm_nobatch")
    k = start_kernel([repo]).wait_ready()
    # Ready means every warmup has run already: nothing is still arriving.
    lines = seen(repo, "warm_samples")
    random = [r for r in lines if "I" in r]
    zeros = [r for r in lines if "I" not in r and r["S"]["values"] == ["", ""]]
    files = [r for r in lines if "I" not in r and r["S"]["values"] == ["abc", "de"]]
    # Two instances; "random": batch_size 2 x count 3, "zeros": once (count 0), "from_files": count 2.
    assert (len(random), len(zeros), len(files), len(lines)) == (12, 2, 4, 18)
    # batch_size 2: two batch-1 requests in one execution.
    assert all(r["batch"] == 2 and r["INPUT0"]["shape"] == [1, 3] for r in random)
    assert all(r["batch"] == 1 for r in zeros + files)
    # random_data is random bytes (not zeros), drawn once per sample and instance: the six requests
    # an instance gets share it, the other instance has its own; for strings it is empty strings,
    # as in Triton.
    zero3 = bytes(12).hex()
    per_instance = Counter(r["INPUT0"]["hex"] for r in random)
    assert sorted(per_instance.values()) == [6, 6] and zero3 not in per_instance
    assert random[0]["I"]["hex"] != bytes(8).hex() and random[0]["I"]["dtype"] == "int32"
    assert all(r["S"]["values"] == ["", ""] for r in random)
    assert all(r["INPUT0"]["hex"] == zero3 for r in zeros)
    assert all(np.frombuffer(bytes.fromhex(r["INPUT0"]["hex"]), "<f4").tolist() == [1.5, 2.5, 3.5] for r in files)
    # A model without batching gets the sample's dims as they are.
    nobatch = seen(repo, "warm_nobatch")
    assert len(nobatch) == 2 and all(r["INPUT0"]["shape"] == [3] for r in nobatch)
    # Two loads draw different random data.
    stats = get(k, "/v2/models/warm_samples/stats")["model_stats"][0]
    assert stats["inference_count"] == 18 and stats["execution_count"] == 12  # warmup counts, as in Triton
    k.stop()
    (repo / "warm_samples" / "seen.jsonl").unlink()
    start_kernel([repo]).wait_ready()
    again = [r for r in seen(repo, "warm_samples") if "I" in r]
    assert again and again[0]["INPUT0"]["hex"] != random[0]["INPUT0"]["hex"]


def test_a_failing_warmup_fails_the_load_with_tritons_message(start_kernel, tmp_path):
    repo = repo_with(tmp_path, "warm_fail", "warm_nobatch")
    # A sample of batch size 2 for a model without batching.
    shutil.copytree(MODELS / "warm_nobatch", repo / "warm_big")
    config = repo / "warm_big" / "config.pbtxt"
    config.write_text(config.read_text().replace("warm_nobatch", "warm_big").replace("batch_size: 1", "batch_size: 2"))
    k = start_kernel([repo], "--exit-on-error=false", "--strict-readiness=false").wait_ready()
    req = urllib.request.Request(f"http://{k.url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req) as r:
        index = {m["name"]: m for m in json.loads(r.read())}
    failed = index["warm_fail"]
    assert failed["state"] == "UNAVAILABLE"
    assert failed["reason"].startswith("failed to run warmup sample 'failing_sample': ")
    assert "boom in warmup" in failed["reason"] and failed["reason"].endswith("; ")
    # The sample stops at its first failure (count 2 would be 4 runs over the two instances).
    assert len(seen(repo, "warm_fail")) == 2
    assert index["warm_nobatch"]["state"] == "READY"
    assert index["warm_big"]["reason"] == (
        "failed to run warmup sample 'plain': batch size 2 for 'warm_big_0_0', max allowed is 0; "
        "batch size 2 for 'warm_big_0_0', max allowed is 0; ")
    assert not seen(repo, "warm_big")
    # Its instances were stopped: no worker of warm_fail is left running.
    assert k.wait_for_log("failed to load 'warm_fail'")


def test_bound_callables_get_random_warmup_data():
    """PyTriton 0.7: ModelConfig(model_warmup=[ModelWarmup(...)]) runs the callable before the model
    is served; random_data is random for every dtype (integers were zeros before)."""
    from kernel.decorators import batch
    from kernel.model_config import ModelConfig, ModelWarmup, Tensor, WarmupInput
    from kernel.triton import Triton, TritonConfig

    got = []

    @batch
    def record(x, s):
        got.append((x.copy(), s.copy()))
        return {"y": x}

    warmup = ModelWarmup(name="w", batch_size=3, count=2, inputs={
        "x": WarmupInput(dtype=np.int32, shape=(4,), random_data=True),
        "s": WarmupInput(dtype=np.bytes_, shape=(1,), random_data=True),
    })
    http, grpc, metrics = free_ports(3)
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)
    with Triton(config=config, workspace=Path(tempfile.mkdtemp()) / "ws") as triton:
        triton.bind("warm", record, config=ModelConfig(model_warmup=[warmup]),
                    inputs=[Tensor(name="x", dtype=np.int32, shape=(4,)), Tensor(name="s", dtype=np.bytes_, shape=(1,))],
                    outputs=[Tensor(name="y", dtype=np.int32, shape=(4,))])
        triton.run()
        assert len(got) == 2  # count 2, run before the model is served
    x, s = got[0]
    assert x.shape == (3, 4) and x.dtype == np.int32 and np.count_nonzero(x) > 0
    assert not np.array_equal(got[0][0], got[1][0])
    assert s.shape == (3, 1) and all(8 <= len(v) <= 32 for v in s.reshape(-1))
