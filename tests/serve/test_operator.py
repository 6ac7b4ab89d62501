"""The operator's conveniences (issue 18) and the start-up log lines scripts grep (issue 13), against
a real `kernel serve`: --version and GET /v2's version, --help in tritonserver's groups, --log-format
json, one tritonserver-style line for a port that is taken, and the Vertex AI route checks.

The expected lines were read off tritonserver 2.51 (two servers on one port; AIP_MODE=PREDICTION
without a route); each exits with status 1."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from importlib import metadata

import pytest

import kernel
from conftest import EXAMPLES, ROOT, TEST_MODELS, KernelProcess, free_port
from kernel.serve import cli
from kernel.serve.flags import ArgumentsRefused


def kernel_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


# ---- version ------------------------------------------------------------------------------


def test_version_flag_prints_the_installed_version():
    done = kernel_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"kernel {kernel.__version__}"
    assert metadata.version("kernel-inference-server") == kernel.__version__  # one version, not two


def test_server_metadata_names_kernels_version(start_kernel, tmp_path):
    """Where tritonserver puts its own version ("2.51.0"), Kernel puts Kernel's: it is not Triton, and
    the KServe clients read the field only to show it. The name stays --id, as in tritonserver."""
    import tritonclient.grpc as grpcclient

    k = start_kernel([tmp_path], "--id=edge-7").wait_ready()
    with urllib.request.urlopen(f"http://{k.url}/v2", timeout=5) as r:
        doc = json.loads(r.read())
    assert doc["name"] == "edge-7" and doc["version"] == kernel.__version__
    assert "logging" in doc["extensions"]
    with grpcclient.InferenceServerClient(k.grpc_url) as c:
        grpc_doc = c.get_server_metadata(as_json=True)
    assert grpc_doc["name"] == "edge-7" and grpc_doc["version"] == kernel.__version__


# ---- --help ---------------------------------------------------------------------------------

TRITON_GROUPS = ["Server", "Logging", "Model Repository", "HTTP", "GRPC", "Sagemaker", "Vertex", "Metrics",
                 "Tracing", "Backend", "Repository Agent", "Response Cache", "Rate Limiter",
                 "Memory/Device Management", "DEPRECATED"]
# Where tritonserver 2.51's --help lists a few flags (the group decides where an operator looks).
TRITON_PLACES = {
    "--id": "Server", "--exit-timeout-secs": "Server", "--log-verbose": "Logging", "--log-format": "Logging",
    "--model-repository": "Model Repository", "--exit-on-error": "Model Repository",
    "--strict-readiness": "Model Repository", "--model-control-mode": "Model Repository",
    "--enable-peer-access": "Model Repository", "--http-port": "HTTP", "--http-thread-count": "HTTP",
    "--http-restricted-api": "HTTP", "--grpc-port": "GRPC", "--grpc-use-ssl": "GRPC",
    "--grpc-restricted-protocol": "GRPC", "--grpc-infer-response-compression-level": "GRPC",
    "--allow-sagemaker": "Sagemaker", "--sagemaker-safe-port-range": "Sagemaker",
    "--allow-vertex-ai": "Vertex", "--vertex-ai-default-model": "Vertex", "--allow-gpu-metrics": "Metrics",
    "--metrics-interval-ms": "Metrics", "--metrics-config": "Metrics", "--trace-config": "Tracing",
    "--backend-directory": "Backend", "--backend-config": "Backend", "--repoagent-directory": "Repository Agent",
    "--cache-config": "Response Cache", "--rate-limit": "Rate Limiter",
    "--pinned-memory-pool-byte-size": "Memory/Device Management", "--host-policy": "Memory/Device Management",
    "--strict-model-config": "DEPRECATED", "--trace-rate": "DEPRECATED", "--response-cache-byte-size": "DEPRECATED",
}


def help_sections() -> dict[str, str]:
    done = kernel_cli("serve", "--help")
    assert done.returncode == 0
    sections: dict[str, str] = {}
    title = None
    for line in done.stdout.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            sections[title] = ""
        elif title:
            sections[title] += line + "\n"
    return sections


def test_help_is_grouped_like_tritonservers():
    sections = help_sections()
    assert [t for t in sections if t in TRITON_GROUPS] == TRITON_GROUPS
    for flag, group in TRITON_PLACES.items():
        assert re.search(rf"^  {re.escape(flag)}\b", sections[group], re.M), (flag, group)


def test_every_flag_has_one_line_of_help_and_its_default():
    sections = help_sections()
    text = "".join(sections[t] for t in TRITON_GROUPS)
    parser = cli.build_parser()
    flags = {f"--{f}" for f in cli.NO_EFFECT_FLAGS | cli.NOT_YET_FLAGS}
    lines = text.splitlines()
    described = set()
    for i, line in enumerate(lines):
        match = re.match(r"  (--[a-z0-9-]+)", line)
        if not match:
            continue
        described.add(match.group(1))
        same_line = re.match(r"  \S.*?\S {2,}(\S.*)", line)
        next_line = lines[i + 1] if i + 1 < len(lines) else ""
        assert same_line or re.match(r" {20,}\S", next_line), f"{match.group(1)} has no help"
    assert flags <= described
    for flag in ["--http-port", "--log-verbose", "--exit-timeout-secs", "--strict-readiness", "--log-format"]:
        assert flag in described
    # Defaults, in tritonserver's words for booleans.
    squashed = " ".join(text.split())
    for shown in ["port the HTTP endpoint listens on (default: 8000)", "(default: 30)",
                  "ready only when every model is ready (false: ready once the server is live) (default: true)"]:
        assert shown in squashed
    assert parser.prog == "kernel"
    assert "None" not in squashed  # a default without a value is said in words (issue 35)
    for shown in ["the gRPC server implementation (default: native)",
                  "address of the metrics endpoint (default: --http-"]:  # argparse wraps at the hyphen
        assert shown in squashed


def test_help_offers_grpc_response_compression():
    """--grpc-infer-response-compression-level is served now (issue 25): its values and default,
    not the "not supported by Kernel yet" of the flags that are refused."""
    text = " ".join(help_sections()["GRPC"].split())
    entry = text.split("--grpc-infer-response-compression-level ", 1)[1].split(" --", 1)[0]
    assert entry.startswith("{none,low,medium,high} ") and entry.endswith("(default: none)")
    assert "not supported" not in entry and "refused" not in entry
    assert "grpc-infer-response-compression-level" not in cli.NOT_YET_FLAGS


# ---- --log-format json ----------------------------------------------------------------------

FIELDS = {"time", "level", "pid", "file", "line", "message"}
EVENT_FIELDS = {"model", "version", "state", "reason", "service", "address"}  # an event's own structure


def test_json_log_is_one_object_per_line_for_server_and_model(start_kernel, tmp_path):
    shutil.copytree(TEST_MODELS / "good" / "logger_model", tmp_path / "logger_model")
    k = start_kernel([tmp_path], "--log-format", "json", "--log-verbose=1").wait_ready()
    import numpy as np
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(k.url) as c:
        t = httpclient.InferInput("INPUT", [1], "INT32")
        t.set_data_from_numpy(np.array([3], np.int32))
        c.infer("logger_model", [t])
    assert k.wait_for_log("logger_model verbose line")
    k.stop()
    records = []
    for line in k.log().splitlines():
        if line.strip():
            records.append(json.loads(line))  # every line, the model table included
    assert all(FIELDS <= set(r) <= FIELDS | EVENT_FIELDS for r in records)
    server = next(r for r in records if r["message"].startswith("Started HTTPService at "))
    assert server["level"] == "INFO" and server["file"].endswith(".py") and isinstance(server["line"], int)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", server["time"])
    assert server["service"] == "HTTPService" and server["address"] == f"0.0.0.0:{k.http_port}"
    # structure as fields (issue 27): load events name the model, version and state, and the model
    # table is one event per model, not one multi-line text
    assert not [r for r in records if "| Model" in r["message"]]
    events = [{f: r[f] for f in ("model", "version", "state") if f in r} for r in records if "model" in r]
    assert events[:3] == [
        {"model": "logger_model", "version": 1, "state": "LOADING"},  # loading: logger_model:1
        {"model": "logger_model", "state": "READY"},  # successfully loaded 'logger_model'
        {"model": "logger_model", "version": 1, "state": "READY"},  # its row of the model table
    ]
    row = next(r for r in records if r.get("version") == 1 and r.get("state") == "READY")
    assert row["message"] == "model 'logger_model' version 1 is READY"
    assert {"model": "logger_model", "version": 1, "state": "UNAVAILABLE", "reason": "unloaded"} in [
        {f: r[f] for f in ("model", "version", "state", "reason") if f in r} for r in records]
    model = {r["message"]: r for r in records if r["message"].startswith("logger_model ")}
    assert model["logger_model warning line"]["level"] == "WARNING"
    assert model["logger_model verbose line"]["level"] == "VERBOSE"
    assert model["logger_model info line"]["file"] == "model.py"
    assert model["logger_model info line"]["pid"] != server["pid"]  # written by the model's own process


def test_json_is_refused_by_its_exact_name(capsys):
    with pytest.raises(ArgumentsRefused):
        cli.build_parser().parse_args(["serve", "--log-format=JSON"])  # as tritonserver's names, case counts


# ---- a port that is taken ------------------------------------------------------------------


@pytest.mark.parametrize("service, flag, address", [
    ("HTTP", "--http-port", "127.0.0.1"), ("GRPC", "--grpc-port", "127.0.0.1"), ("Metrics", "--metrics-port", "127.0.0.1"),
    ("Sagemaker", "--sagemaker-port", "0.0.0.0"),  # the SageMaker endpoint listens on every address
    ("OpenAI", "--openai-port", "127.0.0.1"),  # Kernel only: was "OpenAIService service" (issue 35)
])
def test_a_taken_port_is_one_tritonserver_line(tmp_path, service, flag, address):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--allow-sagemaker=true"] if service == "Sagemaker" else []
        k = KernelProcess([tmp_path], "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                          "--metrics-address=127.0.0.1", *extra, f"{flag}={port}")
        try:
            assert k.wait_exit(60) == 1
        finally:
            k.stop()
    log = k.log()
    expected = f"failed to start {service} service: Unavailable - Socket '{address}:{port}' already in use "
    errors = [line for line in log.splitlines() if line.startswith("E")]
    assert errors == [next(line for line in errors if expected in line)], log
    assert re.fullmatch(rf'E\d{{4}} [\d:.]+ \d+ \S+:\d+\] "{re.escape(expected)}"', errors[0])
    assert "Errno" not in log and "Traceback" not in log and "uvicorn" not in log.lower()


# ---- Vertex AI start-up ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "missing, expected",
    [
        ("AIP_PREDICT_ROUTE", "API_PREDICT_ROUTE is not defined for Vertex AI endpoint"),  # sic, as tritonserver
        ("AIP_HEALTH_ROUTE", "AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint"),
    ],
)
def test_vertex_ai_without_a_route_refuses_to_start(tmp_path, monkeypatch, missing, expected):
    shutil.copytree(EXAMPLES / "add_sub", tmp_path / "add_sub")
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(free_port()), "AIP_PREDICT_ROUTE": "/predict",
           "AIP_HEALTH_ROUTE": "/health"}
    del env[missing]
    monkeypatch.delenv(missing, raising=False)
    k = KernelProcess([tmp_path], env=env)
    try:
        assert k.wait_exit(60) == 1
    finally:
        k.stop()
    line = f'"failed to start Vertex AI service: Invalid argument - {expected}"'
    errors = [l for l in k.log().splitlines() if l.startswith("E")]
    assert len(errors) == 1 and errors[0].endswith(line), k.log()
    assert "creating server" not in k.log()


# ---- package metadata -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def package_metadata(tmp_path_factory):
    """The METADATA setuptools writes for this checkout (the wheel's, without building the wheel)."""
    out = tmp_path_factory.mktemp("metadata")
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "SetuptoolsDeprecationWarning" not in done.stderr and "license" not in done.stderr.lower(), done.stderr
    info = done.stdout.strip().splitlines()[-1]
    from email.parser import Parser

    return Parser().parsestr((out / info / "METADATA").read_text())


def test_metadata_says_linux_only_and_which_pythons(package_metadata):
    classifiers = package_metadata.get_all("Classifier")
    assert "Operating System :: POSIX :: Linux" in classifiers  # memfd: Linux only
    assert not [c for c in classifiers if c.startswith("Operating System ::") and "Linux" not in c]
    versions = sorted(c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert versions == ["3.10", "3.11", "3.12", "3.13"]
    assert package_metadata["Requires-Python"] == ">=3.10"
    assert package_metadata["Version"] == kernel.__version__
    assert package_metadata.get_all("Project-URL")


def test_metadata_license_is_the_license_file(package_metadata):
    assert package_metadata["License-Expression"] == "Apache-2.0"
    assert package_metadata.get_all("License-File") == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License\n")
