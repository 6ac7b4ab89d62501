"""Shared by the model control tests: a repository of copies, polling, and small clients."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONTROL = ROOT / "tests" / "models" / "control"
ENSEMBLES = ROOT / "tests" / "models" / "scheduling" / "ensembles"


def make_repo(repo: Path, *models: str) -> Path:
    """A repository of copies (symlinks resolved): 'scaler', 'loader', 'ens_*', or 'name=scaler' for a renamed copy."""
    repo.mkdir(parents=True, exist_ok=True)
    for spec in models:
        name, _, source = spec.partition("=")
        source = source or name
        src = (ENSEMBLES if source.startswith("ens_") else CONTROL) / source
        target = repo / name
        shutil.copytree(src, target)
        if name != source:
            config = target / "config.pbtxt"
            config.write_text(config.read_text().replace(f'name: "{source}"', f'name: "{name}"'))
    return repo


def set_scale(model_dir: Path, scale: str) -> None:
    config = model_dir / "config.pbtxt"
    text = config.read_text()
    start = text.index('string_value: "') + len('string_value: "')
    end = text.index('"', start)
    config.write_text(text[:start] + scale + text[end:])


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def http(url: str, method: str, path: str, body=None) -> tuple[int, str]:
    """A raw HTTP call (tritonclient would quote or refuse some of the paths tests send)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(f"http://{url}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def index(url: str) -> list[dict]:
    status, body = http(url, "POST", "/v2/repository/index")
    assert status == 200, body
    return json.loads(body)


def states(url: str) -> dict[tuple[str, str], tuple[str, str]]:
    """{(name, version): (state, reason)} from the repository index."""
    return {(r["name"], r.get("version", "")): (r.get("state", ""), r.get("reason", "")) for r in index(url)}


def scaler_inputs(module):
    x = np.arange(1, 5, dtype=np.float32)
    t = module.InferInput("INPUT0", [4], "FP32")
    t.set_data_from_numpy(x)
    return x, [t]


def scale_of(client, module, model: str = "scaler") -> tuple[float, int, int]:
    """(scale, worker pid, version) as the model answers now."""
    x, inputs = scaler_inputs(module)
    result = client.infer(model, inputs)
    out = result.as_numpy("OUTPUT0")
    return float(out[0] / x[0]), int(result.as_numpy("PID")[0]), int(result.as_numpy("VERSION")[0])


def call_loader(client, module, action: str, name: str, arg: str = "") -> str:
    """Have the 'loader' model call pb_utils.<action> and return what it saw."""
    inputs = []
    for key, value in (("ACTION", action), ("NAME", name), ("ARG", arg)):
        t = module.InferInput(key, [1], "BYTES")
        t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
        inputs.append(t)
    return client.infer("loader", inputs).as_numpy("RESULT")[0].decode()
