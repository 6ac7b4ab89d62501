"""pb_utils.load_model / unload_model / is_model_ready called from inside a model (the 'loader' test model).

Allowed in explicit mode; in the other modes load and unload raise
TritonModelException with Triton's message, while is_model_ready answers.
"""

from __future__ import annotations

import json

import pytest
import tritonclient.http as httpclient

from conftest import serving
from control_helpers import CONTROL, call_loader, make_repo, scale_of, states, wait_for

PREFIX = "TritonModelException: {what}: Failed to process the request for model 'loader_0_0', message: "


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("loading-api") / "repo", "loader", "scaler", "ens_pipeline",
                     "ens_addsub", "ens_mul")
    yield from serving([repo], "--model-control-mode=explicit", "--load-model", "loader")


@pytest.fixture(scope="module")
def none_mode(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("loading-api-none") / "repo", "loader", "scaler")
    yield from serving([repo])


@pytest.fixture
def hc(explicit):
    client = httpclient.InferenceServerClient(explicit.url, network_timeout=120)
    yield client
    client.close()


def _config(name: str, scale: str) -> str:
    return json.dumps({
        "name": name, "backend": "python",
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                   {"name": "PID", "data_type": "TYPE_INT64", "dims": [1]},
                   {"name": "VERSION", "data_type": "TYPE_INT64", "dims": [1]}],
        "parameters": {"scale": {"string_value": scale}},
    })


def test_load_check_and_unload_from_a_model(explicit, hc):
    assert call_loader(hc, httpclient, "ready", "scaler") == "False"
    assert call_loader(hc, httpclient, "load", "scaler") == "ok"
    assert call_loader(hc, httpclient, "ready", "scaler") == "True"
    assert call_loader(hc, httpclient, "ready", "scaler", "1") == "True"
    assert call_loader(hc, httpclient, "ready", "scaler", "2") == "False"
    assert hc.is_model_ready("scaler") and scale_of(hc, httpclient)[0] == 2.0
    assert call_loader(hc, httpclient, "unload", "scaler") == "ok"
    assert not hc.is_model_ready("scaler")
    wait_for(lambda: states(explicit.url)[("scaler", "1")] == ("UNAVAILABLE", "unloaded"), what="scaler unloaded")
    assert call_loader(hc, httpclient, "ready", "scaler") == "False"
    assert call_loader(hc, httpclient, "unload", "scaler") == "ok"  # not loaded: nothing to do


def test_load_with_config_and_files_from_a_model(explicit, hc):
    spec = {"config": _config("scaler", "3")}
    assert call_loader(hc, httpclient, "load", "scaler", json.dumps(spec)) == "ok"
    assert scale_of(hc, httpclient)[0] == 3.0
    model_py = (CONTROL / "scaler" / "1" / "model.py").read_text()
    spec = {"config": _config("made_by_loader", "5"), "files": {"file:1/model.py": model_py}}
    assert call_loader(hc, httpclient, "load", "made_by_loader", json.dumps(spec)) == "ok"
    assert scale_of(hc, httpclient, "made_by_loader")[0] == 5.0
    assert call_loader(hc, httpclient, "unload", "made_by_loader") == "ok"
    assert call_loader(hc, httpclient, "unload", "scaler") == "ok"


def test_ensemble_from_a_model_with_unload_dependents(explicit, hc):
    assert call_loader(hc, httpclient, "load", "ens_pipeline") == "ok"
    assert call_loader(hc, httpclient, "ready", "ens_mul") == "True"
    assert call_loader(hc, httpclient, "unload", "ens_pipeline", "dependents") == "ok"
    wait_for(lambda: states(explicit.url)[("ens_mul", "1")] == ("UNAVAILABLE", "unloaded"), what="step unloaded")
    assert call_loader(hc, httpclient, "ready", "ens_addsub") == "False"


def test_errors_reach_the_model_with_tritons_wording(explicit, hc):
    load = PREFIX.format(what="Failed to load model")
    assert call_loader(hc, httpclient, "load", "nope") == (
        load + "failed to load 'nope', failed to poll from model repository: model not found in any model repository."
    )
    assert call_loader(hc, httpclient, "load", "../scaler") == (
        load + "invalid model name '../scaler', model name must not contain path traversal characters"
    )
    spec = {"config": _config("evil", "1"), "files": {"file:../../escaped": "x"}}
    answer = call_loader(hc, httpclient, "load", "evil", json.dumps(spec))
    assert answer.startswith(load) and "must stay within model directory" in answer
    assert call_loader(hc, httpclient, "load", "scaler", json.dumps({"config": "{bad"})).startswith(
        load + "failed to load 'scaler', failed to poll from model repository: Invalid config override"
    )
    readiness = PREFIX.format(what="Failed to check model readiness")
    assert call_loader(hc, httpclient, "ready", "scaler", "x") == readiness + (
        "failed to get model version from specified version string 'x' (details: stol), "
        "version should be an integral value > 0"
    )
    assert call_loader(hc, httpclient, "unload", "a;b").startswith(PREFIX.format(what="Failed to unload model"))
    assert hc.is_server_ready() and hc.is_model_ready("loader")


def test_none_mode_refuses_load_and_unload_from_a_model(none_mode):
    client = httpclient.InferenceServerClient(none_mode.url)
    not_allowed = "explicit model load / unload is not allowed if polling is enabled"
    assert call_loader(client, httpclient, "load", "scaler") == PREFIX.format(what="Failed to load model") + not_allowed
    assert call_loader(client, httpclient, "unload", "scaler") == (
        PREFIX.format(what="Failed to unload model") + not_allowed
    )
    assert call_loader(client, httpclient, "ready", "scaler") == "True"  # readiness may be asked in every mode
    assert client.is_model_ready("scaler")
    client.close()
