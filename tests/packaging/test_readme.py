"""Every command and program in README.md runs as written (issue 27).

The README's ```bash and ```python blocks, and the commands of its Deploy table, are read from the
file itself: each is either run by a test below, or listed in ILLUSTRATIVE with the reason it cannot
run here (root, a container engine, a cluster, a cloud account, or the test suite itself). A snippet
added to the README and in neither list fails test_every_snippet_is_run_or_says_why_not.

What the tests change, and only that (SUBSTITUTIONS says it once more): servers listen on free ports
instead of 8000-8002, which something else on the machine may hold (the commands get the port flags,
the PyTriton program its PYTRITON_TRITON_CONFIG_* ports, the clients the same address); `~` is a
temporary folder; the commands run in a temporary folder laid out as the README says (the model
repository of "A first model", the clone's `.venv`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import kernel
from conftest import ROOT, ServerProcess, free_ports, wait_until_ok

README = ROOT / "README.md"

SUBSTITUTIONS = [
    "free ports for every server (flags, PYTRITON_TRITON_CONFIG_* variables, the clients' address)",
    "HOME is a temporary folder (~/kernel-env); pip's cache stays where it is",
]

# Snippets that do not run here, with why. Keys are the command or a line that identifies the block.
ILLUSTRATIVE = {
    "make test": "runs the whole test suite, this test included",
    "kubectl apply -f deploy/kserve/clusterservingruntime.yaml -f deploy/kserve/inferenceservice.yaml":
        "needs a Kubernetes cluster with KServe (tests/deploy validates the manifests and runs their probes)",
    "helm install kernel deploy/helm/kernel --set image.repository=REGISTRY/kernel --set image.tag=0.1.0":
        "needs a Kubernetes cluster (tests/deploy renders and validates the chart)",
    "aws sagemaker create-model --model-name kernel --execution-role-arn ROLE --primary-container "
    "Image=ECR_IMAGE,ModelDataUrl=s3://BUCKET/model.tar.gz": "needs an AWS account",
    "gcloud ai models upload --region REGION --display-name kernel --container-image-uri IMAGE_WITH_MODELS "
    "--container-ports 8080": "needs a Google Cloud project",
}

# The snippets the tests below run, by the command or a line of the block.
MAKE_SERVE = "make serve"
INSTALL = [
    "pip wheel --no-deps -w dist .",
    "python3 -m venv ~/kernel-env",
    "~/kernel-env/bin/pip install dist/kernel_inference_server-0.1.0-py3-none-any.whl",
    "~/kernel-env/bin/kernel --version",
]
SERVE_MY_REPO = ".venv/bin/kernel serve --model-repository my_repo"
MODEL_PY = "class TritonPythonModel:"
HTTP_CLIENT = 'client = httpclient.InferenceServerClient("localhost:8000")'
PYTRITON_SERVER = "with Triton() as triton:                         # HTTP :8000, gRPC :8001, metrics :8002"
PYTRITON_CLIENT = 'with ModelClient("localhost", "AddSub") as client:'
# A fragment (no Triton()): run on its own below; the whole program, this generator bound and streamed to
# the openai client, is tests/transports/openai/test_openai_api.py::test_bound_generator_answers_chat_completions
BOUND_GENERATOR = "def words(requests):                     # Triton.bind(..., config=ModelConfig(decoupled=True))"
# The container lines: run where a container engine can (else the tests say why they are skipped).
BUILD_IMAGE = "sudo deploy/build-image.sh"
PODMAN_RUN = ("podman run --rm $(deploy/podman-opts.sh --run-flags) -p 8000-8003:8000-8003 "
              "-v $PWD/model_repo_examples:/models:ro localhost/kernel:latest")
DOCKER_BUILD = "docker build -f deploy/Dockerfile -t kernel:0.1.0 ."
DOCKER_RUN = "docker run --rm -p 8000-8003:8000-8003 -v $PWD/model_repo_examples:/models:ro kernel:0.1.0"
CONTAINERS = [BUILD_IMAGE, PODMAN_RUN, DOCKER_BUILD, DOCKER_RUN]
RUN = [MAKE_SERVE, *INSTALL, SERVE_MY_REPO, MODEL_PY, HTTP_CLIENT, PYTRITON_SERVER, PYTRITON_CLIENT, BOUND_GENERATOR,
       *CONTAINERS]
# Snippets another test runs as written, with where.
RUN_ELSEWHERE = {
    'client = OpenAI(base_url="http://localhost:9000/v1", api_key="unused")':
        "tests/transports/openai/test_openai_readme.py (the first chat and the tools example, against the bundled "
        "repository's OpenAI port)",
}


# ---- reading the README --------------------------------------------------------------------------------


def blocks() -> list[tuple[str, str, str]]:
    """(language, text, the line before the block) of every fenced block."""
    out, lang, lines, before, previous = [], None, [], "", ""
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines, before = line[3:].strip(), [], previous
            else:
                out.append((lang, "\n".join(lines) + "\n", before))
                lang = None
        elif lang is not None:
            lines.append(line)
        elif line.strip():
            previous = line
    return out


def bash_commands() -> list[str]:
    """Each line of the ```bash blocks (comments off), and each command of the Deploy table."""
    commands = []
    for lang, text, _ in blocks():
        if lang == "bash":
            commands += [line.split(" #")[0].strip() for line in text.splitlines() if line.split(" #")[0].strip()]
    deploy = README.read_text().split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]
    for row in deploy.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[1].startswith("`") and cells[1].endswith("`"):
            commands.append(cells[1].strip("`"))
    return commands


def python_block(marker: str) -> str:
    (text,) = [text for lang, text, _ in blocks() if lang == "python" and marker in text.splitlines()]
    return text


def block_after(heading: str) -> str:
    (text,) = [text for _, text, before in blocks() if before.strip() == heading]
    return text


def test_every_snippet_is_run_or_says_why_not():
    snippets = bash_commands()
    for lang, text, _ in blocks():
        if lang == "python":
            found = [key for key in [*RUN, *RUN_ELSEWHERE, *ILLUSTRATIVE] if key in text.splitlines()]
            assert len(found) == 1, f"a python block the tests do not run:\n{text}"
            snippets.append(found[0])
    assert sorted(set(snippets)) == sorted(set(RUN) | set(ILLUSTRATIVE) | set(RUN_ELSEWHERE))
    assert not set(RUN) & set(ILLUSTRATIVE)


def test_the_readmes_only_pip_install_installs_a_wheel_that_exists():
    """The README used to say `pip install 'kernel-inference-server[gpu]'`: no index has it."""
    assert "pip install 'kernel-inference-server" not in README.read_text()
    assert "pip install kernel-inference-server" not in README.read_text()


# ---- running them ----------------------------------------------------------------------------------------


def run_python(code: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_serve(tmp_path):
    """`make serve`, as on a fresh clone once installed (the runtime stamp is there, or it is installed now)."""
    http, grpc, metrics = free_ports(3)
    log = tmp_path / "make.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", f'{MAKE_SERVE} VENV={sys.prefix} ARGS="--http-port={http} --grpc-port={grpc} '
                           f'--metrics-port={metrics}"'],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    class Started:
        name = "make serve"

        def __init__(self):
            self.proc = proc

        def log(self):
            return log.read_text(errors="replace")

    try:
        wait_until_ok(Started(), [f"http://localhost:{http}/v2/health/ready"], timeout=300)
        for model in ("add_sub", "string_identity", "auto_add"):  # model_repo_examples/
            with urllib.request.urlopen(f"http://localhost:{http}/v2/models/{model}/ready", timeout=5) as r:
                assert r.status == 200
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, to make and the server it started
        proc.wait(60)
    assert '"Received signal 2 (SIGINT), shutting down"' in log.read_text(), log.read_text()


def test_installing_from_a_wheel(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                                 ".peers", "__pycache__", "results"))
    home = tmp_path / "home"
    home.mkdir()
    # pip keeps its cache where it was (not under the temporary HOME): downloads are the user's, not the test's
    cache = os.environ.get("PIP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pip")
    env = {**os.environ, "HOME": str(home), "PIP_CACHE_DIR": cache,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", "\n".join(INSTALL)], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"kernel {kernel.__version__}"  # the comment says "kernel 0.1.0"
    assert kernel.__version__ == "0.1.0"  # the wheel's name in the README


def test_a_first_model(tmp_path):
    """The model repository of "A first model" (its config.pbtxt and 1/model.py), served with the
    README's command from the clone's root, called with the README's client; the printed line is the
    one its comment shows."""
    model = tmp_path / "my_repo" / "add_sub"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(block_after("`config.pbtxt`:"))
    (model / "1" / "model.py").write_text(python_block(MODEL_PY))
    assert block_after("`1/model.py`:") == python_block(MODEL_PY)
    (tmp_path / ".venv").symlink_to(sys.prefix)  # the command runs from the clone's root
    http, grpc, metrics = free_ports(3)
    k = ServerProcess(["bash", "-c", f"exec {SERVE_MY_REPO} --http-port {http} --grpc-port {grpc} "
                                     f"--metrics-port {metrics}"], tmp_path / "kernel.log", cwd=tmp_path)
    k.http_port = http
    try:
        k.wait_until_ok(["/v2/health/ready"])
        client = python_block(HTTP_CLIENT)
        expected = re.search(r"# (\[.*\])$", client.strip().splitlines()[-1]).group(1)
        out = run_python(client.replace("localhost:8000", f"localhost:{http}"), tmp_path)
        assert out == expected + "\n"
    finally:
        assert k.stop() == 0


def test_coming_from_pytriton(tmp_path):
    """The PyTriton program (ports from PYTRITON_TRITON_CONFIG_*, as the README says for the examples),
    then the ModelClient snippet against it."""
    http, grpc, metrics = free_ports(3)
    (tmp_path / "add_sub_server.py").write_text(python_block(PYTRITON_SERVER))
    env = {"PYTRITON_TRITON_CONFIG_HTTP_PORT": str(http), "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(grpc),
           "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(metrics)}
    k = ServerProcess([sys.executable, "add_sub_server.py"], tmp_path / "server.log", env=env, cwd=tmp_path)
    k.http_port = http
    try:
        k.wait_until_ok(["/v2/models/AddSub/ready"])
        client = python_block(PYTRITON_CLIENT).replace('ModelClient("localhost", ', f'ModelClient("localhost:{http}", ')
        out = run_python(client, tmp_path)
        # infer_sample(ones(3), arange(3)): add = [1, 2, 3], sub = [1, 0, -1]
        assert re.search(r"'add': array\(\[1\., 2\., 3\.\]", out) and re.search(r"'sub': array\(\[ 1\.,  0\., -1\.\]", out), out
    finally:
        k.stop()
    deadline = time.monotonic() + 5
    while k.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert k.proc.returncode is not None


def test_the_bound_generator_fragment_runs_on_its_own():
    """It used `np` without importing numpy; in a namespace of its own it yields one response per word."""
    namespace: dict = {}
    exec(python_block(BOUND_GENERATOR), namespace)

    class Request:
        parameters = {"max_tokens": 2}

    answers = list(namespace["words"]([Request()]))
    assert [a[0]["text_output"].tolist() for a in answers] == [[b" word0"], [b" word1"]]



# ---- the container lines of the Deploy table ----------------------------------------------------------


def consecutive_free_ports(n: int) -> int:
    """The first of n consecutive ports nothing listens on (the README maps a range: 8000-8003)."""
    import random
    import socket

    for _ in range(200):
        base = random.randrange(20000, 60000 - n)
        held = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no free port range")


def read_chat_stream(port: int) -> str:
    body = b'{"model": "tiny_lm", "messages": [{"role": "user", "content": "Hello"}], "stream": true, "max_tokens": 6}'
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [line.decode().strip() for line in r if line.startswith(b"data:")]
    assert events[-1] == "data: [DONE]" and len(events) > 2, events
    return "".join(events)


def engine_answers(*command: str) -> tuple[bool, str]:
    """Whether a container engine command runs here, and what it said when it did not."""
    if not shutil.which(command[0]):
        return False, f"{command[0]} is not installed"
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=120)
    return done.returncode == 0, (done.stderr or done.stdout).strip()[-500:]


def run_container_line(line: str, tmp_path: Path) -> None:
    """The README's run line, as written but for the host ports; ready, a model and a streamed chat
    on the OpenAI port, then Ctrl-C (podman and docker pass it to the container: tini, Kernel)."""
    base = consecutive_free_ports(4)
    command = line.replace("-p 8000-8003:8000-8003", f"-p {base}-{base + 3}:8000-8003")
    log = tmp_path / "container.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    class Started:
        name = line.split()[0] + " run"

        def __init__(self):
            self.proc = proc

        def log(self):
            return log.read_text(errors="replace")

    try:
        wait_until_ok(Started(), [f"http://127.0.0.1:{base}/v2/health/ready",
                                  f"http://127.0.0.1:{base}/v2/models/tiny_lm/ready"], timeout=180)
        read_chat_stream(base + 3)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, Started().log()[-3000:]
    assert '"Received signal 2 (SIGINT), shutting down"' in log.read_text(errors="replace")


def test_podman_run_line(tmp_path):
    ok, why = engine_answers("podman", "--version")
    if not ok:
        pytest.skip(f"no container engine here ({why}): apt-get install podman runc")
    if subprocess.run(["podman", "image", "exists", "localhost/kernel:latest"]).returncode != 0:
        pytest.skip(f"the image is not built here: `{BUILD_IMAGE}` builds it (KERNEL_TEST_IMAGE_BUILD=1 runs that test)")
    ok, why = engine_answers(str(ROOT / "deploy" / "podman-opts.sh"), "--run-flags")
    if not ok:
        pytest.skip(f"podman cannot run containers here: {why}")
    run_container_line(PODMAN_RUN, tmp_path)


def test_build_image_on_a_fresh_clone(tmp_path):
    """`sudo deploy/build-image.sh` in a clone that never ran `make serve` (issue 35: its smoke test
    wanted the clone's .venv/bin/python). The clone is of the last commit."""
    if os.environ.get("KERNEL_TEST_IMAGE_BUILD") != "1":
        pytest.skip("builds a Debian base and the image (minutes, PyPI and Debian mirrors): KERNEL_TEST_IMAGE_BUILD=1 "
                    "runs it, as root with podman")
    ok, why = engine_answers("podman", "--version")
    if not ok:
        pytest.skip(f"no container engine here ({why})")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-local", str(ROOT), str(clone)], check=True, timeout=300)
    assert not (clone / ".venv").exists()
    command = BUILD_IMAGE if os.geteuid() != 0 or shutil.which("sudo") else BUILD_IMAGE.removeprefix("sudo ")
    done = subprocess.run(["bash", "-c", command], cwd=clone, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    assert "smoke test passed (podman)" in done.stdout, done.stdout[-3000:]
    assert not (clone / ".venv").exists()


def test_docker_lines(tmp_path):
    ok, why = engine_answers("docker", "info")
    if not ok:
        pytest.skip(f"no Docker daemon answers here ({why.splitlines()[-1] if why else 'docker info failed'})")
    done = subprocess.run(["bash", "-c", DOCKER_BUILD], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0 and "pull" in (done.stdout + done.stderr).lower():
        pytest.skip("Docker cannot pull the base image (python:3.11-slim-bookworm) here: no registry")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_container_line(DOCKER_RUN, tmp_path)
