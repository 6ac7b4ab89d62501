"""The README's first run ends with the official `openai` client streaming a chat completion from
`make serve`: the Makefile turns the OpenAI API on at 9000, and the README's snippet runs as written
against the bundled repository (only its port is changed to a free one)."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import EXAMPLES, ROOT
from openai_helpers import OpenAIServer


def test_make_serve_turns_the_openai_api_on():
    out = subprocess.run(["make", "-n", "serve"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "--model-repository model_repo_examples" in out and "--openai-port 9000" in out
    given = subprocess.run(["make", "-n", "serve", "ARGS=--openai-port=9100"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert "--openai-port 9000" not in given and "--openai-port=9100" in given


def test_the_readme_first_chat_snippet_streams_from_tiny_lm():
    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"<!-- first-chat:[^\n]*-->\n```python\n(.*?)```", readme, re.S).group(1)
    assert "localhost:9000" in snippet and "stream=True" in snippet
    k = OpenAIServer([EXAMPLES])
    try:
        k.wait_ready()
        code = snippet.replace("localhost:9000", f"localhost:{k.openai_port}")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    finally:
        k.stop()
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.split()) >= 5, run.stdout
