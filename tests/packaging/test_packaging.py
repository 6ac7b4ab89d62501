"""What `pip install` puts on a user's machine, and what a user's working directory cannot break."""

from __future__ import annotations

import ast
import os
import subprocess
import time
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import EXAMPLES, ROOT, KernelProcess, absolute_imports, copy_model, running

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject allows it): tomli, in the test extra there
    import tomli as tomllib


BUILD_OUTPUT: list[str] = []  # what building the wheel printed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    BUILD_OUTPUT.append(done.stdout + done.stderr)
    (found,) = out.glob("*.whl")
    return found


def test_the_build_prints_no_warning(wheel):
    """It printed 35 lines about kernel.backends.python_based on every install (issue 27)."""
    (output,) = BUILD_OUTPUT
    assert "Warning" not in output and "would be ignored" not in output, output


def make_dry_run(target: str, tmp_path: Path) -> str:
    """The commands `make <target>` runs on a fresh clone (-B: as if nothing were installed yet)."""
    done = subprocess.run(["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_serve_installs_the_runtime_only_with_progress(tmp_path):
    """`make serve` installed the test and benchmark extras too (694 MB instead of 214 MB), silently."""
    installs = [line for line in make_dry_run("serve", tmp_path).splitlines() if " pip " in line and " install " in line]
    assert installs and all(line.rstrip().endswith("install -e .") for line in installs), installs
    assert not [line for line in installs if " -q" in line]


def test_make_serve_puts_back_an_editable_install_that_pip_replaced(tmp_path):
    """`pip install '.[openai]'` in the clone (without -e) replaced the editable install with a copy,
    and make serve's stamp never put it back: make now redoes the install when .venv's `kernel` is
    not the clone's. A stand-in interpreter says which it is."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    stamp = venv / ".installed-runtime"
    for answer, reinstalls in (("True", False), ("False", True)):
        python.write_text(f"#!/bin/sh\necho {answer}\n")
        python.chmod(0o755)
        stamp.touch()
        later = time.time() + 3600  # newer than pyproject.toml, so only the check can redo it
        os.utime(stamp, (later, later))
        done = subprocess.run(["make", "-n", "serve", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        installs = [line for line in done.stdout.splitlines() if " pip " in line and line.rstrip().endswith("install -e .")]
        assert bool(installs) is reinstalls, (answer, done.stdout)


def test_make_test_adds_the_test_extras(tmp_path):
    installs = [line for line in make_dry_run("test", tmp_path).splitlines() if " pip " in line and " install " in line]
    assert installs[-1].rstrip().endswith('install -e ".[test]"'), installs


def test_wheel_installs_only_two_top_level_names(wheel):
    """PyPI has unrelated `transports` and `backends` projects: ours install inside `kernel`."""
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist() if not name.split("/")[0].endswith((".dist-info", ".data"))}
        names = set(z.namelist())
    assert tops == {"kernel", "triton_python_backend_utils"}
    assert "kernel/transports/http/app.py" in names
    assert "kernel/backends/python/worker.py" in names
    assert "kernel/transports/grpc/protos/grpc_service.proto" in names
    assert "kernel/protos/model_config.proto" in names


def test_every_package_folder_is_listed_in_pyproject():
    """pyproject lists the packages (package-dir maps transports/ and backends/ under kernel)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    prefixes = {"kernel": "kernel", "transports": "kernel.transports", "backends": "kernel.backends",
                "triton_python_backend_utils": "triton_python_backend_utils"}
    found = set()
    for folder, package in prefixes.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    # Data folders inside a package are listed too (setuptools warns about them otherwise), not code.
    data = {"kernel.backends.python_based"}
    assert listed - found == data
    assert not list((ROOT / "backends" / "python_based").rglob("*.py"))


# Standard-library modules newer than the oldest Python pyproject allows (3.10), by the version
# that brought them: an unguarded import of one fails the whole module there.
_NEWER_STDLIB = {"tomllib": (3, 11)}


def _guarded(node, parents) -> bool:
    """Whether an import sits in a try whose handlers catch ModuleNotFoundError or ImportError."""
    for parent in parents:
        if isinstance(parent, ast.Try) and any(node in ast.walk(stmt) for stmt in parent.body):
            for handler in parent.handlers:
                names = [n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)] if handler.type else ["*"]
                if {"ModuleNotFoundError", "ImportError", "*"} & set(names):
                    return True
    return False


def test_code_and_tests_import_nothing_newer_than_the_oldest_supported_python():
    oldest = tuple(int(p) for p in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
                   .removeprefix(">=").split("."))
    found = []
    for folder in ("kernel", "transports", "backends", "triton_python_backend_utils", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            try:
                tree = ast.parse(path.read_text())
            except SyntaxError:  # tests/models/bad/syntax_error, on purpose
                continue
            parents = {}
            for parent in ast.walk(tree):
                for child in ast.iter_child_nodes(parent):
                    parents[child] = parent
            for node, module in absolute_imports(tree):
                if _NEWER_STDLIB.get(module, (0,)) <= oldest:
                    continue
                chain, up = [], parents.get(node)
                while up is not None:
                    chain.append(up)
                    up = parents.get(up)
                if not _guarded(node, chain):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module}")
    assert not found, found


def test_a_working_directory_with_kernel_py_and_backends_does_not_shadow_kernel(tmp_path):
    """Workers start with `python -c` and drop the current directory from sys.path, so files a user
    keeps where they start the server cannot replace Kernel's own modules."""
    cwd = tmp_path / "project"
    for package in ("backends", "transports", "kernel_extra"):
        (cwd / package).mkdir(parents=True)
        (cwd / package / "__init__.py").write_text("raise ImportError('the user\\'s own package was imported')\n")
    (cwd / "kernel.py").write_text("raise ImportError('the user\\'s kernel.py was imported')\n")
    (cwd / "triton_python_backend_utils.py").write_text("raise ImportError('the user\\'s pb_utils was imported')\n")
    repo = tmp_path / "repo"
    copy_model(EXAMPLES / "add_sub", repo)
    k = KernelProcess([repo], cwd=cwd)
    for k in running(k):
        client = httpclient.InferenceServerClient(f"localhost:{k.http_port}")
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(np.arange(4, dtype=np.float32))
        inputs[1].set_data_from_numpy(np.ones(4, dtype=np.float32))
        result = client.infer("add_sub", inputs)
        assert result.as_numpy("OUTPUT0").tolist() == [1.0, 2.0, 3.0, 4.0]


def test_serve_without_a_repository_is_refused_as_tritonserver_does(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kernel", "serve", "--http-port", "0"], cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1
    assert "--model-repository must be specified" in proc.stdout + proc.stderr
