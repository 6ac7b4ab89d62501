"""Model repository layout, config loading and version selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.config import pbtxt as mc
from conftest import TESTS
from kernel.core.errors import ErrorCode, KernelError
from kernel.loading.repository import (
    ModelDir,
    load_model_config,
    parse_version,
    scan_model_dir,
    scan_repository,
    select_versions,
)


def _add_sub_triton_json() -> str:
    """The observed Triton JSON, kept once in test_model_config.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_observed", TESTS / "config" / "test_model_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ADD_SUB_TRITON_JSON


def _touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    # add_sub: config + versions 1, 2, 10, plus folders that are not versions.
    _touch(tmp_path / "add_sub" / "config.pbtxt", 'name: "add_sub"\nbackend: "python"\n')
    for v in ("1", "2", "10"):
        _touch(tmp_path / "add_sub" / v / "model.py")
    for not_version in ("07", "abc", ".ipynb_checkpoints", "warmup", "configs", "-1"):
        (tmp_path / "add_sub" / not_version).mkdir()
    _touch(tmp_path / "add_sub" / "3")  # a file, not a folder
    # auto: no config.pbtxt at all
    _touch(tmp_path / "auto" / "1" / "model.py")
    # empty model folder, hidden folder, stray file
    (tmp_path / "empty").mkdir()
    (tmp_path / ".hidden_model" / "1").mkdir(parents=True)
    _touch(tmp_path / "README.md", "not a model")
    return tmp_path


def test_scan_repository_finds_models_and_versions(repo: Path):
    models = scan_repository(repo)
    assert [m.name for m in models] == ["add_sub", "auto", "empty"]
    add_sub, auto, empty = models
    assert add_sub.path == repo / "add_sub"
    assert add_sub.config_path == repo / "add_sub" / "config.pbtxt"
    assert add_sub.versions == {1: repo / "add_sub" / "1", 2: repo / "add_sub" / "2", 10: repo / "add_sub" / "10"}
    assert auto.config_path is None and list(auto.versions) == [1]
    assert empty.versions == {} and empty.config_path is None


def test_custom_config_name(repo: Path):
    custom = _touch(repo / "add_sub" / "configs" / "h100.pbtxt", 'name: "add_sub"\nmax_batch_size: 8\n')
    assert scan_model_dir(repo / "add_sub", "h100").config_path == custom
    # Falls back to config.pbtxt when the named file is absent.
    assert scan_model_dir(repo / "add_sub", "a100").config_path == repo / "add_sub" / "config.pbtxt"
    assert load_model_config(scan_model_dir(repo / "add_sub", "h100")).max_batch_size == 8


def test_missing_repository_is_an_error(tmp_path: Path):
    with pytest.raises(KernelError) as info:
        scan_repository(tmp_path / "nope")
    assert info.value.code is ErrorCode.INVALID_ARG


@pytest.mark.parametrize(
    "name, version",
    [("1", 1), ("0", 0), ("42", 42), ("007", None), ("01", None), ("-1", None), ("1a", None), ("", None), ("١", None)],
)
def test_parse_version(name: str, version: int | None):
    assert parse_version(name) == version


def test_load_model_config(repo: Path):
    add_sub, auto, _ = scan_repository(repo)
    cfg = load_model_config(add_sub)
    assert (cfg.name, cfg.backend) == ("add_sub", "python")
    # No file: an empty config that auto-complete fills in.
    assert load_model_config(auto) == mc.ModelConfig()


def test_load_broken_config_names_the_file(tmp_path: Path):
    path = _touch(tmp_path / "broken" / "config.pbtxt", "name: 'broken'\nmax_batch_size: many\n")
    model = ModelDir(name="broken", path=tmp_path / "broken", config_path=path, versions={})
    with pytest.raises(KernelError) as info:
        load_model_config(model)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert str(path) in info.value.message and "max_batch_size" in info.value.message


def _cfg(policy: str = "") -> mc.ModelConfig:
    cfg = mc.parse_config_text(f'name: "m"\nbackend: "python"\n{policy}', "m")
    mc.normalize_config(cfg, "m")
    return cfg


@pytest.mark.parametrize(
    "policy, available, expected",
    [
        ("", [1, 2, 10], [10]),  # default: latest 1, by number not by name
        ("version_policy { latest { num_versions: 2 } }", [3, 1, 2], [2, 3]),
        ("version_policy { latest { num_versions: 5 } }", [1, 2], [1, 2]),
        ("version_policy { all { } }", [2, 1, 7], [1, 2, 7]),
        ("version_policy { specific { versions: [1, 3] } }", [1, 2, 3], [1, 3]),
        # A listed version without a folder is skipped (Triton logs it and loads the rest).
        ("version_policy { specific { versions: [1, 3, 9] } }", [1, 2, 3], [1, 3]),
        ("", [0], [0]),
    ],
)
def test_select_versions(policy: str, available: list[int], expected: list[int]):
    assert select_versions(_cfg(policy), available) == expected


@pytest.mark.parametrize(
    "policy, available",
    [
        ("", []),
        ("version_policy { specific { versions: [5] } }", [1, 2]),
        ("version_policy { latest { num_versions: 0 } }", [1]),
    ],
)
def test_select_versions_none_available(policy: str, available: list[int]):
    with pytest.raises(KernelError) as info:
        select_versions(_cfg(policy), available)
    assert info.value.code is ErrorCode.INVALID_ARG
    # Triton 2.51.0's message, observed.
    assert info.value.message == "at least one version must be available under the version policy of model 'm'"


def test_repository_to_triton_json(repo: Path):
    """The whole path from folder to the JSON Triton would serve."""
    _touch(
        repo / "add_sub" / "config.pbtxt",
        'name: "add_sub"\nbackend: "python"\n'
        'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [4] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [4] }]\n'
        'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [4] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [4] }]\n'
        "instance_group [{ kind: KIND_CPU }]\n",
    )
    model = scan_model_dir(repo / "add_sub")
    cfg = load_model_config(model)
    mc.normalize_config(cfg, model.name, model_path=model.path)
    mc.validate_config(cfg)
    assert mc.config_to_json(cfg) == _add_sub_triton_json()
    assert select_versions(cfg, sorted(model.versions)) == [10]
