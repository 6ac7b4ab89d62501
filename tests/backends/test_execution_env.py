"""Custom execution environments (EXECUTION_ENV_PATH): the worker runs on the environment's Python.

Environments are built once per session with `python -m venv` (a directory, and
a tarball with conda-pack's layout: bin/python, bin/activate,
lib/pythonX.Y/site-packages) holding `kernel_envtest_pkg`, a package the server
does not have.
"""

from __future__ import annotations

import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.http as httpclient

from kernel.backends.python import envarchive
from conftest import TESTS, KernelProcess

ENV_MODEL = TESTS / "execution_env" / "env_model.py"
PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"


# ---- building environments ----------------------------------------------------


def make_env(path: Path, python: str = sys.executable, answer: int = 42, copies: bool = False) -> Path:
    args = [python, "-m", "venv", "--without-pip", *(["--copies"] if copies else []), str(path)]
    subprocess.run(args, check=True, capture_output=True)
    (site,) = glob.glob(str(path / "lib" / "python3*" / "site-packages"))
    pkg = Path(site) / "kernel_envtest_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"ANSWER = {answer}\n")
    return path


def pack(src: Path, tarball: Path) -> Path:
    with tarfile.open(tarball, "w:gz") as tf:
        for entry in sorted(os.listdir(src)):
            tf.add(src / entry, arcname=entry)
    return tarball


@pytest.fixture(scope="session")
def envs(tmp_path_factory):
    root = tmp_path_factory.mktemp("envs")
    directory = make_env(root / "venv")
    tarball = pack(make_env(root / "packed", copies=True), root / "env.tar.gz")
    return SimpleNamespace(root=root, directory=directory, tarball=tarball)


TENSORS = """input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] }
]"""

# Appended to model.py where the config leaves the tensors to the model.
AUTO_COMPLETE = """

def _complete(config):
    kernel_envtest_pkg.ANSWER  # runs in the environment too
    config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
    config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
    config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [1]})
    return config


TritonPythonModel.auto_complete_config = staticmethod(_complete)
"""


def add_model(repo: Path, name: str, env_path: str | None, extra: str = "", auto_complete: bool = False) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    code = ENV_MODEL.read_text()
    (folder / "1" / "model.py").write_text(code + AUTO_COMPLETE if auto_complete else code)
    lines = ['backend: "python"'] + ([] if auto_complete else [TENSORS])
    if env_path is not None:
        lines.append(f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env_path}" }} }}')
    if extra:
        lines.append(extra)
    (folder / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return folder


def cache_args(cache: Path) -> tuple[str, str]:
    return "--backend-config", f"python,execution-env-cache-directory={cache}"


def infer(url: str, model: str):
    client = httpclient.InferenceServerClient(url)
    x = np.arange(4, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    return result.as_numpy("OUTPUT0") - x, json.loads(result.as_numpy("INFO")[0])


def extracted_dirs(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "index"]


# ---- serving from an environment ------------------------------------------------


@pytest.fixture(scope="module")
def env_server(envs, tmp_path_factory):
    base = tmp_path_factory.mktemp("env_server")
    repo, cache, backends = base / "repo", base / "cache", base / "backends"
    add_model(repo, "env_dir", str(envs.directory))
    in_model = add_model(repo, "env_tar", "$$TRITON_MODEL_DIRECTORY/env.tar.gz", auto_complete=True)
    shutil.copy(envs.tarball, in_model / "env.tar.gz")
    add_model(repo, "env_tar_shared", str(envs.tarball))  # same bytes at another path
    add_model(
        repo, "env_inherit", str(envs.directory),
        'parameters { key: "KERNEL_INHERIT_SERVER_PACKAGES" value: { string_value: "yes" } }',
    )
    # A Python-based backend shipping its own environment next to its model.py.
    (backends / "envbackend").mkdir(parents=True)
    shutil.copy(ENV_MODEL, backends / "envbackend" / "model.py")
    shutil.copy(envs.tarball, backends / "envbackend" / "pb_exec_env_model.py.tar.gz")
    (repo / "env_backend" / "1").mkdir(parents=True)
    (repo / "env_backend" / "config.pbtxt").write_text(f'backend: "envbackend"\n{TENSORS}\n')
    k = KernelProcess([repo], *cache_args(cache), "--backend-directory", str(backends))
    try:
        yield SimpleNamespace(k=k.wait_ready(), repo=repo, cache=cache, backends=backends)
    finally:
        k.stop()


def test_model_imports_a_package_only_its_environment_has(env_server, envs):
    offset, info = infer(env_server.k.url, "env_dir")
    assert (offset == 42).all()
    assert info["prefix"] == str(envs.directory)
    assert info["package_file"].startswith(str(envs.directory))
    assert info["VIRTUAL_ENV"] == str(envs.directory)
    with pytest.raises(ImportError):
        import kernel_envtest_pkg  # noqa: F401 - the server side really lacks it


def test_worker_does_not_see_the_servers_packages(env_server):
    _, info = infer(env_server.k.url, "env_dir")
    assert info["httpx"] is None  # installed for the server, not in the environment
    assert info["no_user_site"] and info["PYTHONNOUSERSITE"] == "1"
    # Same Python as the server and no numpy of its own: the server's numpy is lent.
    assert info["numpy"].startswith(os.path.dirname(os.path.dirname(np.__file__)))


def test_inherit_server_packages_on_request(env_server):
    offset, info = infer(env_server.k.url, "env_inherit")
    assert (offset == 42).all()
    assert info["httpx"] is not None


def test_tarballs_are_extracted_once_and_shared(env_server):
    for model in ("env_tar", "env_tar_shared"):
        offset, info = infer(env_server.k.url, model)
        assert (offset == 42).all()
        assert info["prefix"].startswith(str(env_server.cache))
    # Three models name the same bytes (two paths plus the backend's copy): one extraction.
    assert len(extracted_dirs(env_server.cache)) == 1
    assert env_server.k.log().count("Extracted Python execution env") == 1


def test_python_based_backend_uses_its_bundled_environment(env_server):
    offset, info = infer(env_server.k.url, "env_backend")
    assert (offset == 42).all()
    assert info["prefix"].startswith(str(env_server.cache))
    config = httpclient.InferenceServerClient(env_server.k.url).get_model_config("env_backend")
    bundled = env_server.backends / "envbackend" / "pb_exec_env_model.py.tar.gz"
    assert config["parameters"]["EXECUTION_ENV_PATH"]["string_value"] == str(bundled.resolve())


def test_restart_reuses_the_extraction(env_server, envs, start_kernel, tmp_path):
    add_model(tmp_path, "env_tar_again", str(envs.tarball))
    k = start_kernel([tmp_path], *cache_args(env_server.cache)).wait_ready()
    offset, _ = infer(k.url, "env_tar_again")
    assert (offset == 42).all()
    log = k.log()
    assert "Extracted Python execution env" not in log
    assert "Reusing Python execution env" in log
    assert len(extracted_dirs(env_server.cache)) == 1


# ---- refused environments ------------------------------------------------------


def _hostile(path: Path, build) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        build(tf)
    return path


def _file(tf: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def _link(tf: tarfile.TarFile, name: str, target: str, hard: bool = False) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    tf.addfile(info)


def hostile_archives(folder: Path, outside: Path) -> dict[str, tuple[Path, str]]:
    """name -> (archive, the refusal it must get). `outside` must stay empty."""
    folder.mkdir(parents=True, exist_ok=True)

    def chain(tf):  # each link looks harmless alone; together they leave the tree
        _link(tf, "d/u", "..")
        _link(tf, "t", "d/u/..")

    def write_through(tf):
        _link(tf, "d/u", "..")
        _link(tf, "t", "d/u/..")
        _file(tf, "t/pwned.txt")

    def device(tf):
        info = tarfile.TarInfo("bin/null")
        info.type = tarfile.CHRTYPE
        tf.addfile(info)

    builders = {
        # libarchive's words for these two, as later Triton logs them (its QA env/test.sh greps them)
        "absolute": (lambda tf: _file(tf, str(outside / "abs.txt")), "Path is absolute"),
        "dotdot": (lambda tf: _file(tf, "lib/../../escape.txt"), "Path contains '..'"),
        "symlink_absolute": (lambda tf: _link(tf, "bin/evil", str(outside)), "absolute path"),
        "symlink_relative": (lambda tf: _link(tf, "bin/evil", "../../outside"), "points outside"),
        "hardlink_out": (lambda tf: _link(tf, "bin/evil", "../escape.txt", hard=True), "outside the archive"),
        "symlink_chain": (chain, "resolves outside"),
        "write_through_link": (write_through, "written through a link"),
        "device": (device, "device file"),
    }
    return {
        name: (_hostile(folder / f"{name}.tar.gz", build), message)
        for name, (build, message) in builders.items()
    }


@pytest.mark.parametrize("case", [
    "absolute", "dotdot", "symlink_absolute", "symlink_relative", "hardlink_out", "symlink_chain",
    "write_through_link", "device",
])
def test_hostile_archive_is_refused_and_writes_nothing_outside(tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = tmp_path / "cache"
    archive, message = hostile_archives(tmp_path / "archives", outside)[case]
    with pytest.raises(envarchive.UnsafeArchive, match=message):
        envarchive.unpack_cached(archive, cache)
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists() and not (cache / "escape.txt").exists()
    assert not (tmp_path / "pwned.txt").exists() and not (cache / "pwned.txt").exists()
    assert extracted_dirs(cache) == []
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]


def test_archive_cache_is_keyed_by_content(tmp_path, envs):
    cache = tmp_path / "cache"
    first, made = envarchive.unpack_cached(envs.tarball, cache)
    assert made and (first / "bin" / "activate").is_file()
    assert (first / "lib64").is_symlink()  # links that stay inside are kept
    again, made = envarchive.unpack_cached(envs.tarball, cache)
    assert (again, made) == (first, False)
    copy = shutil.copy(envs.tarball, tmp_path / "copy.tar.gz")
    assert envarchive.unpack_cached(Path(copy), cache) == (first, False)
    changed = pack(make_env(tmp_path / "other", answer=7, copies=True), tmp_path / "other.tar.gz")
    other, made = envarchive.unpack_cached(changed, cache)
    assert made and other != first


def test_refused_environments_fail_the_load_clearly(tmp_path, start_kernel, envs):
    outside = tmp_path / "outside"
    outside.mkdir()
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    expected = {
        "remote_s3": ("s3://bucket/envs/env.tar.gz", "remote storage"),
        "remote_gs": ("gs://bucket/env.tar.gz", "not supported by Kernel"),
        "escapes_model_dir": ("$$TRITON_MODEL_DIRECTORY/../../bare", "outside the model directory"),
        "escapes_by_symlink": ("$$TRITON_MODEL_DIRECTORY/linked_env", "outside the model directory"),
        "does_not_exist": (str(tmp_path / "nowhere.tar.gz"), "does not exist"),
        "not_an_archive": (str(tmp_path / "notes.txt"), "neither a directory nor a tar archive"),
        "no_activate": (str(tmp_path / "bare"), "no bin/activate"),
    }
    (tmp_path / "notes.txt").write_text("not an environment\n")
    (tmp_path / "bare" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / "bare" / "bin" / "python3")
    for name, (archive, message) in hostile_archives(tmp_path / "archives", outside).items():
        expected[f"hostile_{name}"] = (str(archive), f"refusing to unpack execution environment '{archive}': ")
        expected[f"hostile_{name}"] += (message,)
    for name, (value, *_) in expected.items():
        add_model(repo, name, value)
    os.symlink(envs.directory, repo / "escapes_by_symlink" / "linked_env")
    add_model(repo, "good", str(envs.directory))
    k = start_kernel([repo], *cache_args(cache), "--exit-on-error=false", "--strict-readiness=false").wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    assert client.is_model_ready("good")
    log = k.log()
    for name, (_, *messages) in expected.items():
        assert not client.is_model_ready(name), name
        line = next((ln for ln in log.splitlines() if f"failed to load '{name}'" in ln), "")
        assert all(message in line for message in messages), (name, line)
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists() and not (cache / "escape.txt").exists()
    assert extracted_dirs(cache) == []


# ---- another Python version ----------------------------------------------------


def _other_interpreters() -> list[str]:
    """CPython interpreters >= 3.10 of another minor version than the server's."""
    candidates = glob.glob("/usr/bin/python3.*") + glob.glob("/usr/local/bin/python3.*")
    candidates += glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python3"))
    found: dict[tuple[int, int], str] = {}
    for path in sorted(candidates):
        if not os.access(path, os.X_OK) or path.endswith("-config"):
            continue
        try:
            out = subprocess.run([path, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
                                 capture_output=True, text=True, timeout=20)
            version = tuple(int(v) for v in out.stdout.split())
        except (OSError, ValueError, subprocess.TimeoutExpired):
            continue
        if len(version) == 2 and version >= (3, 10) and version != sys.version_info[:2]:
            found.setdefault(version, path)
    return [found[v] for v in sorted(found, reverse=True)]


def _old_interpreter() -> str | None:
    for path in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[6-9]*/bin/python3"))):
        return path
    return None


@pytest.fixture(scope="session")
def other_python_env(tmp_path_factory):
    interpreters = _other_interpreters()
    if not interpreters:
        pytest.skip(f"no CPython >= 3.10 other than {sys.version_info[0]}.{sys.version_info[1]} on this machine")
    python = interpreters[0]
    root = tmp_path_factory.mktemp("other_python")
    bare = make_env(root / "bare", python=python, answer=1)
    full = make_env(root / "full", python=python, answer=7)
    (site,) = glob.glob(str(full / "lib" / "python3*" / "site-packages"))
    version = Path(site).parent.name[len("python"):]
    # The server's pip installs wheels for the other Python straight into its site-packages.
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--only-binary=:all:",
         "--python-version", version, "--target", site, "numpy", "msgspec"],
        capture_output=True, text=True, timeout=300,
    )
    return SimpleNamespace(python=python, bare=bare, full=full, pip_ok=pip.returncode == 0, pip_error=pip.stderr)


def test_environment_with_another_python_version(other_python_env, tmp_path, start_kernel):
    env = other_python_env
    repo = tmp_path / "repo"
    add_model(repo, "other_python", str(env.full))
    add_model(repo, "other_python_bare", str(env.bare))
    add_model(
        repo, "other_python_inherit", str(env.full),
        'parameters { key: "KERNEL_INHERIT_SERVER_PACKAGES" value: { string_value: "yes" } }',
    )
    k = start_kernel([repo], *cache_args(tmp_path / "cache"), "--exit-on-error=false",
                     "--strict-readiness=false").wait_ready()
    log = k.log()
    # No numpy/msgspec of its own, and the server's cannot be lent to another Python.
    bare_line = next(ln for ln in log.splitlines() if "failed to load 'other_python_bare'" in ln)
    assert "lacks numpy, msgspec" in bare_line and "-m pip install numpy msgspec" in bare_line
    inherit_line = next(ln for ln in log.splitlines() if "failed to load 'other_python_inherit'" in ln)
    assert "KERNEL_INHERIT_SERVER_PACKAGES" in inherit_line
    if not env.pip_ok:
        pytest.skip(f"could not install numpy and msgspec for {env.python}: {env.pip_error[-500:]}")
    offset, info = infer(k.url, "other_python")
    assert (offset == 7).all()
    assert tuple(info["version"][:2]) != sys.version_info[:2]
    assert info["prefix"] == str(env.full)
    assert info["numpy"].startswith(str(env.full))


def test_too_old_python_is_refused(tmp_path, start_kernel):
    python = _old_interpreter()
    if python is None:
        pytest.skip("no Python older than 3.10 on this machine")
    repo = tmp_path / "repo"
    add_model(repo, "old_python", str(make_env(tmp_path / "old", python=python)))
    k = start_kernel([repo], *cache_args(tmp_path / "cache"))
    assert k.wait_exit(60) != 0
    assert "Kernel's worker needs CPython 3.10 or newer" in k.log()
