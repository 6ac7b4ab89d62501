"""The peers Kernel is measured against, installed from PyPI into a venv of their own.

* real Triton Inference Server with its Python backend: the ``nvidia-pytriton==0.7.0`` wheel carries
  a complete ``tritonserver`` binary, ``libtriton_python.so`` and one Python-backend stub per Python
  version (the stub for this interpreter's version is put where the backend looks for it);
* ``perf_analyzer``: shipped in the ``tritonclient[all]==2.50.0`` manylinux wheel; it links against
  ``libb64.so.0d``, which Debian packages as ``libb64-0d`` (installed with apt-get when missing);
* real PyTriton 0.7 (the same wheel) for ``bound_callables.py``.

Usage::

    python benchmarks/peers.py install            # idempotent; venv at benchmarks/.peers (git-ignored)
    python benchmarks/peers.py install --triton-only   # the same, without perf_analyzer's libb64 (make peer-check)
    python benchmarks/peers.py env                # the exports the commands below use (eval-able)
    python benchmarks/peers.py triton REPO [HTTP GRPC METRICS]   # run real Triton in the foreground
    python benchmarks/peers.py perf ARGS...       # perf_analyzer
    python benchmarks/peers.py check              # exit 0 when installed and runnable

``KERNEL_PEERS_DIR`` (or ``--dir`` before the command) puts the venv elsewhere. Other benchmark
scripts import this module (``ensure()``, ``env()``, ``tritonserver_cmd()``, ``perf_cmd()``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = Path(os.environ.get("KERNEL_PEERS_DIR", HERE / ".peers"))
PACKAGES = ["nvidia-pytriton==0.7.0", "tritonclient[all]==2.50.0", "nvidia-cuda-runtime-cu12", "numpy"]
STAMP = ".kernel-peers.json"


def _say(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def venv_python(d: Path = DEFAULT_DIR) -> Path:
    return d / "bin" / "python"


def _site(d: Path) -> Path:
    """The venv's site-packages, asked of the venv's own interpreter (its version may differ from ours)."""
    out = subprocess.run([str(venv_python(d)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _pyver(d: Path) -> str:
    out = subprocess.run([str(venv_python(d)), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _have_libb64() -> bool:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        out = ""
    if "libb64.so.0d" in out:
        return True
    return any(Path(p, "libb64.so.0d").exists() for p in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                                                           "/usr/lib/aarch64-linux-gnu", "/usr/lib"))


def _install_libb64() -> None:
    if _have_libb64():
        return
    apt = shutil.which("apt-get")
    if apt is None:
        raise SystemExit("perf_analyzer needs libb64.so.0d (Debian/Ubuntu package libb64-0d); no apt-get here: install it by hand")
    sudo = [] if os.geteuid() == 0 else (["sudo"] if shutil.which("sudo") else [])
    _say("installing libb64-0d (perf_analyzer needs libb64.so.0d) with apt-get")
    subprocess.run([*sudo, apt, "update", "-qq"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*sudo, apt, "install", "-y", "-qq", "libb64-0d"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def installed(d: Path = DEFAULT_DIR) -> bool:
    try:
        stamp = json.loads((d / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("packages") == PACKAGES and venv_python(d).exists() and Path(stamp.get("tritonserver", "")).exists()


def install(d: Path = DEFAULT_DIR, force: bool = False, perf: bool = True) -> Path:
    """Create/complete the peers venv. Cheap when already done (a stamp file records what was installed).

    perf=False skips what only perf_analyzer needs (libb64 from apt-get, which wants root): real
    Triton alone is what the peer checks run."""
    if perf:
        _install_libb64()
    if installed(d) and not force:
        return d
    if not venv_python(d).exists():
        _say(f"creating venv {d}")
        # the base interpreter, not a venv's: a venv made from a venv still works, but keep it plain
        base = getattr(sys, "_base_executable", sys.executable) or sys.executable
        subprocess.run([base, "-m", "venv", str(d)], check=True)
    _say(f"pip install {' '.join(PACKAGES)} (about 450 MB the first time)")
    subprocess.run([str(venv_python(d)), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PACKAGES], check=True)
    site = _site(d)
    home = site / "pytriton" / "tritonserver"
    stub = home / "python_backend_stubs" / _pyver(d) / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"the pytriton wheel has no Python-backend stub for Python {_pyver(d)} ({stub})")
    target = home / "backends" / "python" / "triton_python_backend_stub"
    shutil.copy2(stub, target)
    target.chmod(0o755)
    (d / STAMP).write_text(json.dumps({"packages": PACKAGES, "tritonserver": str(home / "bin" / "tritonserver")}, indent=1))
    _say(f"peers installed in {d}")
    return d


def ensure(d: Path = DEFAULT_DIR) -> Path:
    return install(d) if not installed(d) else d


def env(d: Path = DEFAULT_DIR, base: dict | None = None) -> dict:
    """Environment for tritonserver and perf_analyzer: the venv first on PATH (the stub imports numpy
    from it), the wheel's bundled libraries and the CUDA runtime on LD_LIBRARY_PATH."""
    e = dict(os.environ if base is None else base)
    site = _site(d)
    libs = [str(site / "nvidia_pytriton.libs"), str(site / "nvidia" / "cuda_runtime" / "lib")]
    if e.get("LD_LIBRARY_PATH"):
        libs.append(e["LD_LIBRARY_PATH"])
    e["LD_LIBRARY_PATH"] = ":".join(libs)
    e["PATH"] = f"{d / 'bin'}:{e.get('PATH', '')}"
    e["TRITON_HOME"] = str(site / "pytriton" / "tritonserver")
    e.pop("PYTHONPATH", None)  # nothing of Kernel's tree (its triton_python_backend_utils shim) in the stub
    return e


def tritonserver_cmd(repo: Path, http: int, grpc: int, metrics: int, d: Path = DEFAULT_DIR, extra: list[str] = ()) -> list[str]:
    home = _site(d) / "pytriton" / "tritonserver"
    return [str(home / "bin" / "tritonserver"), f"--model-repository={Path(repo).resolve()}",
            f"--backend-directory={home / 'backends'}", f"--http-port={http}", f"--grpc-port={grpc}",
            f"--metrics-port={metrics}", "--log-verbose=0", *extra]


def perf_cmd(d: Path = DEFAULT_DIR) -> list[str]:
    return [str(d / "bin" / "perf_analyzer")]


def pytriton_libdir(d: Path = DEFAULT_DIR) -> str:
    """PyTriton's stub must load the venv interpreter's own libpython (see ../shared/DESIGN.md)."""
    out = subprocess.run([str(venv_python(d)), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main(argv: list[str]) -> int:
    d = DEFAULT_DIR
    if len(argv) >= 2 and argv[0] == "--dir":
        d, argv = Path(argv[1]).resolve(), argv[2:]
    cmd, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if cmd == "install":
        install(d, force="--force" in rest, perf="--triton-only" not in rest)
        return 0
    if cmd == "check":
        return 0 if installed(d) else 1
    if cmd == "env":
        e = env(d, base={})
        print(f"export PATH={shlex.quote(str(d / 'bin'))}:\"$PATH\"")
        print(f"export LD_LIBRARY_PATH={shlex.quote(e['LD_LIBRARY_PATH'])}:\"${{LD_LIBRARY_PATH:-}}\"")
        print(f"export TRITON_HOME={shlex.quote(e['TRITON_HOME'])}")
        return 0
    if cmd == "triton":
        if not rest:
            print("usage: peers.py triton REPO [HTTP GRPC METRICS] [-- extra tritonserver flags]", file=sys.stderr)
            return 2
        ensure(d)
        extra = rest[rest.index("--") + 1:] if "--" in rest else []
        pos = rest[: rest.index("--")] if "--" in rest else rest
        ports = [int(x) for x in pos[1:4]] + [8000, 8001, 8002][len(pos[1:4]):]
        args = tritonserver_cmd(Path(pos[0]), *ports, d=d, extra=extra)
        # Never from the project root: Kernel's triton_python_backend_utils/ shim there would shadow
        # the real one inside Triton's Python-backend stub and every model would fail to load.
        os.chdir(d)
        os.execve(args[0], args, env(d))
    if cmd == "perf":
        ensure(d)
        args = perf_cmd(d) + rest
        os.execve(args[0], args, env(d))
    if cmd == "python":
        ensure(d)
        os.execv(str(venv_python(d)), [str(venv_python(d)), *rest])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
