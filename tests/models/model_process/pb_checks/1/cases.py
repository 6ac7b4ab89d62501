"""pb_utils calls with arguments of the wrong type (or value), each by a label.

run(cases) -> {label: [exception type name, message]} (["", ""] when nothing was raised).
"""

import numpy as np

import triton_python_backend_utils as pb_utils

A = np.array([1.0], dtype=np.float32)


def _tensor():
    return pb_utils.Tensor("IN", A)


def _request(**overrides):
    kwargs = dict(model_name="m", inputs=[_tensor()], requested_output_names=["OUT"])
    kwargs.update(overrides)
    return pb_utils.InferenceRequest(**kwargs)


_KEPT = {}


def _metric(kind):
    """One metric per kind, created once and kept (Triton 2.51 is fragile with metric churn)."""
    if kind not in _KEPT:
        family = pb_utils.MetricFamily("pb_checks_" + kind.lower(), "d", getattr(pb_utils.MetricFamily, kind))
        buckets = [1.0] if kind == "HISTOGRAM" else None
        _KEPT[kind] = (family, family.Metric(labels={"a": "b"}, buckets=buckets))
    return _KEPT[kind][1]


INITIALIZE = {
    "Tensor name int": lambda: pb_utils.Tensor(1, A),
    "Tensor name None": lambda: pb_utils.Tensor(None, A),
    "Tensor name bytes": lambda: pb_utils.Tensor(b"x", A),
    "Tensor array list": lambda: pb_utils.Tensor("x", [1.0, 2.0]),
    "Tensor array str": lambda: pb_utils.Tensor("x", "abc"),
    "Tensor array None": lambda: pb_utils.Tensor("x", None),
    "Tensor array int": lambda: pb_utils.Tensor("x", 5),
    "Tensor missing array": lambda: pb_utils.Tensor("x"),
    "Tensor from_dlpack name int": lambda: pb_utils.Tensor.from_dlpack(1, A),
    "Tensor from_dlpack int": lambda: pb_utils.Tensor.from_dlpack("x", 5),
    "Request model_name int": lambda: _request(model_name=1),
    "Request model_name None": lambda: _request(model_name=None),
    "Request missing model_name": lambda: pb_utils.InferenceRequest(inputs=[], requested_output_names=[]),
    "Request inputs int item": lambda: _request(inputs=[1]),
    "Request inputs str": lambda: _request(inputs="x"),
    "Request inputs None": lambda: _request(inputs=None),
    "Request inputs tuple": lambda: _request(inputs=(_tensor(),)),
    "Request outputs int item": lambda: _request(requested_output_names=[1]),
    "Request outputs str": lambda: _request(requested_output_names="OUT"),
    "Request outputs None": lambda: _request(requested_output_names=None),
    "Request correlation_id float": lambda: _request(correlation_id=1.5),
    "Request correlation_id negative": lambda: _request(correlation_id=-1),
    "Request correlation_id None": lambda: _request(correlation_id=None),
    "Request correlation_id list": lambda: _request(correlation_id=[1]),
    "Request request_id int": lambda: _request(request_id=1),
    "Request model_version str": lambda: _request(model_version="1"),
    "Request flags str": lambda: _request(flags="1"),
    "Request flags negative": lambda: _request(flags=-1),
    "Request flags float": lambda: _request(flags=1.5),
    "Request timeout negative": lambda: _request(timeout=-1),
    "Request timeout str": lambda: _request(timeout="1"),
    "Request parameters list": lambda: _request(parameters=[1]),
    "Request parameters str": lambda: _request(parameters="x"),
    "Request parameters int key": lambda: _request(parameters={1: 2}),
    "Request parameters float value": lambda: _request(parameters={"a": 1.5}),
    "Request preferred_memory int": lambda: _request(preferred_memory=1),
    "Request trace int": lambda: _request(trace=1),
    "Request set_flags str": lambda: _request().set_flags("x"),
    "Request exec decoupled str": lambda: _request().exec(decoupled="yes"),
    "Request exec decoupled int": lambda: _request().exec(decoupled=1),
    "Response tensors int item": lambda: pb_utils.InferenceResponse(output_tensors=[1]),
    "Response tensors str": lambda: pb_utils.InferenceResponse(output_tensors="x"),
    "Response tensors None item": lambda: pb_utils.InferenceResponse(output_tensors=[None]),
    "Response tensors None": lambda: pb_utils.InferenceResponse(output_tensors=None),
    "Response no arguments": lambda: pb_utils.InferenceResponse(),
    "Response error str": lambda: pb_utils.InferenceResponse(output_tensors=[], error="bad"),
    "Response parameters list value": lambda: pb_utils.InferenceResponse(output_tensors=[], parameters={"a": [1]}),
    "TritonError message int": lambda: pb_utils.TritonError(1),
    "TritonError code str": lambda: pb_utils.TritonError("m", "x"),
    "TritonError code 99": lambda: pb_utils.TritonError("m", 99),
    "TritonError no arguments": lambda: pb_utils.TritonError(),
    "Logger log level 7": lambda: pb_utils.Logger.log("m", 7),
    "Logger log level str": lambda: pb_utils.Logger.log("m", "INFO"),
    "Logger log message int": lambda: pb_utils.Logger.log(1),
    "Logger log message None": lambda: pb_utils.Logger.log(None),
    "Logger log_info int": lambda: pb_utils.Logger.log_info(1),
    "Logger log_warn None": lambda: pb_utils.Logger.log_warn(None),
    "Logger log_error bytes": lambda: pb_utils.Logger.log_error(b"x"),
    "Logger log_verbose list": lambda: pb_utils.Logger.log_verbose([1]),
    "PreferredMemory type float": lambda: pb_utils.PreferredMemory(1.5),
    "PreferredMemory type str": lambda: pb_utils.PreferredMemory("x"),
    "PreferredMemory device str": lambda: pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, "0"),
    "MetricFamily name int": lambda: pb_utils.MetricFamily(1, "d", pb_utils.MetricFamily.COUNTER),
    "MetricFamily kind 5": lambda: pb_utils.MetricFamily("pb_checks_k5", "d", 5),
    "MetricFamily kind str": lambda: pb_utils.MetricFamily("pb_checks_ks", "d", "COUNTER"),
    "TritonError code int": lambda: pb_utils.TritonError("m", 3),
    "TritonError code enum": lambda: pb_utils.TritonError("m", pb_utils.TritonError.INVALID_ARG),
    "Logger log level int": lambda: pb_utils.Logger.log("m", 0),
    "Logger log level enum": lambda: pb_utils.Logger.log("m", pb_utils.Logger.INFO),
    "PreferredMemory type int": lambda: pb_utils.PreferredMemory(1),
    "PreferredMemory device negative": lambda: pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, -1),
    "MetricFamily kind int": lambda: pb_utils.MetricFamily("pb_checks_k0", "d", 0),
    "Response parameters float value": lambda: pb_utils.InferenceResponse(output_tensors=[], parameters={"a": 1.5}),
    "Response parameters int key": lambda: pb_utils.InferenceResponse(output_tensors=[], parameters={1: "a"}),
    "Response parameters str": lambda: pb_utils.InferenceResponse(output_tensors=[], parameters="x"),
    "Response parameters None": lambda: pb_utils.InferenceResponse(output_tensors=[], parameters=None),
    "Response error None": lambda: pb_utils.InferenceResponse(output_tensors=[], error=None),
    "Request parameters None": lambda: _request(parameters=None),
    "Request set_flags negative": lambda: _request().set_flags(-1),
    "Request exec decoupled None": lambda: _request().exec(decoupled=None),
    "Request exec decoupled float": lambda: _request().exec(decoupled=0.0),
    "Request exec decoupled list": lambda: _request().exec(decoupled=[]),
    "Request correlation_id bool": lambda: _request(correlation_id=True),
    "Request correlation_id bytes": lambda: _request(correlation_id=b"x"),
    "Request model_name bytes": lambda: _request(model_name=b"m"),
    "Request request_id bytes": lambda: _request(request_id=b"r"),
    "Request flags bool": lambda: _request(flags=True),
    "Tensor name empty": lambda: pb_utils.Tensor("", A),
    "Tensor name empty array None": lambda: pb_utils.Tensor("", None),
    "Tensor from_dlpack name empty None": lambda: pb_utils.Tensor.from_dlpack("", None),
    "Metric increment str": lambda: _metric("COUNTER").increment("x"),
    "Metric increment int": lambda: _metric("COUNTER").increment(2),
    "Metric set str": lambda: _metric("GAUGE").set("x"),
    "Metric set None": lambda: _metric("GAUGE").set(None),
    "Metric observe str": lambda: _metric("HISTOGRAM").observe("x"),
    "Metric observe int": lambda: _metric("HISTOGRAM").observe(3),
    "load_model name int": lambda: pb_utils.load_model(1),
    "unload_model name int": lambda: pb_utils.unload_model(1),
    "is_model_ready name int": lambda: pb_utils.is_model_ready(1),
}


def execute_cases(request):
    """Checks that need a request handed to execute."""
    sender = request.get_response_sender()
    return {
        "Sender send str": lambda: sender.send("x"),
        "Sender send flags str": lambda: sender.send(None, "x"),
        "Sender send flags negative": lambda: sender.send(None, -1),
        "Sender send flags float": lambda: sender.send(None, 1.5),
        "Sender send flags 5": lambda: sender.send(None, 5),
        "Request set_release_flags str": lambda: request.set_release_flags("x"),
        "Request is_cancelled argument": lambda: request.is_cancelled(1),
    }


def run(cases):
    results = {}
    for label, call in cases.items():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - what was raised is the point
            results[label] = [type(exc).__name__, str(exc)]
        else:
            results[label] = ["", ""]
    return results
