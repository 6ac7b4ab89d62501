"""The committed *_pb2.py / *_pb2.pyi files must be what scripts/gen_protos.py produces now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import ROOT

REPO_ROOT = ROOT


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", REPO_ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_protos_are_fresh(tmp_path: Path):
    pytest.importorskip("grpc_tools")
    gen = _load_generator()
    protos = gen.generate(tmp_path)
    assert "kernel/protos/model_config.proto" in protos
    stale = []
    for proto in protos:
        for suffix in ("_pb2.py", "_pb2.pyi"):
            rel = proto[: -len(".proto")] + suffix
            fresh = (tmp_path / rel).read_bytes()
            committed = REPO_ROOT / rel
            if not committed.exists() or committed.read_bytes() != fresh:
                stale.append(rel)
    assert not stale, f"regenerate with `python scripts/gen_protos.py`: stale {stale}"


def test_model_config_module_is_importable():
    from kernel.protos import model_config_pb2

    assert model_config_pb2.DESCRIPTOR.package == "inference"
    assert model_config_pb2.DESCRIPTOR.name == "kernel/protos/model_config.proto"
    fields = model_config_pb2.ModelConfig.DESCRIPTOR.fields_by_name
    # A few of Triton's field numbers, as a tripwire against accidental edits.
    assert (fields["name"].number, fields["backend"].number, fields["runtime"].number) == (1, 17, 25)
    assert (fields["dynamic_batching"].number, fields["model_metrics"].number) == (11, 26)


def test_coexists_with_tritonclient_protos():
    """tritonclient registers the same inference.* names; both must import in one process."""
    tc = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from kernel.protos import model_config_pb2

    ours = model_config_pb2.ModelConfig(name="m", max_batch_size=4)
    theirs = tc.ModelConfig.FromString(ours.SerializeToString())
    assert (theirs.name, theirs.max_batch_size) == ("m", 4)
