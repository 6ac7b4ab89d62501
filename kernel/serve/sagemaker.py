"""`kernel-sagemaker-serve` (or `python -m kernel.serve.sagemaker`): start Kernel the way SageMaker expects.

SageMaker starts a hosting container as `docker run <image> serve`; point the
image's `serve` at this entry point. It reads the SageMaker environment the
way tritonserver's own SageMaker `serve` script does and starts `kernel serve`
with only the SageMaker endpoint (plus what the environment asks for):

    SAGEMAKER_MULTI_MODEL=true            multi-model endpoint: models arrive through POST /models;
                                          /ping reports liveness
    SAGEMAKER_TRITON_DEFAULT_MODEL_NAME   the model /invocations serves (single-model endpoint);
                                          unset: the repository's only model
    SAGEMAKER_TRITON_INFERENCE_TYPE       infer (default), generate or generate_stream
    SAGEMAKER_TRITON_OVERRIDE_PING_MODE   ready or live
    SAGEMAKER_BIND_TO_PORT                --sagemaker-port (default 8080)
    SAGEMAKER_SAFE_PORT_RANGE             --sagemaker-safe-port-range
    SAGEMAKER_TRITON_ALLOW_GRPC / _ALLOW_METRICS / _GRPC_PORT / _METRICS_PORT
    SAGEMAKER_TRITON_THREAD_COUNT, SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT   (accepted, no effect)
    SAGEMAKER_TRITON_LOG_VERBOSE / _LOG_INFO / _LOG_WARNING / _LOG_ERROR
    SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE / _SHM_GROWTH_BYTE_SIZE   Python backend shared memory
    SAGEMAKER_TRITON_ADDITIONAL_ARGS      more `kernel serve` flags

The model data is in /opt/ml/model (single model) as SageMaker provides it;
`--model-dir DIR` points elsewhere (local testing). Any other argument is
passed on to `kernel serve`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Optional

SINGLE_MODEL_REPOSITORY = "/opt/ml/model"
MULTI_MODEL_REPOSITORY = "/tmp/sagemaker"
INFERENCE_TYPES = ("infer", "generate", "generate_stream")


class ServeError(Exception):
    pass


def _say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)


def _bool_flag(value: str) -> str:
    return value.strip().lower()


def _verbose_level(value: str) -> str:
    v = value.strip().lower()
    if v in ("true", "yes", "on"):
        return "1"
    if v in ("false", "no", "off"):
        return "0"
    return value.strip()


def _model_dirs(repo: Path) -> list[str]:
    return sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))


def _is_ensemble(model_dir: Path) -> bool:
    try:
        text = (model_dir / "config.pbtxt").read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"platform\s*:\s*\"ensemble\"", text) is not None


def _repository_for(repo: Path, model: str) -> Path:
    """A repository that loads `model` only (its own folder, or the whole one for an ensemble).

    tritonserver's script starts the named model with --load-model; Kernel
    reaches the same result by serving a folder that links to just that model.
    """
    others = [d for d in _model_dirs(repo) if d != model]
    if not others or _is_ensemble(repo / model):
        return repo
    only = Path(tempfile.mkdtemp(prefix="kernel-sagemaker-"))
    (only / model).symlink_to((repo / model).resolve(), target_is_directory=True)
    return only


def build_command(env, model_dir: Optional[str], extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """(`kernel serve` arguments, environment settings for the SageMaker endpoint); ServeError to stop."""
    settings: dict[str, str] = {}
    multi_model = env.get("SAGEMAKER_MULTI_MODEL", "") == "true"
    ping_mode = env.get("SAGEMAKER_TRITON_OVERRIDE_PING_MODE") or ("live" if multi_model else "ready")
    settings["SAGEMAKER_TRITON_PING_MODE"] = ping_mode
    if multi_model:
        repo = Path(model_dir or MULTI_MODEL_REPOSITORY)
        repo.mkdir(parents=True, exist_ok=True)
        _say(f"Kernel is running in SageMaker multi-model mode; ping mode: \"{ping_mode}\"")
    else:
        repo = Path(model_dir or SINGLE_MODEL_REPOSITORY)

    args: list[str] = ["--allow-sagemaker=true", "--allow-http=false"]
    optional = [
        ("SAGEMAKER_BIND_TO_PORT", "--sagemaker-port", str),
        ("SAGEMAKER_SAFE_PORT_RANGE", "--sagemaker-safe-port-range", str),
        ("SAGEMAKER_TRITON_METRICS_PORT", "--metrics-port", str),
        ("SAGEMAKER_TRITON_GRPC_PORT", "--grpc-port", str),
        ("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "--buffer-manager-thread-count", str),
        ("SAGEMAKER_TRITON_THREAD_COUNT", "--sagemaker-thread-count", str),
        ("SAGEMAKER_TRITON_LOG_INFO", "--log-info", _bool_flag),
        ("SAGEMAKER_TRITON_LOG_WARNING", "--log-warning", _bool_flag),
        ("SAGEMAKER_TRITON_LOG_ERROR", "--log-error", _bool_flag),
    ]
    args.append(f"--allow-grpc={_bool_flag(env.get('SAGEMAKER_TRITON_ALLOW_GRPC', 'false'))}")
    args.append(f"--allow-metrics={_bool_flag(env.get('SAGEMAKER_TRITON_ALLOW_METRICS', 'false'))}")
    for var, flag, convert in optional:
        if env.get(var):
            args.append(f"{flag}={convert(env[var])}")
    # Verbose logging is on unless the environment says otherwise, as in tritonserver's image.
    args.append(f"--log-verbose={_verbose_level(env.get('SAGEMAKER_TRITON_LOG_VERBOSE', 'true'))}")
    shm_default = env.get("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE") or str(16 * 1024 * 1024)
    shm_growth = env.get("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE") or str(1024 * 1024)
    args.append(f"--backend-config=python,shm-default-byte-size={shm_default}")
    args.append(f"--backend-config=python,shm-growth-byte-size={shm_growth}")
    if env.get("SAGEMAKER_TRITON_TENSORFLOW_VERSION"):
        args.append(f"--backend-config=tensorflow,version={env['SAGEMAKER_TRITON_TENSORFLOW_VERSION']}")
    if env.get("SAGEMAKER_TRITON_ADDITIONAL_ARGS"):
        args += shlex.split(env["SAGEMAKER_TRITON_ADDITIONAL_ARGS"])

    if not multi_model:
        if (repo / "config.pbtxt").is_file():
            raise ServeError(
                "ERROR: Incorrect directory structure.\n"
                f"       {repo} holds a config.pbtxt: the model data must contain the model's own folder "
                "(<model>/config.pbtxt), not the folder's contents"
            )
        if not repo.is_dir():
            raise ServeError(f"ERROR: No model found in model repository: {repo} is not a directory")

    inference_type = env.get("SAGEMAKER_TRITON_INFERENCE_TYPE")
    if inference_type is not None and inference_type not in INFERENCE_TYPES:
        raise ServeError(
            f"ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{inference_type}'\n"
            f"       Must be one of: {', '.join(INFERENCE_TYPES)}"
        )

    if not multi_model:
        name = env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "")
        if name:
            if not (repo / name).is_dir():
                raise ServeError(
                    f"ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME {name} does not exist "
                    f"in {repo}"
                )
        else:
            dirs = _model_dirs(repo)
            if not dirs:
                raise ServeError(f"ERROR: No model found in model repository {repo}")
            if len(dirs) > 1:
                raise ServeError(
                    "ERROR: More than 1 model directory found in model repository.\n"
                    "       Keep a single model folder, or set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to the one "
                    "to serve (for an ensemble, the ensemble).\n"
                    f"       Model directories found: {' '.join(dirs)}"
                )
            name = dirs[0]
            _say(
                "WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided.",
                f"         Starting with the only model directory in the repository, {name}",
            )
        settings["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = name
        repo = _repository_for(repo, name)

    return [f"--model-repository={repo}", *args, *extra], settings


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kernel-sagemaker-serve",
        description="Start Kernel as a SageMaker hosting container (reads the SAGEMAKER_* environment).",
    )
    parser.add_argument("command", nargs="?", choices=("serve",), help="SageMaker passes 'serve'; optional")
    parser.add_argument("--model-dir", default=None,
                        help=f"model repository (default {SINGLE_MODEL_REPOSITORY}, "
                             f"or {MULTI_MODEL_REPOSITORY} for multi-model endpoints)")
    ns, extra = parser.parse_known_args(argv)
    try:
        kernel_args, settings = build_command(os.environ, ns.model_dir, extra)
    except ServeError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1
    os.environ.update(settings)
    from kernel.serve import cli

    return cli.main(["serve", *kernel_args])


if __name__ == "__main__":
    sys.exit(main())
