import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "TARGET")
            target = target.as_numpy()[0].decode() if target is not None else "add_sub"
            timeout = pb_utils.get_input_tensor_by_name(request, "TIMEOUT_US")
            timeout = int(timeout.as_numpy()[0]) if timeout is not None else 0
            bls = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
                timeout=timeout,
            )
            result = bls.exec()
            if result.has_error():
                responses.append(pb_utils.InferenceResponse(error=result.error()))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=result.output_tensors()))
        return responses
