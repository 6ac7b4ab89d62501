"""tiny_lm served by LitServe with its OpenAI spec: the peer of Kernel's OpenAI route in generative.py.

The very same `model_repo_examples/tiny_lm/1/model.py` that Kernel and real Triton load runs here,
unmodified, inside a `LitAPI`: its `async def execute` is called with one request object per chat
completion, and each `send()` of its response sender hands the streamed word to the LitAPI's
`predict` (an async generator), which LitServe's `OpenAISpec` turns into `chat.completion.chunk`
events. Only the few names of `triton_python_backend_utils` that model.py uses are provided below
(a tensor, a response, a sender, the input lookup): none of them copies or encodes anything that
Kernel's or Triton's Python backend would not.

The LitAPI is async (`enable_async=True`), so LitServe's inference worker runs many requests at once
on its event loop, as Kernel's worker and Triton's stub run tiny_lm's async execute: without it
LitServe would generate one answer at a time. Sampling follows the request as the other servers
see it: `max_tokens`, `temperature`, `top_p`, `stop`, the penalties; OpenAISpec has no `ignore_eos`
field, so answers are made `max_tokens` long here (what the benchmark asks of every server).

Runs from LitServe's own venv (generative.py installs `litserve` into benchmarks/.genbench/litserve):

    benchmarks/.genbench/litserve/bin/python benchmarks/litserve_tiny_lm.py --port 8000 [--fast-queue]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import types
from pathlib import Path

import litserve as ls
import numpy as np
from litserve.specs.openai import OpenAISpec

MODEL_DIR = Path(__file__).resolve().parent.parent / "model_repo_examples" / "tiny_lm"
FINAL = 1


# ---- the part of triton_python_backend_utils that tiny_lm uses ---------------------------------


class _Tensor:
    __slots__ = ("_name", "_array")

    def __init__(self, name, array):
        self._name = name
        self._array = array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class _TritonError(Exception):
    INVALID_ARG, CANCELLED = 3, 8

    def __init__(self, message, code=0):
        super().__init__(message)
        self.code = code


class _Response:
    __slots__ = ("tensors", "error")

    def __init__(self, output_tensors=(), error=None):
        self.tensors = output_tensors
        self.error = error


class _Logger:
    @staticmethod
    def log_info(message):
        pass


def _get_input_tensor_by_name(request, name):
    return request.inputs.get(name)


pb_utils = types.ModuleType("triton_python_backend_utils")
pb_utils.Tensor = _Tensor
pb_utils.TritonError = _TritonError
pb_utils.InferenceResponse = _Response
pb_utils.Logger = _Logger
pb_utils.get_input_tensor_by_name = _get_input_tensor_by_name
pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL


class _Sender:
    """What tiny_lm's send() hands over goes to the LitAPI's generator through a queue."""

    __slots__ = ("queue",)

    def __init__(self, queue: asyncio.Queue):
        self.queue = queue

    def send(self, response, flags=0):
        self.queue.put_nowait((response, flags))


class _Request:
    __slots__ = ("inputs", "sender", "cancelled")

    def __init__(self, inputs: dict, sender: _Sender):
        self.inputs = inputs
        self.sender = sender
        self.cancelled = False

    def get_response_sender(self):
        return self.sender

    def is_cancelled(self):
        return self.cancelled

    def request_id(self):
        return ""


def load_tiny_lm():
    sys.modules["triton_python_backend_utils"] = pb_utils
    spec = importlib.util.spec_from_file_location("tiny_lm_model", MODEL_DIR / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    # The parameters of tiny_lm's config.pbtxt (token_delay_ms, context_length), as Triton passes them.
    text = (MODEL_DIR / "config.pbtxt").read_text()
    params = {}
    for key in ("token_delay_ms", "context_length"):
        at = text.find(f'key: "{key}"')
        value = text[text.find('string_value: "', at) + 15:]
        params[key] = {"string_value": value[:value.find('"')]}
    model.initialize({"model_config": json.dumps({"parameters": params})})
    return model


# ---- the LitAPI ------------------------------------------------------------------------------


class TinyLM(ls.LitAPI):
    def setup(self, device):
        self.model = load_tiny_lm()

    async def decode_request(self, request, context):
        # The chat's messages as one prompt (tiny_lm only looks at its last word and its length).
        return "\n".join(f"{m.role}: {m.content}" for m in request.messages)

    async def predict(self, prompt, context):
        sampling = {"max_tokens": context.get("max_tokens") or 16, "ignore_eos": True,
                    "temperature": context.get("temperature", 1.0), "top_p": context.get("top_p", 1.0),
                    "presence_penalty": context.get("presence_penalty", 0.0),
                    "frequency_penalty": context.get("frequency_penalty", 0.0)}
        if context.get("stop"):
            sampling["stop"] = context["stop"]
        queue: asyncio.Queue = asyncio.Queue()
        request = _Request({
            "text_input": _Tensor("text_input", np.array([prompt.encode()], dtype=np.object_)),
            "stream": _Tensor("stream", np.array([True])),
            "exclude_input_in_output": _Tensor("exclude_input_in_output", np.array([True])),
            "sampling_parameters": _Tensor("sampling_parameters",
                                           np.array([json.dumps(sampling).encode()], dtype=np.object_)),
        }, _Sender(queue))
        task = asyncio.ensure_future(self.model.execute([request]))
        try:
            while True:
                response, flags = await queue.get()
                if response.error is not None:
                    raise RuntimeError(str(response.error))
                for t in response.tensors:
                    if t.name() == "text_output":
                        text = t.as_numpy()[0].decode()
                        if text:
                            yield text
                if flags & FINAL:
                    break
        finally:
            request.cancelled = True  # a client that went away stops the generation
            await task

    async def encode_response(self, output, context):
        async for text in output:
            yield {"role": "assistant", "content": text}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--fast-queue", action="store_true", help="LitServer(fast_queue=True): ZeroMQ between its processes")
    a = p.parse_args(argv)
    api = TinyLM(spec=OpenAISpec(), enable_async=True)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=False,
                          fast_queue=a.fast_queue)
    server.run(host="127.0.0.1", port=a.port, num_api_servers=1, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
