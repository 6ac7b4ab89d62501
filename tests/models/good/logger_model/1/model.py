import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        logger = pb_utils.Logger
        logger.log_info("logger_model info line")
        logger.log_warn("logger_model warning line")
        logger.log_error("logger_model error line")
        logger.log_verbose("logger_model verbose line")
        logger.log("logger_model default-level line")
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())])
            for r in requests
        ]
