"""Names and paths a client or a config controls never reach outside where they belong (issue 14 items 8, 10, 11).

- a `file:` override thousands of folders deep is a 400 and leaves no temporary folder;
- `default_model_filename` cannot name a file outside the model's version folder;
- the SageMaker target-model header is a model name like any other (no `a/b`, no `../../x`).
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import httpx
import pytest

from conftest import KernelProcess, free_port, running, wait_until_ok

MODELS = Path(__file__).resolve().parent / "models"
ADD_SUB = MODELS / "add_sub_x2"


def add_sub_config(name: str, extra: str = "") -> str:
    text = (ADD_SUB / "config.pbtxt").read_text().replace('name: "add_sub_x2"', f'name: "{name}"')
    return text.replace("count: 2", "count: 1") + extra


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    """An explicit-mode server whose temporary folder is ours to inspect; `escape` is in its repository."""
    base = tmp_path_factory.mktemp("names")
    repo, tmp, outside = base / "repo", base / "tmp", base / "outside"
    for d in (repo, tmp, outside):
        d.mkdir()
    shutil.copytree(ADD_SUB, repo / "add_sub_x2")
    # A model whose config points its model file four folders up, at a file that leaves a mark if run.
    (outside / "x.py").write_text(f"open({str(outside / 'RAN')!r}, 'w').close()\n")
    escape = repo / "escape"
    shutil.copytree(ADD_SUB, escape)
    up = "../" * (len((escape / "1").parts) - 1)
    (escape / "config.pbtxt").write_text(
        add_sub_config("escape", f'\ndefault_model_filename: "{up}{str(outside / "x.py").lstrip("/")}"\n'))
    k = KernelProcess([repo], "--model-control-mode=explicit", "--load-model=add_sub_x2", env={"TMPDIR": str(tmp)})
    for ready in running(k):
        ready.tmp, ready.outside = tmp, outside
        yield ready


def infer_ok(url: str, model: str = "add_sub_x2") -> None:
    body = {"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]} for n in ("INPUT0", "INPUT1")]}
    r = httpx.post(f"http://{url}/v2/models/{model}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text


def load(url: str, name: str, parameters: dict) -> httpx.Response:
    return httpx.post(f"http://{url}/v2/repository/models/{name}/load", json={"parameters": parameters}, timeout=60)


def test_deep_file_override_is_400_and_leaves_nothing(explicit):
    model_py = base64.b64encode((ADD_SUB / "1" / "model.py").read_bytes()).decode()
    deep = "file:" + "a/" * 2000 + "1/model.py"
    r = load(explicit.url, "deep", {"config": json.dumps({"name": "deep", "backend": "python"}), deep: model_py})
    assert r.status_code == 400, r.text
    assert "folders deep" in r.json()["error"]
    # Too many files: refused before anything is written.
    many = {f"file:f{i}.txt": "eA==" for i in range(5000)}
    r = load(explicit.url, "many", {"config": json.dumps({"name": "many", "backend": "python"}), **many})
    assert r.status_code == 400 and "at most" in r.json()["error"], r.text
    assert list(explicit.tmp.glob("kernel-model-*")) == []
    infer_ok(explicit.url)


def test_deep_but_allowed_override_loads_and_unloads_cleanly(explicit):
    model_py = base64.b64encode((ADD_SUB / "1" / "model.py").read_bytes()).decode()
    params = {"config": json.dumps({"name": "nested", "backend": "python",
                                    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0", "INPUT1")],
                                    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("OUTPUT0", "OUTPUT1")]}),
              "file:1/model.py": model_py, "file:" + "d/" * 30 + "notes.txt": "eA=="}
    r = load(explicit.url, "nested", params)
    assert r.status_code == 200, r.text
    infer_ok(explicit.url, "nested")
    r = httpx.post(f"http://{explicit.url}/v2/repository/models/nested/unload", json={}, timeout=60)
    assert r.status_code == 200, r.text
    deadline_ok = wait_until_gone(explicit.tmp)
    assert deadline_ok, list(explicit.tmp.glob("kernel-model-*"))


def wait_until_gone(tmp: Path, timeout: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not list(tmp.glob("kernel-model-*")):
            return True
        time.sleep(0.1)
    return False


def test_default_model_filename_outside_the_model_is_refused(explicit):
    r = load(explicit.url, "escape", {})
    assert r.status_code == 400, r.text
    assert "default_model_filename" in r.json()["error"] and "inside the model's version folder" in r.json()["error"]
    assert not (explicit.outside / "RAN").exists()
    # The same through a load request's own config and files.
    cfg = {"name": "escape2", "backend": "python", "default_model_filename": str(explicit.outside / "x.py")}
    model_py = base64.b64encode((ADD_SUB / "1" / "model.py").read_bytes()).decode()
    r = load(explicit.url, "escape2", {"config": json.dumps(cfg), "file:1/model.py": model_py})
    assert r.status_code == 400 and "default_model_filename" in r.json()["error"], r.text
    infer_ok(explicit.url)


@pytest.mark.parametrize("target", ["a/b", "../../evilname", "..", "x y", "a;b"])
def test_sagemaker_target_model_header_is_a_model_name(start_kernel, tmp_path, target):
    empty = tmp_path / "empty"
    empty.mkdir()
    model = tmp_path / "store" / "m"
    shutil.copytree(ADD_SUB, model)
    (model / "config.pbtxt").write_text(add_sub_config("m"))
    port = free_port()
    k = start_kernel([empty], "--allow-sagemaker=true", f"--sagemaker-port={port}", env={"SAGEMAKER_MULTI_MODEL": "true"})
    wait_until_ok(k, [f"http://127.0.0.1:{port}/ping"])
    c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    r = c.post("/models", json={"model_name": "m", "url": str(model)}, headers={"X-Amzn-SageMaker-Target-Model": target})
    assert r.status_code == 400, r.text
    # Shell characters and whitespace get tritonserver's words (issue 13); paths Kernel's own.
    assert "invalid model name" in r.json()["error"] or "Invalid stub name" in r.json()["error"]
    index = httpx.post(f"http://{k.url}/v2/repository/index", json={}, timeout=10).json()
    assert index == [] or all(m["name"] in ("m",) for m in index), index
    # A good name still loads.
    r = c.post("/models", json={"model_name": "m", "url": str(model)}, headers={"X-Amzn-SageMaker-Target-Model": "m.tar.gz"})
    assert r.status_code == 200, r.text
    infer_ok(k.url, "m.tar.gz")
