"""Flag values as tritonserver takes them, through a real `kernel serve`: the value reaches the
server (not only the parser), and a refused value stops start-up with tritonserver's words and
exit status. (The parse-level table is test_flag_values.py.)"""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest

from conftest import TEST_MODELS


def get_json(url: str):
    data = b"{}" if url.endswith("/index") else None
    with urllib.request.urlopen(url, data=data, timeout=5) as r:
        return json.loads(r.read())


def run_logger_model(k) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT32", "data": [1]}]}).encode()
    with urllib.request.urlopen(f"http://{k.url}/v2/models/logger_model/infer", data=body, timeout=30) as r:
        assert r.status == 200


@pytest.mark.parametrize("value, verbose", [("true", True), ("TRUE", True), ("false", False), ("2", True)])
def test_log_verbose_true_turns_verbose_logging_on(start_kernel, tmp_path, value, verbose):
    # SageMaker start-up scripts pass exactly `--log-verbose=true`; tritonserver reads it as level 1.
    shutil.copytree(TEST_MODELS / "good" / "logger_model", tmp_path / "logger_model")
    k = start_kernel([tmp_path], f"--log-verbose={value}", "--log-info", "TRUE", "--log-warning=Off").wait_ready()
    settings = get_json(f"http://{k.url}/v2/logging")
    assert settings["log_verbose_level"] == {"true": 1, "TRUE": 1, "false": 0, "2": 2}[value]
    assert settings["log_info"] is True and settings["log_warning"] is False
    run_logger_model(k)
    assert k.wait_for_log("logger_model info line")
    k.stop()
    assert ("logger_model verbose line" in k.log()) is verbose
    assert "logger_model warning line" not in k.log()


def test_boolean_words_switch_services(start_kernel, tmp_path):
    k = start_kernel([tmp_path], "--allow-grpc=Off", "--strict-readiness", "FALSE").wait_ready()
    log = k.log()
    assert "Started HTTPService" in log and "Started GRPCInferenceService" not in log


def test_exit_on_error_in_capitals_stops_on_a_failed_model(start_kernel, tmp_path):
    shutil.copytree(TEST_MODELS / "bad" / "init_fails", tmp_path / "init_fails")
    k = start_kernel([tmp_path], "--exit-on-error=TRUE")
    assert k.wait_exit(60) == 1
    assert "failed to load all models" in k.log()


def test_exit_on_error_off_keeps_serving(start_kernel, tmp_path):
    shutil.copytree(TEST_MODELS / "bad" / "init_fails", tmp_path / "init_fails")
    k = start_kernel([tmp_path], "--exit-on-error", "off", "--strict-readiness=0")
    k.wait_ready()
    index = get_json(f"http://{k.url}/v2/repository/index")  # POST with an empty body
    assert [(m["name"], m.get("state")) for m in index] == [("init_fails", "UNAVAILABLE")]
    assert k.proc.poll() is None


def test_a_refused_value_stops_start_up_in_tritonservers_words(start_kernel, tmp_path):
    k = start_kernel([tmp_path], "--log-verbose=yes")
    assert k.wait_exit(30) == 1
    assert 'Bad option: "--log-verbose".\nInvalid option value. Got yes\n' in k.log()
    assert "Started" not in k.log()


def test_a_port_out_of_range_parses_but_stops_start_up(start_kernel, tmp_path):
    # tritonserver's parser takes any 32-bit integer for a port (and then logs "0.0.0.0:70000");
    # Kernel parses it the same way and refuses it before anything listens.
    k = start_kernel([tmp_path], "--http-port=70000")
    assert k.wait_exit(30) == 1
    assert "HTTP port 70000 is out of range" in k.log() and "Traceback" not in k.log()


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_model_repository_that_is_not_there_is_named(start_kernel, tmp_path, kind):
    """tritonserver 2.51: `Internal - failed to stat file /nope` for a missing path, `Invalid argument -
    repository path is not a valid directory` for a file. Kernel keeps those words and says which it
    found (a missing repository used to be called "not a directory")."""
    path = tmp_path / "models"
    if kind == "file":
        path.write_text("not a folder\n")
    k = start_kernel([path])
    assert k.wait_exit(60) == 1
    errors = [line for line in k.log().splitlines() if line.startswith("E")]
    expected = {
        "missing": f"error: creating server: Internal - failed to stat file {path}: the model repository does not exist",
        "file": f"error: creating server: Invalid argument - repository path is not a valid directory: '{path}' is "
                "not a directory",
    }[kind]
    assert len(errors) == 1 and errors[0].endswith(f'"{expected}"'), k.log()
