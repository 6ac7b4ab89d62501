"""Exercises pb_utils.MetricFamily / Metric. ACTION selects what one request does:

  count      counter += VALUE, gauge = VALUE, histogram observes VALUE
  temp_add   create a metric labelled {"kind": "temporary"} and keep it
  temp_del   delete that metric (it disappears from /metrics)
  conflict   create a family with an existing name and another kind (must fail)
  negative   increment the counter by a negative value (must fail)
  del_family delete a family whose metric is still held, then use the metric (must fail)

Outputs: COUNTER_VALUE / GAUGE_VALUE as Metric.value() reads them afterwards,
MESSAGE the text of the error the action raised (or "ok").
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.counter_family = pb_utils.MetricFamily(
            name="probe_requests_total_value", description="Sum of VALUE over requests",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.gauge_family = pb_utils.MetricFamily(
            name="probe_last_value", description="Last VALUE seen", kind=pb_utils.MetricFamily.GAUGE,
        )
        self.histogram_family = pb_utils.MetricFamily(
            name="probe_value_histogram", description="VALUE distribution", kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        self.counter = self.counter_family.Metric(labels=labels)
        self.gauge = self.gauge_family.Metric(labels=labels)
        self.histogram = self.histogram_family.Metric(labels=labels, buckets=[1.0, 10.0, 100.0])
        self.temporary = None

    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()[0])
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            message = "ok"
            try:
                if action == "count":
                    self.counter.increment(value)
                    self.gauge.set(value)
                    self.histogram.observe(value)
                elif action == "temp_add":
                    self.temporary = self.gauge_family.Metric(labels={"kind": "temporary"})
                    self.temporary.set(value)
                elif action == "temp_del":
                    self.temporary = None
                elif action == "conflict":
                    pb_utils.MetricFamily(name="probe_last_value", description="x", kind=pb_utils.MetricFamily.COUNTER)
                elif action == "negative":
                    self.counter.increment(-1.0)
                elif action == "del_family":
                    family = pb_utils.MetricFamily(name="probe_short_lived", description="y",
                                                   kind=pb_utils.MetricFamily.GAUGE)
                    metric = family.Metric(labels={"a": "b"})
                    del family
                    metric.set(1.0)
            except pb_utils.TritonModelException as exc:
                message = str(exc)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("COUNTER_VALUE", np.array([self.counter.value()], np.float32)),
                pb_utils.Tensor("GAUGE_VALUE", np.array([self.gauge.value()], np.float32)),
                pb_utils.Tensor("MESSAGE", np.array([message.encode()], np.object_)),
            ]))
        return responses
