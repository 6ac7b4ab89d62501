import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
            delay = pb_utils.get_input_tensor_by_name(request, "delay_ms")
            delay_s = float(delay.as_numpy().reshape(-1)[0]) / 1000 if delay is not None else 0.0
            params = {k: v for k, v in json.loads(request.parameters()).items() if isinstance(v, (bool, int, str))}
            threading.Thread(
                target=self._stream, args=(request, request.get_response_sender(), text, delay_s, params), daemon=True
            ).start()
        return None

    def _stream(self, request, sender, text, delay_s, params):
        words = text.split()
        for i, word in enumerate(words):
            if request.is_cancelled():
                print(f"token_stream saw cancellation of '{words[0]}' after {i} words", flush=True)
                break
            if word == "FAIL":
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"word {i} is FAIL")))
            else:
                outputs = [
                    pb_utils.Tensor("text_output", np.array([word.encode()], dtype=np.object_)),
                    pb_utils.Tensor("index", np.array([i], dtype=np.int32)),
                ]
                sender.send(pb_utils.InferenceResponse(outputs, parameters=params))
            if delay_s:
                time.sleep(delay_s)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
