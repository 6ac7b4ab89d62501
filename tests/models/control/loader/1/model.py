"""Calls the model loading API on request: ACTION is load/unload/ready, NAME the model, ARG:

- load: "" or a JSON object {"config": "<json config>", "files": {"file:<path>": "<text content>"}}
- unload: "dependents" to unload dependents too
- ready: the version ("" = any)

RESULT is "ok", "True"/"False", or "<exception class>: <message>".
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _text(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0].decode()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action, name, arg = _text(request, "ACTION"), _text(request, "NAME"), _text(request, "ARG")
            try:
                if action == "load":
                    if arg:
                        spec = json.loads(arg)
                        files = {k: v.encode() for k, v in spec.get("files", {}).items()} or None
                        pb_utils.load_model(name, config=spec.get("config", ""), files=files)
                    else:
                        pb_utils.load_model(model_name=name)
                    result = "ok"
                elif action == "unload":
                    pb_utils.unload_model(model_name=name, unload_dependents=(arg == "dependents"))
                    result = "ok"
                else:
                    result = str(pb_utils.is_model_ready(model_name=name, model_version=arg))
            except Exception as exc:  # the test reads the error the model saw
                result = f"{type(exc).__name__}: {exc}"
            out = pb_utils.Tensor("RESULT", np.array([result.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
