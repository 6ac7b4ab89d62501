"""What a model sees of its own process, compared with what Triton 2.51's stub shows.

The probe model (tests/models/model_process/probe) records initialize(args),
sys.argv, sys.path, the environment and its module names; the expected values
were read from real tritonserver 2.51 serving the same repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TEST_MODELS, KernelProcess, running

PROBE = TEST_MODELS / "model_process" / "probe"

# Triton 2.51's args["model_config"] for the probe's config.pbtxt (model "probe"), verbatim.
TRITON_PROBE_CONFIG = (
    '{"name":"probe","platform":"","backend":"python","runtime":"","version_policy":{"latest":{"num_versions":1}},'
    '"max_batch_size":0,"input":[{"name":"IN","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[1],'
    '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],'
    '"output":[{"name":"REPORT","data_type":"TYPE_STRING","dims":[1],"label_filename":"","is_shape_tensor":false,'
    '"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[],"optimization":{"priority":'
    '"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
    '"gather_kernel_buffer_threshold":0,"eager_batching":false},"instance_group":[{"name":"probe_0","kind":'
    '"KIND_CPU","count":2,"gpus":[],"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],'
    '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},"model_warmup":[]}'
)

IO = (
    'input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]\n'
    'output [{ name: "REPORT" data_type: TYPE_STRING dims: [1] }]\n'
)
VARIANTS = {
    # model name: (config.pbtxt, version folder)
    "probe": (None, "1"),
    "probe_noig": ('backend: "python"\n' + IO, "1"),
    "probe_kind_model": ('backend: "python"\n' + IO + "instance_group [{ kind: KIND_MODEL }]\n", "1"),
    "probe_named": ('backend: "python"\n' + IO + 'instance_group [{ name: "myinst" kind: KIND_CPU count: 1 }]\n', "1"),
    "probe_ver": ('backend: "python"\n' + IO, "3"),
}


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """Serve every variant once; returns (repository, {instance name: report})."""
    repo = tmp_path_factory.mktemp("repo")
    out = tmp_path_factory.mktemp("reports")
    for name, (config, version) in VARIANTS.items():
        target = repo / name
        shutil.copytree(PROBE, target, ignore=shutil.ignore_patterns("__pycache__"))
        if config is not None:
            (target / "config.pbtxt").write_text(config)
        if version != "1":
            (target / "1").rename(target / version)
    k = KernelProcess([repo], env={"PROBE_OUT": str(out)})
    gen = running(k)
    next(gen)
    try:
        yield repo, {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    finally:
        gen.close()


@pytest.mark.parametrize(
    "instance, model, kind, version",
    [
        ("probe_0_0", "probe", "CPU", "1"),
        ("probe_0_1", "probe", "CPU", "1"),
        ("probe_noig_0", "probe_noig", "CPU", "1"),
        ("probe_kind_model_0_0", "probe_kind_model", "MODEL", "1"),
        ("myinst_0", "probe_named", "CPU", "1"),
        ("probe_ver_0", "probe_ver", "CPU", "3"),
    ],
)
def test_initialize_args_are_tritons(probed, instance, model, kind, version):
    repo, reports = probed
    report = reports[instance]
    args = report["args"]
    assert report["arg_keys"] == [
        "model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
        "model_repository", "model_version", "model_name",
    ]
    assert report["arg_types"] == ["str"]
    assert args["model_instance_kind"] == kind
    assert args["model_instance_name"] == instance
    assert args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(repo / model)  # the model's folder, not the repository's
    assert args["model_version"] == version
    assert args["model_name"] == model
    assert json.loads(args["model_config"])["name"] == model


def test_model_config_arg_is_tritons_json_verbatim(probed):
    _, reports = probed
    assert reports["probe_0_0"]["args"]["model_config"] == TRITON_PROBE_CONFIG


def test_model_sees_an_embedded_interpreters_argv(probed):
    _, reports = probed
    report = reports["probe_0_0"]
    assert report["argv"] == [""]
    assert report["import_args"] == {}  # argparse at import did not exit with status 2
    assert report["self_test"] == [1, True]  # unittest.main() in initialize ran the model's own test


def test_model_sees_no_worker_path_entries_or_variables(probed):
    repo, reports = probed
    report = reports["probe_0_0"]
    plain = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    # A plain interpreter's path, then the version folder and the model folder (Triton's order).
    assert report["path"] == plain + [str(repo / "probe" / "1"), str(repo / "probe")]
    assert report["cwd"] == str(ROOT)  # the server's own working directory, as under Triton
    # Exactly the server's environment: nothing of Kernel's own added.
    assert set(report["env"]) == set(os.environ) | {"PROBE_OUT"}


def test_version_folder_is_a_package_as_in_triton(probed):
    repo, reports = probed
    for instance, version in (("probe_0_0", "1"), ("probe_ver_0", "3")):
        report = reports[instance]
        assert report["name"] == f"{version}.model"
        assert report["package"] == version
        assert report["module_keys"] == [f"{version}.model"]
        assert report["helpers"] == {"name": f"{version}.helpers", "package": version}  # from .helpers import
        assert report["version_folder_helpers"] == "helpers"  # import helpers
        assert report["top"] == "model folder"  # import top (next to config.pbtxt)
    assert reports["probe_ver_0"]["model_dir"] == str(repo / "probe_ver" / "3")
