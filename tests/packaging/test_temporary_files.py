"""`make test` leaves nothing in /tmp (issue 27): a log per test server, workspaces and model folders
used to pile up there, hundreds per run.

The session's TMPDIR points under pytest's own temporary folder (tests/conftest.py), which pytest
manages (the last three runs kept). These tests check that it holds for the tests' own files and for
what a `kernel serve` started by the fixtures writes, and that no code names a fixed place in /tmp
other than the few listed below with their reasons (TMPDIR cannot move those).
"""

from __future__ import annotations

import ast
import base64
import json
import tempfile
import urllib.request
from pathlib import Path

from conftest import ROOT

# Source folders whose code runs in `make test` (the library, the tests).
SCANNED = ("kernel", "transports", "backends", "triton_python_backend_utils", "tests")

# Fixed paths in /tmp that code may name, with why. Anything else is refused.
ALLOWED = {
    # The remote-binding socket folder: a fixed per-user place every process of the user finds a
    # server's socket in (mode 0700, owner and peer uid checked; a squatted name falls back to a
    # fresh mkdtemp folder); each socket is removed by the server that made it.
    ("kernel/proxy/remote_socket.py", "/tmp"),
    # SageMaker's multi-model contract: the repository tritonserver's SageMaker `serve` uses.
    ("kernel/serve/sagemaker.py", "/tmp/sagemaker"),
    # Paths in requests and assertions that nothing is written there (never created by a test).
    ("tests/loading/test_repository_api.py", "/tmp/escaped_abs"),
    ("tests/observe/test_trace_api.py", "/tmp/x"),
    ("tests/observe/test_logging_api.py", "/tmp/elsewhere.log"),
    ("tests/observe/test_logging_api.py", "/tmp/x.log"),
    ("tests/deploy/test_manifests.py", "/tmp"),  # the container's /tmp mount in the Helm chart
    ("tests/hostile/test_http2_limits.py", "/tmp"),  # a --model-repository value only parsed
    ("tests/conftest.py", "/tmp"),  # read only: the session's report of what appeared in /tmp
}


def fixed_tmp_paths() -> set[tuple[str, str]]:
    found = set()
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "tests/packaging/test_temporary_files.py":  # this list, and the scan's own example
                continue
            try:
                tree = ast.parse(path.read_text(), rel)
            except SyntaxError:  # a test model broken on purpose: it never runs, so it writes nothing
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    text = node.value
                    if text == "/tmp" or text.startswith("/tmp/"):
                        found.add((rel, text))
    return found


def test_no_code_names_a_fixed_place_in_tmp():
    assert fixed_tmp_paths() - ALLOWED == set()


def test_the_check_sees_a_fixed_tmp_path(tmp_path, monkeypatch):
    """The scan can fail: a log written to /tmp by name is reported."""
    import test_temporary_files as me

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "leaky.py").write_text('LOG = "/tmp/kernel-test.log"\n')
    monkeypatch.setattr(me, "ROOT", tmp_path)
    monkeypatch.setattr(me, "SCANNED", ("tests",))
    assert me.fixed_tmp_paths() == {("tests/leaky.py", "/tmp/kernel-test.log")}


def test_the_tests_temporary_files_go_under_pytests_folder(tmp_path_factory):
    base = tmp_path_factory.getbasetemp().resolve()
    assert Path(tempfile.gettempdir()).resolve().is_relative_to(base)
    with tempfile.TemporaryDirectory() as scratch:
        assert Path(scratch).resolve().is_relative_to(base)


MODEL_PY = b'''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("model folder " + args["model_repository"])

    def execute(self, requests):
        return []
'''


def test_a_test_servers_files_go_under_pytests_folder(start_kernel, tmp_path, tmp_path_factory):
    """The server's log, and a folder the server makes itself (a model loaded from `file:` parameters)."""
    base = tmp_path_factory.getbasetemp().resolve()
    k = start_kernel([tmp_path], "--model-control-mode=explicit").wait_ready()
    assert k.log_path.resolve().is_relative_to(base)
    config = {"backend": "python", "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
              "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}]}
    body = json.dumps({"parameters": {"config": json.dumps(config),
                                      "file:1/model.py": base64.b64encode(MODEL_PY).decode()}}).encode()
    with urllib.request.urlopen(f"http://{k.url}/v2/repository/models/from_files/load", data=body, timeout=60) as r:
        assert r.status == 200
    assert k.wait_for_log("model folder ")
    folder = k.log().split("model folder ", 1)[1].split('"', 1)[0]
    assert Path(folder).resolve().is_relative_to(base), folder
