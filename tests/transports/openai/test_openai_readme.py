"""The README's first run ends with the official `openai` client streaming a chat completion from
`make serve`: the Makefile turns the OpenAI API on at 9000, and the README's snippet runs as written
against the bundled repository (only its port is changed to a free one)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from conftest import EXAMPLES, ROOT, free_ports
from openai_helpers import OPENAI_MODELS, OpenAIServer, request


def test_make_serve_turns_the_openai_api_on():
    out = subprocess.run(["make", "-n", "serve"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "--model-repository model_repo_examples" in out and "--openai-port 9000" in out
    given = subprocess.run(["make", "-n", "serve", "ARGS=--openai-port=9100"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert "--openai-port 9000" not in given and "--openai-port=9100" in given


def _run_snippet(marker: str) -> subprocess.CompletedProcess:
    """The README's python block after `<!-- marker: ... -->`, run against the bundled repository
    (only its port changed to a free one)."""
    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"<!-- " + marker + r":[^\n]*-->\n```python\n(.*?)```", readme, re.S).group(1)
    assert "localhost:9000" in snippet
    k = OpenAIServer([EXAMPLES])
    try:
        k.wait_ready()
        code = snippet.replace("localhost:9000", f"localhost:{k.openai_port}")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    finally:
        k.stop()


def test_the_readme_first_chat_snippet_streams_from_tiny_lm():
    run = _run_snippet("first-chat")
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.split()) >= 5, run.stdout


def test_the_readme_tools_example_calls_a_tool():
    run = _run_snippet("tools-example")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["tool_calls", "get_weather"]


def test_a_fresh_clone_make_serve_renders_chat_templates(tmp_path):
    """Chat templates answered 500 under `make serve` (issue 33): it installed the runtime without
    jinja2. A clone of the committed tree, `make serve` as a newcomer runs it (its own .venv, its own
    install), and a model with a chat template answers a chat rendered by it."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    repo = tmp_path / "repo"
    shutil.copytree(clone / "model_repo_examples" / "tiny_lm", repo / "tiny_lm")
    shutil.copytree(OPENAI_MODELS / "inspect_lm", repo / "inspect_lm")  # its template: tokenizer_config.json
    http, grpc, metrics, openai_port = free_ports(4)
    args = (f"ARGS=--model-repository {repo} --http-port {http} --grpc-port {grpc} --metrics-port {metrics} "
            f"--openai-port {openai_port}")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    log = open(tmp_path / "make-serve.log", "wb")
    make = subprocess.Popen(["make", "serve", args], cwd=clone, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 600  # the install (from pip's cache: ~35 s here) and the start
        while time.monotonic() < deadline:
            assert make.poll() is None, (tmp_path / "make-serve.log").read_text()[-3000:]
            try:
                if request(http, "GET", "/v2/health/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("make serve did not become ready:\n" + (tmp_path / "make-serve.log").read_text()[-3000:])
        status, _, body = request(openai_port, "POST", "/v1/chat/completions", {
            "model": "inspect_lm", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200, body
        seen = json.loads(json.loads(body)["choices"][0]["message"]["content"])
        assert seen["prompt"] == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        try:
            make.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait(10)
        log.close()
