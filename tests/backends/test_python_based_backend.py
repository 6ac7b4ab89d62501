"""Python-based backends: <backend-directory>/<name>/model.py serves every model that says backend: "<name>"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, TESTS, KernelProcess

HERE = TESTS / "python_based"
BACKENDS = HERE / "backends"
MODELS = HERE / "models"
BAD_MODELS = HERE / "bad_models"



@pytest.fixture(scope="module")
def based_server():
    k = KernelProcess([MODELS], "--backend-directory", str(BACKENDS))
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def _infer(client, model: str, x: np.ndarray):
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    return result.as_numpy("OUTPUT0"), json.loads(result.as_numpy("INFO")[0])


@pytest.mark.parametrize("model, scale", [("scale_by_two", 2.0), ("scale_by_three", 3.0)])
def test_one_backend_serves_two_models(based_server, model, scale):
    client = httpclient.InferenceServerClient(based_server.url)
    assert client.is_model_ready(model)
    x = np.arange(5, dtype=np.float32)
    out, info = _infer(client, model, x)
    np.testing.assert_array_equal(out, x * scale)
    # One model.py, the backend's; each model still sees its own identity.
    assert Path(info["module_file"]) == BACKENDS / "scaler" / "model.py"
    assert info["model_name"] == model
    assert info["config_name"] == model
    assert info["model_version"] == "1"
    assert Path(info["model_repository"]).resolve() == MODELS / model
    assert Path(info["model_dir"]).resolve() == MODELS / model / "1"
    assert info["backend"] == "scaler"
    assert info["runtime"] == "model.py"


def test_config_reports_backend_and_runtime(based_server):
    client = httpclient.InferenceServerClient(based_server.url)
    config = client.get_model_config("scale_by_two")
    assert config["backend"] == "scaler"
    assert config["runtime"] == "model.py"
    # The backend's auto_complete_config filled in the tensors this config left out.
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    assert [o["name"] for o in config["output"]] == ["OUTPUT0", "INFO"]
    three = client.get_model_config("scale_by_three")
    assert sum(g["count"] for g in three["instance_group"]) == 2
    assert client.get_model_metadata("scale_by_three")["platform"] == "scaler"


def test_backend_model_py_wins_over_the_repository_one(based_server):
    # scale_by_two/1/model.py raises in initialize; the model loaded, so it was never run.
    assert (MODELS / "scale_by_two" / "1" / "model.py").is_file()
    client = httpclient.InferenceServerClient(based_server.url)
    assert client.is_model_ready("scale_by_two")
    assert "must not be used" not in based_server.log()


def test_missing_backend_names_the_directories_searched(start_kernel):
    k = start_kernel([BAD_MODELS])  # the default --backend-directory
    assert k.wait_exit(60) != 0
    log = k.log()
    default_dir = ROOT / "backends" / "python_based"
    assert "unable to find backend 'no_such_backend' for model 'no_such_backend'" in log
    assert str(default_dir / "no_such_backend" / "model.py") in log
    assert "libtriton_no_such_backend.so" in log


def test_backend_directory_flag_changes_where_backends_are_found(start_kernel, tmp_path):
    k = start_kernel([MODELS], "--backend-directory", str(tmp_path))
    assert k.wait_exit(60) != 0
    log = k.log()
    assert str(tmp_path / "scaler" / "model.py") in log
    assert "failed to load 'scale_by_two'" in log
