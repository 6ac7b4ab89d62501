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
    "sudo deploy/build-image.sh": "needs root and podman; deploy/smoke-test.sh checks the image by hand",
    "docker build -f deploy/Dockerfile -t kernel:0.1.0 .": "needs Docker and a registry to pull the base image from",
    "podman run --rm -p 8000-8002:8000-8002 -v $PWD/model_repo_examples:/models:ro localhost/kernel:latest":
        "needs the image built above",
    "kubectl apply -f deploy/kserve/clusterservingruntime.yaml -f deploy/kserve/inferenceservice.yaml":
        "needs a Kubernetes cluster with KServe (tests/deploy validates the manifests and runs their probes)",
    "helm install kernel deploy/helm/kernel --set image.repository=REGISTRY/kernel --set image.tag=0.1.0":
        "needs a Kubernetes cluster (tests/deploy renders and validates the chart)",
    "aws sagemaker create-model --model-name kernel --execution-role-arn ROLE --primary-container "
    "Image=ECR_IMAGE,ModelDataUrl=s3://BUCKET/model.tar.gz": "needs an AWS account",
    "def words(requests):                     # Triton.bind(..., config=ModelConfig(decoupled=True))":
        "a fragment (no imports, no Triton()); the whole program, this generator bound and streamed to the "
        "openai client, is tests/transports/openai/test_openai_api.py::test_bound_generator_answers_chat_completions",
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
RUN = [MAKE_SERVE, *INSTALL, SERVE_MY_REPO, MODEL_PY, HTTP_CLIENT, PYTRITON_SERVER, PYTRITON_CLIENT]
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
