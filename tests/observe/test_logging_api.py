"""The logging extension (GET/POST /v2/logging, gRPC LogSettings): settings change at run time and
both the server and every model's pb_utils.Logger follow them at once, writing to --log-file."""

from __future__ import annotations

import json
import logging
import re
import shutil
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, TEST_MODELS, KernelProcess, running
from kernel.observe import log as server_log


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    base = tmp_path_factory.mktemp("logging-api")
    repo = base / "repo"
    repo.mkdir()
    shutil.copytree(TEST_MODELS / "good" / "logger_model", repo / "logger_model")
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    log_file = base / "server.log"
    k = KernelProcess([repo], "--log-file", str(log_file))
    k.log_file = log_file
    yield from running(k)


@pytest.fixture
def http(kernel):
    with httpclient.InferenceServerClient(kernel.url) as c:
        yield c
        # Leave the defaults for the next test.
        c.update_log_settings({"log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
                               "log_format": "default"})


@pytest.fixture
def grpc_client(kernel):
    with grpcclient.InferenceServerClient(kernel.grpc_url) as c:
        yield c


def log_model_lines(kernel, http, tag: int) -> list[str]:
    """Run logger_model once (it logs at every level) and return the log lines it produced.

    The model writes its lines (through its worker) before it returns, so they are in the file
    by the time the response arrives.
    """
    start = kernel.log_file.stat().st_size
    t = httpclient.InferInput("INPUT", [1], "INT32")
    t.set_data_from_numpy(np.array([tag], np.int32))
    assert http.infer("logger_model", [t]).as_numpy("OUTPUT").tolist() == [tag]
    with open(kernel.log_file, "rb") as f:
        f.seek(start)
        text = f.read().decode()
    return [line for line in text.splitlines() if '"logger_model ' in line]


def levels(lines: list[str]) -> set[str]:
    return {re.search(r'"logger_model (\w+)', line).group(1) for line in lines}


def test_logging_is_an_advertised_extension(http):
    assert "logging" in http.get_server_metadata()["extensions"]


def test_get_log_settings_http_and_grpc(kernel, http, grpc_client):
    expected = {"log_file": str(kernel.log_file), "log_info": True, "log_warning": True, "log_error": True,
                "log_verbose_level": 0, "log_format": "default"}
    assert http.get_log_settings() == expected
    settings = grpc_client.get_log_settings(as_json=True)["settings"]
    assert settings == {
        "log_file": {"string_param": str(kernel.log_file)},
        "log_info": {"bool_param": True},
        "log_warning": {"bool_param": True},
        "log_error": {"bool_param": True},
        "log_verbose_level": {"uint32_param": 0},
        "log_format": {"string_param": "default"},
    }


def test_model_log_lines_go_to_the_log_file(kernel, http):
    lines = log_model_lines(kernel, http, 1)
    assert levels(lines) == {"info", "warning", "error", "default"}
    assert next(line for line in lines if "warning line" in line).startswith("W")


def test_verbose_on_and_off_reaches_the_model_at_once(kernel, http):
    assert "verbose" not in levels(log_model_lines(kernel, http, 2))
    assert http.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    assert "verbose" in levels(log_model_lines(kernel, http, 3))
    assert http.update_log_settings({"log_verbose_level": 0})["log_verbose_level"] == 0
    assert "verbose" not in levels(log_model_lines(kernel, http, 4))


def test_each_level_switches_on_its_own(kernel, http):
    settings = http.update_log_settings({"log_info": False, "log_error": False})
    assert settings["log_info"] is False and settings["log_error"] is False and settings["log_warning"] is True
    assert levels(log_model_lines(kernel, http, 5)) == {"warning"}
    http.update_log_settings({"log_info": True, "log_warning": False, "log_error": True})
    assert levels(log_model_lines(kernel, http, 6)) == {"info", "error", "default"}


def test_log_format_over_grpc(kernel, http, grpc_client):
    reply = grpc_client.update_log_settings({"log_format": "ISO8601"}, as_json=True)
    assert reply["settings"]["log_format"] == {"string_param": "ISO8601"}
    lines = log_model_lines(kernel, http, 7)
    assert lines and all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] \d+ model\.py:\d+\] ", line) for line in lines)
    grpc_client.update_log_settings({"log_format": "default"})
    lines = log_model_lines(kernel, http, 8)
    assert lines and all(re.match(r"[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ model\.py:\d+\] ", line) for line in lines)


def test_json_format_at_run_time_reaches_server_and_model(kernel, http):
    """Kernel's third format, `json`, switched on through the logging extension: the model's lines
    (written by its own process) become one JSON object per line, with the server's fields
    (tests/serve/test_operator.py checks the server's own lines from start-up)."""
    assert http.update_log_settings({"log_format": "json"})["log_format"] == "json"
    lines = log_model_lines(kernel, http, 9)
    records = [json.loads(line) for line in lines]
    assert {r["message"] for r in records} >= {"logger_model info line", "logger_model warning line"}
    assert all(set(r) == {"time", "level", "pid", "file", "line", "message"} for r in records)
    assert http.update_log_settings({"log_format": "default"})["log_format"] == "default"
    assert log_model_lines(kernel, http, 10)[0].startswith("I")  # and back


def test_grpc_verbose_setting_is_seen_over_http(http, grpc_client):
    grpc_client.update_log_settings({"log_verbose_level": 3})
    assert http.get_log_settings()["log_verbose_level"] == 3


# ---- bad values: tritonserver's status codes and messages, and the server carries on ------------------


def post(kernel, body: bytes):
    req = urllib.request.Request(f"http://{kernel.url}/v2/logging", data=body, method="POST")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"log_file": "/tmp/elsewhere.log"}, 501, "log file location can not be updated through network protocol"),
        ({"log_info": "yes"}, 400, "attempt to access JSON non-boolean as boolean"),
        ({"log_warning": 1}, 400, "attempt to access JSON non-boolean as boolean"),
        ({"log_verbose_level": -1}, 400, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_verbose_level": "2"}, 400, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_format": 5}, 400, "attempt to access JSON non-string as string"),
        ({"log_format": "xml"}, 503, "invalid argument for --log_format, got: xml"),
    ],
)
def test_bad_http_values_are_refused(kernel, http, body, status, message):
    assert post(kernel, json.dumps(body).encode()) == (status, {"error": message})
    assert http.get_log_settings()["log_format"] == "default"  # still serving, nothing changed


def test_bad_json_is_refused(kernel):
    status, doc = post(kernel, b"{not json")
    assert status == 400 and doc["error"].startswith("failed to parse the request JSON buffer")


def test_settings_before_a_bad_value_still_apply(kernel, http):
    # tritonserver applies the settings one by one: log_warning changes before log_format is refused.
    status, doc = post(kernel, json.dumps({"log_warning": False, "log_format": "bad"}).encode())
    assert status == 503
    assert http.get_log_settings()["log_warning"] is False


def test_null_leaves_a_setting_alone(kernel, http):
    status, doc = post(kernel, json.dumps({"log_file": None, "log_info": None, "log_verbose_level": 2}).encode())
    assert status == 200 and doc["log_info"] is True and doc["log_verbose_level"] == 2


@pytest.mark.parametrize(
    "settings, code, message",
    [
        ({"log_format": "xml"}, "StatusCode.INVALID_ARGUMENT", "invalid argument for log_format, got: xml"),
        ({"log_file": "/tmp/x.log"}, "StatusCode.UNIMPLEMENTED",
         "log file location can not be updated through network protocol"),
        ({"log_info": None}, "StatusCode.INVALID_ARGUMENT", "expect boolean for 'log_info'"),
        ({"log_verbose_level": None}, "StatusCode.INVALID_ARGUMENT", "expect int32 for 'log_verbose_level'"),
        ({"log_format": None}, "StatusCode.INVALID_ARGUMENT", "expect string for 'log_format'"),
    ],
)
def test_bad_grpc_values_are_refused(grpc_client, settings, code, message):
    with pytest.raises(InferenceServerException) as info:
        grpc_client.update_log_settings(settings)
    assert info.value.status() == code and info.value.message() == message
    assert grpc_client.get_log_settings(as_json=True)["settings"]["log_format"]["string_param"] == "default"


# ---- the line layouts (kernel.observe.log) ------------------------------------------------------------


@pytest.mark.parametrize("level, letter, name", [(logging.DEBUG, "I", "VERBOSE"), (logging.INFO, "I", "INFO"),
                                                 (logging.WARNING, "W", "WARNING"), (logging.ERROR, "E", "ERROR")])
def test_line_layouts(level, letter, name):
    """tritonserver writes its verbose lines with the I letter (seen with --log-verbose=1); json names
    the level instead, VERBOSE included."""
    record = logging.LogRecord("kernel.core.server", level, "/x/server.py", 42, 'say "%s"', ("hi",), None)
    assert re.fullmatch(rf'{letter}\d{{4}} \d\d:\d\d:\d\d\.\d{{6}} \d+ server\.py:42\] "say \\"hi\\""',
                        server_log.formatter_for("default").format(record))
    assert re.fullmatch(rf'\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ {letter} \d+ server\.py:42\] "say \\"hi\\""',
                        server_log.formatter_for("ISO8601").format(record))
    doc = json.loads(server_log.formatter_for("json").format(record))
    assert doc["level"] == name and doc["message"] == 'say "hi"' and (doc["file"], doc["line"]) == ("server.py", 42)


def test_times_are_utc_whatever_tz_says(monkeypatch):
    """tritonserver started with TZ=Asia/Tokyo still writes UTC times (checked with 2.51)."""
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        record = logging.LogRecord("kernel.core.server", logging.INFO, "/x/server.py", 1, "m", (), None)
        record.created = 86400 * 31 + 3600 * 5 + 0.25  # 1970-02-01 05:00:00.25 UTC
        assert server_log.formatter_for("default").format(record).startswith("I0201 05:00:00.250000 ")
        assert server_log.formatter_for("ISO8601").format(record).startswith("1970-02-01T05:00:00Z I ")
        assert json.loads(server_log.formatter_for("json").format(record))["time"] == "1970-02-01T05:00:00.250000Z"
    finally:
        monkeypatch.undo()
        time.tzset()
