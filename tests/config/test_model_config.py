"""config.pbtxt parsing, Triton-identical JSON rendering, normalisation and validation.

The expected JSON documents below were observed from real Triton 2.51.0 (the
tritonserver bundled with nvidia-pytriton 0.7.0, Python backend, no GPU) by
serving each config next to a copy of the add_sub example model.py and reading
GET /v2/models/<model>/config.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.config import pbtxt as mc
from kernel.core.errors import ErrorCode, KernelError
from kernel.protos.model_config_pb2 import ModelConfig, ModelInstanceGroup

# --------------------------------------------------------------------------- fixtures

# Same content as python_backend's examples/add_sub/config.pbtxt, laid out differently.
ADD_SUB_PBTXT = """
name: "add_sub"
backend: "python"
input { name: "INPUT0"  data_type: TYPE_FP32  dims: 4 }
input { name: "INPUT1"  data_type: TYPE_FP32  dims: 4 }
output { name: "OUTPUT0"  data_type: TYPE_FP32  dims: 4 }
output { name: "OUTPUT1"  data_type: TYPE_FP32  dims: 4 }
instance_group { kind: KIND_CPU }
"""

# Observed from Triton 2.51.0: GET /v2/models/add_sub/config (byte-for-byte).
ADD_SUB_TRITON_JSON = (
    '{"name":"add_sub","platform":"","backend":"python","runtime":"",'
    '"version_policy":{"latest":{"num_versions":1}},"max_batch_size":0,'
    '"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],'
    '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false},'
    '{"name":"INPUT1","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],'
    '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],'
    '"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4],"label_filename":"",'
    '"is_shape_tensor":false,"is_non_linear_format_io":false},'
    '{"name":"OUTPUT1","data_type":"TYPE_FP32","dims":[4],"label_filename":"",'
    '"is_shape_tensor":false,"is_non_linear_format_io":false}],'
    '"batch_input":[],"batch_output":[],'
    '"optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},'
    '"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},'
    '"instance_group":[{"name":"add_sub_0","kind":"KIND_CPU","count":1,"gpus":[],"secondary_devices":[],'
    '"profile":[],"passive":false,"host_policy":""}],'
    '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},'
    '"model_warmup":[]}'
)

_FOUR_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

_IO_JSON = (
    '"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],"is_shape_tensor":false,'
    '"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false},{"name":"INPUT1",'
    '"data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],"is_shape_tensor":false,"allow_ragged_batch":false,'
    '"optional":false,"is_non_linear_format_io":false}],"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32",'
    '"dims":[4],"label_filename":"","is_shape_tensor":false,"is_non_linear_format_io":false},{"name":"OUTPUT1",'
    '"data_type":"TYPE_FP32","dims":[4],"label_filename":"","is_shape_tensor":false,'
    '"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[]'
)
_TAIL_JSON = '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},"model_warmup":[]'
_OPT_DEFAULT_JSON = (
    '"optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},'
    '"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false}'
)


def _group_json(name: str, count: int = 1) -> str:
    return (
        f'{{"name":"{name}","kind":"KIND_CPU","count":{count},"gpus":[],"secondary_devices":[],'
        '"profile":[],"passive":false,"host_policy":""}'
    )


# No name, no instance_group, an empty dynamic_batching block.
BATCHING_PBTXT = 'backend: "python"\nmax_batch_size: 8\ndynamic_batching { }\n' + _FOUR_IO
# Observed from Triton 2.51.0 for BATCHING_PBTXT in folder "probe_min": the default
# group is named after the model (no "_0"), preferred_batch_size becomes [max_batch_size].
BATCHING_TRITON_JSON = (
    '{"name":"probe_min","platform":"","backend":"python","runtime":"",'
    '"version_policy":{"latest":{"num_versions":1}},"max_batch_size":8,' + _IO_JSON + "," + _OPT_DEFAULT_JSON + ","
    '"dynamic_batching":{"preferred_batch_size":[8],"max_queue_delay_microseconds":0,"preserve_ordering":false,'
    '"priority_levels":0,"default_priority_level":0,"priority_queue_policy":{}},'
    '"instance_group":[' + _group_json("probe_min") + "]," + _TAIL_JSON + "}"
)

RICH_PBTXT = """
name: "probe_rich"
backend: "python"
max_batch_size: 16
version_policy: { specific: { versions: [1, 3, 9] } }
input { name: "INPUT0" data_type: TYPE_FP32 dims: [4] reshape { shape: [4] } }
input { name: "INPUT1" data_type: TYPE_FP32 dims: [-1] optional: false }
input { name: "TEXT" data_type: TYPE_STRING dims: [1] optional: true }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] label_filename: "" }
output { name: "OUTPUT1" data_type: TYPE_FP32 dims: [4] }
dynamic_batching {
  preferred_batch_size: [4, 8]
  max_queue_delay_microseconds: 100
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true max_queue_size: 7
  }
  priority_queue_policy { key: 3 value { max_queue_size: 2 default_timeout_microseconds: 11 } }
  priority_queue_policy { key: 1 value { max_queue_size: 1 } }
}
instance_group { count: 2 kind: KIND_CPU }
instance_group { name: "named" kind: KIND_AUTO }
parameters { key: "zeta" value { string_value: "z" } }
parameters { key: "alpha" value { string_value: "a" } }
parameters { key: "mid" value { string_value: "m" } }
metric_tags { key: "b" value: "2" }
metric_tags { key: "a" value: "1" }
model_warmup {
  name: "w" batch_size: 1 count: 1
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [4] zero_data: true } }
  inputs { key: "INPUT1" value { data_type: TYPE_FP32 dims: [4] zero_data: true } }
}
optimization {
  priority: PRIORITY_MAX
  cuda { graphs: false graph_spec { batch_size: 2 input { key: "INPUT0" value { dim: [4] } } } }
}
response_cache { enable: false }
"""
# Observed from Triton 2.51.0 for RICH_PBTXT (compared as a dict: Triton's map
# key order is protobuf's hash order). Note the int64 fields Triton leaves as
# strings: graph_spec dims here.
RICH_TRITON = json.loads(
    '{"name":"probe_rich","platform":"","backend":"python","runtime":"",'
    '"version_policy":{"specific":{"versions":[1,3,9]}},"max_batch_size":16,'
    '"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],"reshape":{"shape":[4]},'
    '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false},'
    '{"name":"INPUT1","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[-1],"is_shape_tensor":false,'
    '"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false},{"name":"TEXT",'
    '"data_type":"TYPE_STRING","format":"FORMAT_NONE","dims":[1],"is_shape_tensor":false,"allow_ragged_batch":false,'
    '"optional":true,"is_non_linear_format_io":false}],"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32",'
    '"dims":[4],"label_filename":"","is_shape_tensor":false,"is_non_linear_format_io":false},{"name":"OUTPUT1",'
    '"data_type":"TYPE_FP32","dims":[4],"label_filename":"","is_shape_tensor":false,"is_non_linear_format_io":false}],'
    '"batch_input":[],"batch_output":[],"optimization":{"priority":"PRIORITY_MAX","cuda":{"graphs":false,'
    '"busy_wait_events":false,"graph_spec":[{"batch_size":2,"input":{"INPUT0":{"dim":["4"]}}}],'
    '"output_copy_stream":false},"input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
    '"gather_kernel_buffer_threshold":0,"eager_batching":false},"dynamic_batching":{"preferred_batch_size":[4,8],'
    '"max_queue_delay_microseconds":100,"preserve_ordering":false,"priority_levels":3,"default_priority_level":2,'
    '"default_queue_policy":{"timeout_action":"DELAY","default_timeout_microseconds":5000,'
    '"allow_timeout_override":true,"max_queue_size":7},"priority_queue_policy":{"1":{"timeout_action":"REJECT",'
    '"default_timeout_microseconds":0,"allow_timeout_override":false,"max_queue_size":1},"3":{"timeout_action":'
    '"REJECT","default_timeout_microseconds":11,"allow_timeout_override":false,"max_queue_size":2}}},'
    '"instance_group":[{"name":"probe_rich_0","kind":"KIND_CPU","count":2,"gpus":[],"secondary_devices":[],'
    '"profile":[],"passive":false,"host_policy":""},{"name":"named","kind":"KIND_CPU","count":1,"gpus":[],'
    '"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],"default_model_filename":"model.py",'
    '"cc_model_filenames":{},"metric_tags":{"b":"2","a":"1"},"parameters":{"mid":{"string_value":"m"},'
    '"zeta":{"string_value":"z"},"alpha":{"string_value":"a"}},"model_warmup":[{"name":"w","batch_size":1,'
    '"inputs":{"INPUT0":{"data_type":"TYPE_FP32","dims":[4],"zero_data":true},"INPUT1":{"data_type":"TYPE_FP32",'
    '"dims":[4],"zero_data":true}},"count":1}],"response_cache":{"enable":false}}'
)

SEQUENCE_PBTXT = (
    'backend: "python"\nmax_batch_size: 2\n' + _FOUR_IO + """
sequence_batching {
  direct { max_queue_delay_microseconds: 10 minimum_slot_utilization: 0.5 }
  control_input { name: "START" control { kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] } }
}
model_transaction_policy { decoupled: false }
version_policy { all { } }
"""
)
# Observed from Triton 2.51.0 (folder "probe_seq"): floats print without ".0",
# the idle timeout defaults to 1 s.
SEQUENCE_TRITON_JSON = (
    '{"name":"probe_seq","platform":"","backend":"python","runtime":"","version_policy":{"all":{}},'
    '"max_batch_size":2,' + _IO_JSON + "," + _OPT_DEFAULT_JSON + ","
    '"sequence_batching":{"direct":{"max_queue_delay_microseconds":10,"minimum_slot_utilization":0.5},'
    '"max_sequence_idle_microseconds":1000000,"control_input":[{"name":"START","control":[{"kind":'
    '"CONTROL_SEQUENCE_START","int32_false_true":[],"fp32_false_true":[0,1],"bool_false_true":[],'
    '"data_type":"TYPE_INVALID"}]}],"state":[],"iterative_sequence":false},'
    '"instance_group":[' + _group_json("probe_seq") + "]," + _TAIL_JSON + ","
    '"model_transaction_policy":{"decoupled":false}}'
)

STATE_PBTXT = (
    'backend: "python"\nmax_batch_size: 2\n' + _FOUR_IO + """
sequence_batching {
  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 7 }
  state {
    input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_INT32 dims: [1]
    initial_state { name: "init" data_type: TYPE_INT32 dims: [1] zero_data: true }
  }
}
optimization { cuda { graph_spec { batch_size: 1 graph_lower_bound { batch_size: 1 input { key: "INPUT0" value { dim: [2] } } } } } }
instance_group { kind: KIND_CPU count: 1 }
"""
)
# Observed from Triton 2.51.0 (folder "probe_state"): initial_state dims and the
# graph bounds stay strings, and the oneof member "zero_data" prints after "name".
STATE_TRITON_JSON = (
    '{"name":"probe_state","platform":"","backend":"python","runtime":"",'
    '"version_policy":{"latest":{"num_versions":1}},"max_batch_size":2,' + _IO_JSON + ","
    '"optimization":{"priority":"PRIORITY_DEFAULT","cuda":{"graphs":false,"busy_wait_events":false,'
    '"graph_spec":[{"batch_size":1,"input":{},"graph_lower_bound":{"batch_size":1,"input":{"INPUT0":'
    '{"dim":["2"]}}}}],"output_copy_stream":false},"input_pinned_memory":{"enable":true},'
    '"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},'
    '"sequence_batching":{"oldest":{"max_candidate_sequences":4,"preferred_batch_size":[2],'
    '"max_queue_delay_microseconds":7,"preserve_ordering":false},"max_sequence_idle_microseconds":1000000,'
    '"control_input":[],"state":[{"input_name":"IN_STATE","output_name":"OUT_STATE","data_type":"TYPE_INT32",'
    '"dims":[1],"initial_state":[{"data_type":"TYPE_INT32","dims":["1"],"name":"init","zero_data":true}],'
    '"use_same_buffer_for_input_output":false,"use_growable_memory":false}],"iterative_sequence":false},'
    '"instance_group":[' + _group_json("probe_state_0") + "]," + _TAIL_JSON + "}"
)

# Observed from Triton 2.51.0 for a folder "probe_auto" with no config.pbtxt whose
# model.py auto_complete_config adds the four tensors, set_max_batch_size(4)
# and set_dynamic_batching().
AUTO_TRITON_JSON = (
    '{"name":"probe_auto","platform":"","backend":"python","runtime":"",'
    '"version_policy":{"latest":{"num_versions":1}},"max_batch_size":4,' + _IO_JSON + "," + _OPT_DEFAULT_JSON + ","
    '"dynamic_batching":{"preferred_batch_size":[4],"max_queue_delay_microseconds":0,"preserve_ordering":false,'
    '"priority_levels":0,"default_priority_level":0,"priority_queue_policy":{}},'
    '"instance_group":[' + _group_json("probe_auto") + "]," + _TAIL_JSON + "}"
)


def _normalized(text: str, model: str, **kwargs) -> ModelConfig:
    cfg = mc.parse_config_text(text, f"{model}/config.pbtxt")
    mc.normalize_config(cfg, model, **kwargs)
    mc.validate_config(cfg)
    return cfg


def _python_model_dir(tmp_path: Path, name: str) -> Path:
    (tmp_path / name / "1").mkdir(parents=True)
    (tmp_path / name / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    return tmp_path / name


def _raises(fn, *args, **kwargs) -> KernelError:
    with pytest.raises(KernelError) as info:
        fn(*args, **kwargs)
    return info.value


# --------------------------------------------------------------------------- rendering equals Triton


def test_add_sub_json_is_byte_identical_to_triton():
    cfg = _normalized(ADD_SUB_PBTXT, "add_sub")
    assert mc.config_to_json(cfg) == ADD_SUB_TRITON_JSON
    assert mc.config_to_dict(cfg) == json.loads(ADD_SUB_TRITON_JSON)


def test_dynamic_batching_defaults_match_triton():
    cfg = _normalized(BATCHING_PBTXT, "probe_min")
    assert mc.config_to_json(cfg) == BATCHING_TRITON_JSON


def test_rich_config_matches_triton():
    cfg = _normalized(RICH_PBTXT, "probe_rich")
    assert mc.config_to_dict(cfg) == RICH_TRITON
    # Everything but map key order is byte-identical; our maps are sorted.
    assert list(mc.config_to_dict(cfg)["parameters"]) == ["alpha", "mid", "zeta"]


def test_sequence_batching_floats_and_defaults_match_triton():
    cfg = _normalized(SEQUENCE_PBTXT, "probe_seq")
    assert mc.config_to_json(cfg) == SEQUENCE_TRITON_JSON


def test_int64_quirks_and_oneof_order_match_triton():
    cfg = _normalized(STATE_PBTXT, "probe_state")
    assert mc.config_to_json(cfg) == STATE_TRITON_JSON


def test_autocomplete_flow_matches_triton(tmp_path):
    model_dir = _python_model_dir(tmp_path, "probe_auto")
    cfg = ModelConfig()  # no config.pbtxt
    mc.normalize_config(cfg, "probe_auto", model_path=model_dir)
    mc.validate_config(cfg, check_io=False)
    # What the model's auto_complete_config hands back (pb_utils works on this dict).
    returned = json.loads(mc.config_to_json(cfg))
    returned["max_batch_size"] = 4
    returned["dynamic_batching"] = {}
    returned["input"] = [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0", "INPUT1")]
    returned["output"] = [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("OUTPUT0", "OUTPUT1")]
    mc.apply_autocomplete(cfg, mc.config_from_dict(returned))
    mc.normalize_config(cfg, "probe_auto", model_path=model_dir)
    mc.validate_config(cfg)
    assert mc.config_to_json(cfg) == AUTO_TRITON_JSON
    # Replacing the config wholesale with the returned dict gives the same result here.
    replaced = mc.config_from_dict(returned)
    mc.normalize_config(replaced, "probe_auto")
    assert mc.config_to_json(replaced) == AUTO_TRITON_JSON


def test_ensemble_rendering_fixes_model_version():
    cfg = mc.parse_config_text(
        """
        platform: "ensemble"
        max_batch_size: 8
        input { name: "A" data_type: TYPE_FP32 dims: [4] }
        input { name: "B" data_type: TYPE_FP32 dims: [4] }
        output { name: "C" data_type: TYPE_FP32 dims: [4] }
        ensemble_scheduling { step {
          model_name: "probe_min" model_version: -1
          input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
          output_map { key: "OUTPUT0" value: "C" }
        } }
        """,
        "ens",
    )
    mc.normalize_config(cfg, "probe_ens")
    mc.validate_config(cfg)
    d = mc.config_to_dict(cfg)
    # As Triton: no optimization, no instance groups, no default filename.
    assert "optimization" not in d
    assert d["instance_group"] == [] and d["default_model_filename"] == "" and d["backend"] == ""
    assert d["ensemble_scheduling"]["step"][0]["model_version"] == -1
    assert d["ensemble_scheduling"]["step"][0]["input_map"] == {"INPUT0": "A", "INPUT1": "B"}


def test_unfixed_int64_fields_stay_strings():
    cfg = ModelConfig(name="m", backend="python")
    group = cfg.instance_group.add(kind=ModelInstanceGroup.KIND_CPU)
    group.secondary_devices.add(device_id=3)
    cfg.dynamic_batching.priority_queue_policy[2].max_queue_size = 1
    d = mc.config_to_dict(cfg)
    assert d["instance_group"][0]["secondary_devices"] == [{"kind": "KIND_NVDLA", "device_id": "3"}]
    assert list(d["dynamic_batching"]["priority_queue_policy"]) == ["2"]


def test_empty_config_renders_as_empty_object():
    assert mc.config_to_dict(ModelConfig()) == {}
    assert mc.config_to_json(ModelConfig()) == "{}"


def test_float_rendering_is_shortest():
    cfg = ModelConfig(name="m")
    cfg.sequence_batching.direct.minimum_slot_utilization = 0.1
    assert mc.config_to_dict(cfg)["sequence_batching"]["direct"]["minimum_slot_utilization"] == 0.1


# --------------------------------------------------------------------------- parsing


def test_parse_error_names_file_and_problem():
    err = _raises(mc.parse_config_text, 'name: "x"\ninput { data_type: TYPE_FOO }', "/repo/x/config.pbtxt")
    assert err.code is ErrorCode.INVALID_ARG
    assert "/repo/x/config.pbtxt" in err.message and "TYPE_FOO" in err.message


def test_parse_unknown_field_is_an_error():
    err = _raises(mc.parse_config_text, "max_batch: 3", "cfg.pbtxt")
    assert "max_batch" in err.message


def test_config_from_dict_round_trip():
    cfg = _normalized(RICH_PBTXT, "probe_rich")
    assert mc.config_from_dict(mc.config_to_dict(cfg)) == cfg
    assert mc.config_from_json(mc.config_to_json(cfg)) == cfg


def test_config_from_dict_accepts_strings_ints_and_lowercase_enums():
    cfg = mc.config_from_dict(
        {
            "name": "m",
            "max_batch_size": 4,
            "input": [{"name": "X", "data_type": "type_string", "dims": ["-1", 3]}],
            "instance_group": [{"kind": "kind_cpu", "count": 2}],
            "dynamic_batching": {"max_queue_delay_microseconds": "100", "priority_queue_policy": {"1": {}}},
        }
    )
    assert list(cfg.input[0].dims) == [-1, 3]
    assert cfg.input[0].data_type == mc.DataType.TYPE_STRING
    assert cfg.instance_group[0].kind == ModelInstanceGroup.KIND_CPU
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"max_batch_size": "lots"}, "max_batch_size"),
        ({"bogus_field": 1}, "bogus_field"),
        ({"input": [{"name": "X", "data_type": "TYPE_NOPE"}]}, "data_type"),
    ],
)
def test_config_from_dict_errors_name_the_field(data, needle):
    err = _raises(mc.config_from_dict, data)
    assert err.code is ErrorCode.INVALID_ARG
    assert needle in err.message


# --------------------------------------------------------------------------- normalisation


def test_normalize_is_idempotent():
    cfg = _normalized(RICH_PBTXT, "probe_rich")
    again = ModelConfig()
    again.CopyFrom(cfg)
    mc.normalize_config(again, "probe_rich")
    assert again == cfg


def test_name_must_match_folder():
    cfg = mc.parse_config_text('name: "other"\nbackend: "python"', "x")
    err = _raises(mc.normalize_config, cfg, "bad_name")
    # Triton 2.51.0's message for this case, observed.
    assert err.message == (
        "unexpected directory name 'bad_name' for model 'other', directory name must equal model name"
    )


def test_backend_detected_from_model_py(tmp_path):
    model_dir = _python_model_dir(tmp_path, "m")
    cfg = ModelConfig()
    mc.normalize_config(cfg, "m", model_path=model_dir)
    assert (cfg.name, cfg.backend, cfg.default_model_filename) == ("m", "python", "model.py")


def test_no_backend_and_no_model_py_is_an_error(tmp_path):
    (tmp_path / "nopy" / "1").mkdir(parents=True)
    err = _raises(mc.normalize_config, ModelConfig(), "nopy", model_path=tmp_path / "nopy")
    # Triton 2.51.0's message for this case, observed.
    assert err.message == (
        "Invalid model name: Could not determine backend for model 'nopy' with no backend in model "
        "configuration. Expected model name of the form 'model.<backend_name>'."
    )


def test_instance_groups_cpu_only():
    cfg = mc.parse_config_text(
        'backend: "python"\ninstance_group [{ count: 2 }, { kind: KIND_AUTO }, { name: "g", kind: KIND_CPU }]', "x"
    )
    mc.normalize_config(cfg, "m")
    got = [(g.name, ModelInstanceGroup.Kind.Name(g.kind), g.count, list(g.gpus)) for g in cfg.instance_group]
    assert got == [("m_0", "KIND_CPU", 2, []), ("m_1", "KIND_CPU", 1, []), ("g", "KIND_CPU", 1, [])]


def test_instance_groups_with_gpus():
    cfg = mc.parse_config_text('backend: "python"', "x")
    mc.normalize_config(cfg, "m", gpus=[0, 1])
    (group,) = cfg.instance_group
    assert (group.name, group.kind, group.count, list(group.gpus)) == ("m", ModelInstanceGroup.KIND_GPU, 1, [0, 1])
    cfg = mc.parse_config_text('backend: "python"\ninstance_group { kind: KIND_AUTO gpus: [3] }', "x")
    mc.normalize_config(cfg, "m", gpus=[0, 1])
    assert cfg.instance_group[0].kind == ModelInstanceGroup.KIND_CPU  # GPU 3 is not there


def test_default_max_batch_size_not_applied_to_python_models():
    cfg = _normalized(ADD_SUB_PBTXT, "add_sub")
    mc.apply_default_max_batch_size(cfg, 4)
    assert mc.config_to_json(cfg) == ADD_SUB_TRITON_JSON


def test_default_max_batch_size_for_a_batching_capable_autocomplete():
    cfg = mc.parse_config_text('backend: "python"\n' + _FOUR_IO, "x")
    mc.normalize_config(cfg, "m", default_max_batch_size=6, autocomplete_supports_batching=True)
    assert cfg.max_batch_size == 6
    assert list(cfg.dynamic_batching.preferred_batch_size) == [6]
    # An explicit max_batch_size is kept, and an existing scheduler is not replaced.
    cfg = mc.parse_config_text('max_batch_size: 2\nsequence_batching { }', "x")
    mc.apply_default_max_batch_size(cfg, 6, supports_batching=True)
    assert cfg.max_batch_size == 2 and cfg.WhichOneof("scheduling_choice") == "sequence_batching"
    # A default of 1 gives max_batch_size 1 and no dynamic batcher.
    cfg = ModelConfig()
    mc.apply_default_max_batch_size(cfg, 1, supports_batching=True)
    assert cfg.max_batch_size == 1 and cfg.WhichOneof("scheduling_choice") is None


def test_default_max_batch_size_rejects_batching_for_unbatchable_model():
    cfg = ModelConfig(name="m", max_batch_size=4)
    err = _raises(mc.apply_default_max_batch_size, cfg, 4, supports_batching=False)
    assert "does not support batching" in err.message


def test_apply_autocomplete_takes_only_what_triton_takes():
    cfg = _normalized(SEQUENCE_PBTXT, "probe_seq")
    completed = ModelConfig()
    completed.CopyFrom(cfg)
    completed.max_batch_size = 8
    completed.parameters["ignored"].string_value = "x"
    completed.model_transaction_policy.decoupled = True
    mc.apply_autocomplete(cfg, completed)
    assert cfg.max_batch_size == 8 and cfg.model_transaction_policy.decoupled
    assert "ignored" not in cfg.parameters
    completed.dynamic_batching.SetInParent()
    err = _raises(mc.apply_autocomplete, cfg, completed)
    assert err.code is ErrorCode.INTERNAL


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "text, message",
    [
        # Messages observed from Triton 2.51.0.
        ('backend: "python"\nmax_batch_size: -1\n' + _FOUR_IO, "'max_batch_size' must be non-negative value for m"),
        (
            'backend: "python"\nmax_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }\n' + _FOUR_IO,
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            'backend: "python"\ninstance_group { kind: KIND_GPU }\n' + _FOUR_IO,
            "instance group m_0 of model m has kind KIND_GPU but no GPUs are available",
        ),
        # Messages following Triton's validation code.
        (
            'backend: "python"\ninput { name: "X" data_type: TYPE_FP32 dims: [0] }',
            "model input 'X' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m",
        ),
        ('backend: "python"\ninput { name: "X" dims: [1] }', "model input 'X' must specify 'data_type' for m"),
        ('backend: "python"\noutput { name: "Y" data_type: TYPE_FP32 }', "model output 'Y' must specify 'dims' for m"),
        ('backend: "python"\ninput { data_type: TYPE_FP32 dims: [1] }', "model input must specify 'name' for m"),
        (
            'backend: "python"\ninput { name: "X" data_type: TYPE_FP32 dims: [4] reshape { shape: [3] } }',
            "model input 'X' has different size for dims and reshape for m",
        ),
        (
            'backend: "python"\ninput { name: "X" data_type: TYPE_FP32 dims: [2, -1] reshape { shape: [-1, 2] } }',
            "model input 'X' has different size for dims and reshape for m",
        ),
        (
            'backend: "python"\ninput { name: "X" data_type: TYPE_FP32 dims: [1] }\n'
            'input { name: "X" data_type: TYPE_FP32 dims: [1] }',
            "model input 'X' is specified more than once for m",
        ),
        ('backend: "python"\ninput { name: "X" data_type: 99 dims: [1] }', "model input 'X' has unknown data type 99 for m"),
        (
            'backend: "python"\nmax_batch_size: 2\ndynamic_batching { priority_levels: 2 }',
            "default priority level must be in range [1, 2] for m",
        ),
        (
            'backend: "python"\nsequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START } } }',
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' "
            "for CONTROL_SEQUENCE_START for m",
        ),
        (
            'backend: "python"\nsequence_batching { control_input { name: "C" control '
            "{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } } }",
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are TYPE_UINT64, "
            "TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        ),
        (
            'backend: "python"\nmodel_transaction_policy { decoupled: true }\nresponse_cache { enable: true }',
            "Response Cache does not currently support model m with 'decoupled' transaction policy. "
            "Please disable the response cache.",
        ),
        ('platform: "tensorrt_plan"\nbackend: "onnxruntime"', "unexpected 'platform' and 'backend' pair, got:tensorrt_plan, onnxruntime"),
    ],
)
def test_broken_configs_give_clear_errors(text, message):
    cfg = mc.parse_config_text(text, "m/config.pbtxt")
    mc.normalize_config(cfg, "m")
    err = _raises(mc.validate_config, cfg)
    assert err.code is ErrorCode.INVALID_ARG
    assert err.message == message


def test_missing_backend_is_rejected():
    cfg = ModelConfig(name="m")
    cfg.version_policy.latest.num_versions = 1
    err = _raises(mc.validate_config, cfg)
    assert err.message == "unexpected platform type '' for m"


def test_io_checks_can_wait_for_autocomplete():
    cfg = mc.parse_config_text('backend: "python"\ninput { name: "X" }', "x")
    mc.normalize_config(cfg, "m")
    mc.validate_config(cfg, check_io=False)
    with pytest.raises(KernelError):
        mc.validate_config(cfg)


@pytest.mark.parametrize(
    "steps, message",
    [
        ("", "must specify 'step' for ensemble 'e'"),
        (
            'step { model_name: "a" input_map { key: "i" value: "IN" } output_map { key: "o" value: "MID" } }',
            "ensemble output 'OUT' for ensemble e' is not used",  # Triton's stray quote, kept
        ),
        (
            'step { model_name: "a" input_map { key: "i" value: "IN" } input_map { key: "j" value: "GHOST" }'
            ' output_map { key: "o" value: "OUT" } }',
            "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, 'GHOST', "
            "is not connected",
        ),
        (
            'step { model_name: "a" input_map { key: "i" value: "IN" } output_map { key: "o" value: "OUT" } }\n'
            'step { model_name: "b" input_map { key: "i" value: "IN" } output_map { key: "o" value: "OUT" } }',
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1",
        ),
    ],
)
def test_ensemble_validation(steps, message):
    cfg = mc.parse_config_text(
        'platform: "ensemble"\ninput { name: "IN" data_type: TYPE_FP32 dims: [1] }\n'
        'output { name: "OUT" data_type: TYPE_FP32 dims: [1] }\n'
        f"ensemble_scheduling {{ {steps} }}",
        "e",
    )
    mc.normalize_config(cfg, "e")
    err = _raises(mc.validate_config, cfg)
    assert err.message == message


def test_sequence_control_lookup():
    cfg = mc.parse_config_text(
        'sequence_batching { control_input { name: "START" control { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } }'
        ' control_input { name: "CORRID" control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } } }',
        "x",
    )
    sb = cfg.sequence_batching
    Control = type(sb).Control
    assert mc.sequence_control(sb, "m", Control.CONTROL_SEQUENCE_START) == ("START", mc.DataType.TYPE_INT32, (0, 1))
    assert mc.sequence_control(sb, "m", Control.CONTROL_SEQUENCE_CORRID, boolean=False) == (
        "CORRID",
        mc.DataType.TYPE_UINT64,
        None,
    )
    assert mc.sequence_control(sb, "m", Control.CONTROL_SEQUENCE_END) is None
