"""deploy/smoke-test.sh's client runs on a fresh clone (issue 35): it needs nothing `make serve` made.

On a clone that never ran `make serve`, deploy/build-image.sh built the image and then failed with
`<clone>/.venv/bin/python: No such file or directory`: the smoke test ran its client with the
clone's venv. The client now runs in the image itself, so it may import only the standard library
and what the image installs (Kernel's runtime dependencies and its `openai` extra); here it is also
run, as the smoke test runs it, against a real `kernel serve` on the models the smoke test mounts
(model_repo_examples/ and deploy/smoke_models/), with its OpenAI port on.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import signal
import subprocess
import sys

from conftest import EXAMPLES, ROOT, KernelProcess, absolute_imports, free_port

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject allows it): tomli, in the test extra there
    import tomli as tomllib

DEPLOY = ROOT / "deploy"
CLIENT = DEPLOY / "smoke_client.py"


def _requirement_name(spec: str) -> str:
    return re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0].lower().replace("_", "-")


def test_the_client_imports_only_what_the_image_installs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = {_requirement_name(r) for r in project["dependencies"] + project["optional-dependencies"]["openai"]}
    providers = importlib.metadata.packages_distributions()
    outside = []
    for _, name in absolute_imports(ast.parse(CLIENT.read_text())):
        if name in sys.stdlib_module_names or name == "__future__":
            continue
        dists = {d.lower().replace("_", "-") for d in providers.get(name, [])}
        if not dists & installed:
            outside.append((name, sorted(dists)))
    assert not outside, f"smoke_client.py imports what the image does not have: {outside}"


def test_the_smoke_test_needs_no_venv_of_the_clone():
    for script in ("smoke-test.sh", "build-image.sh"):
        text = (DEPLOY / script).read_text()
        assert ".venv" not in text, f"{script} uses the clone's .venv, which only `make serve` makes"
    text = (DEPLOY / "smoke-test.sh").read_text()
    assert "python /smoke/smoke_client.py" in text  # the image's own Python runs the client


def run_client(*args: str, timeout: float = 120) -> str:
    # -I: no PYTHONPATH, no user site, not the current folder: what the interpreter itself has
    done = subprocess.run([sys.executable, "-I", str(CLIENT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd="/")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_client_passes_against_kernel_serve():
    openai_port = free_port()
    k = KernelProcess([EXAMPLES, DEPLOY / "smoke_models"], f"--openai-port={openai_port}")
    try:
        run_client("wait", f"http://127.0.0.1:{k.http_port}/v2/health/ready", "120")
        out = run_client("kserve", str(k.http_port), str(k.grpc_port), str(k.metrics_port))
        assert "tritonclient.grpc: add_sub OUTPUT0=[2.0, 3.0, 4.0, 5.0]" in out
        out = run_client("openai", str(openai_port))
        assert "streamed chat (tiny_lm)" in out
        assert "chat template (echo_chat): '[system] Be brief. [user] Hello [assistant]'" in out
        # drain: the client says when its request is in flight; the signal is ours to send
        drain = subprocess.Popen([sys.executable, "-I", str(CLIENT), "drain", str(k.http_port)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
        first = drain.stdout.readline()
        assert first.startswith("in flight"), first
        k.proc.send_signal(signal.SIGTERM)
        rest = drain.stdout.read()
        assert drain.wait(60) == 0, first + rest
        assert "in-flight request: status 200" in rest, rest
        assert k.wait_exit(60) == 0, k.log()
    finally:
        k.stop()

