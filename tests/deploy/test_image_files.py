"""deploy/Dockerfile and the image's scripts, checked without building the image.

(deploy/build-image.sh builds it and deploy/smoke-test.sh runs it; both need root and podman, so
they are not part of `make test`.)
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject allows it): tomli, in the test extra there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, current = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        current += " " + stripped.rstrip("\\").strip() if current else stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            word, _, rest = current.partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    assert not current, "dangling line continuation"
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = [[]]
    for ins in instructions(path):
        if ins[0] == "FROM":
            result.append([])
        result[-1].append(ins)
    return result  # result[0]: ARGs before the first FROM


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(a, str) for a in value), args
    return value


def console_scripts() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_dockerfile_stages_and_base():
    pre, *built = stages(DEPLOY / "Dockerfile")
    assert [i for i in pre if i[0] == "ARG" and i[1].startswith("BASE=")], "ARG BASE=... before FROM"
    assert len(built) >= 2, "multi-stage"
    assert all(s[0][1].split()[0] == "${BASE}" for s in built), "every stage is FROM ${BASE}"
    build, final = built[0], built[-1]
    assert build[0][1].split()[-2:] == ["AS", "build"]
    assert any(i[0] == "COPY" and i[1].startswith("--from=build ") for i in final)
    # Kernel is installed from the context with pip (offline from .wheels/ when PIP_OFFLINE=1)
    run = " ".join(a for k, a in build if k == "RUN")
    assert "pip install" in run and "/src" in run and "--no-index --find-links /src/.wheels" in run
    assert '"/src[openai]"' in run and "import jinja2" in run  # chat templates work in the image


def test_dockerfile_runtime_contract():
    final = stages(DEPLOY / "Dockerfile")[-1]
    last = {}
    for k, a in final:
        last[k] = a
    user = last["USER"].split(":")
    assert user[0].isdigit() and int(user[0]) != 0, "numeric non-root USER (runAsNonRoot can check it)"
    assert exec_form(last["ENTRYPOINT"]) == ["tini", "--"]
    cmd = exec_form(last["CMD"])
    # the OpenAI-compatible API on 8003: not 9000, which KServe's runtimes (deploy/kserve too) give gRPC
    assert cmd == ["kernel", "serve", "--model-repository", "/models", "--openai-port", "8003"]
    assert cmd[0] in console_scripts()
    exposed = {p for k, a in final if k == "EXPOSE" for p in a.split()}
    assert exposed == {"8000", "8001", "8002", "8003", "8080"}
    hc = last["HEALTHCHECK"]
    assert hc.split(" CMD ")[1] == '["kernel-healthcheck"]' and "--interval=" in hc
    copies = {a.split()[-1]: a.split()[-2] for k, a in final if k == "COPY" and not a.startswith("--from")}
    assert copies == {"/usr/local/bin/serve": "deploy/serve",
                      "/usr/local/bin/kernel-healthcheck": "deploy/healthcheck.py"}
    env = " ".join(a for k, a in final if k == "ENV")
    assert "PATH=/opt/kernel/bin:$PATH" in env
    setup = " ".join(a for k, a in final if k == "RUN")
    assert "tini" in setup and "/models" in setup and "/opt/ml/model" in setup


def test_the_images_openai_port_clashes_with_nothing_in_deploy():
    """Every port deploy/ gives a listener (KServe runtimes, the Helm chart, the autoscaling manifests):
    the image's OpenAI port is none of them (9000, Triton's OpenAI frontend's, is gRPC in KServe)."""
    cmd = exec_form({k: a for k, a in stages(DEPLOY / "Dockerfile")[-1]}["CMD"])
    openai = cmd[cmd.index("--openai-port") + 1]
    taken = {}
    for path in [*DEPLOY.glob("kserve/*.yaml"), *DEPLOY.glob("helm/kernel/**/*.yaml"), *DEPLOY.glob("autoscaling/*.yaml")]:
        text = path.read_text()
        for flag, port in re.findall(r"--([a-z-]+)-port[= ](\d+)", text):
            if flag != "openai":
                taken.setdefault(port, set()).add(f"{path.relative_to(DEPLOY)} --{flag}-port")
        for port in re.findall(r"(?:containerPort|Port|port): *(\d+)", text):
            taken.setdefault(port, set()).add(str(path.relative_to(DEPLOY)))
    assert "9000" in taken and "8000" in taken  # (the search finds the ports it should)
    assert openai not in taken, taken.get(openai)
    for path in (DEPLOY / "README.md", DEPLOY / "autoscaling" / "keda-scaledobject.yaml"):
        assert f"--openai-port={openai}" in path.read_text() and "--openai-port=9000" not in path.read_text(), path


def test_sagemaker_serve_runs_the_console_script():
    serve = DEPLOY / "serve"
    assert serve.stat().st_mode & 0o111, "serve must be executable (SageMaker runs `serve`)"
    lines = [ln for ln in serve.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == ['exec kernel-sagemaker-serve "$@"']
    assert "kernel-sagemaker-serve" in console_scripts()
    subprocess.run(["sh", "-n", str(serve)], check=True)


@pytest.mark.parametrize("script", ["build-image.sh", "smoke-test.sh", "podman-opts.sh"])
def test_shell_scripts_parse(script):
    path = DEPLOY / script
    assert path.stat().st_mode & 0o111, f"{script} must be executable"
    subprocess.run(["bash", "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", "-S", "error", str(path)], check=True)


def test_build_script_builds_offline_on_a_debootstrap_base():
    text = (DEPLOY / "build-image.sh").read_text()
    for needle in ("debootstrap --variant=minbase", "podman import", "git -C \"$REPO\" archive",
                   "--build-arg \"BASE=$BASE_IMAGE\"", "--build-arg PIP_OFFLINE=1", "--network=none",
                   "--format docker", "-f \"$ctx/deploy/Dockerfile\"", "smoke-test.sh"):
        assert needle in text, needle


def test_python_helpers_compile():
    for name in ("healthcheck.py", "smoke_client.py"):
        compile((DEPLOY / name).read_text(), name, "exec")


# ---- kernel-healthcheck ----------------------------------------------------------------------------


def load_healthcheck():
    spec = importlib.util.spec_from_file_location("kernel_healthcheck", DEPLOY / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_candidates_follow_the_mode():
    hc = load_healthcheck()
    assert hc.candidates({}) == ["http://127.0.0.1:8000/v2/health/ready", "http://127.0.0.1:8080/ping"]
    vertex = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "7080", "AIP_HEALTH_ROUTE": "/health"}
    assert hc.candidates(vertex)[1] == "http://127.0.0.1:7080/health"
    assert hc.candidates({"SAGEMAKER_BIND_TO_PORT": "9090"})[-1] == "http://127.0.0.1:9090/ping"
    assert hc.candidates({"KERNEL_HEALTHCHECK_URL": "http://x/y"}) == ["http://x/y"]


@pytest.fixture
def health_server():
    state = {"status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(state["status"] if self.path == "/v2/health/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], state
    server.shutdown()


def run_healthcheck(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEPLOY / "healthcheck.py")], env=env,
                          capture_output=True, text=True, timeout=30)


def test_healthcheck_exit_status(health_server):
    port, state = health_server
    env = {"KERNEL_HEALTHCHECK_URL": f"http://127.0.0.1:{port}/v2/health/ready"}
    assert run_healthcheck(env).returncode == 0
    state["status"] = 503
    r = run_healthcheck(env)
    assert r.returncode == 1 and "503" in r.stdout
    closed = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    free = closed.server_address[1]
    closed.server_close()
    r = run_healthcheck({"KERNEL_HEALTHCHECK_URL": f"http://127.0.0.1:{free}/v2/health/ready"})
    assert r.returncode == 1 and "no Kernel endpoint" in r.stdout, shlex.quote(r.stdout)
