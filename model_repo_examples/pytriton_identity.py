"""A PyTriton-style model on Kernel: strings in, the same strings out (BYTES tensors).

    python model_repo_examples/pytriton_identity.py    (HTTP :8000, gRPC :8001, metrics :8002)

Serves model "Identity" until Ctrl-C: input "text" (BYTES, [-1, 1]) comes back
as output "text" unchanged; output "length" (INT64) holds each string's byte
length. The callable takes the raw list of requests (no decorator), one dict
of numpy arrays per client request.
"""

import logging

import numpy as np

from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def identity(requests):
    responses = []
    for request in requests:
        text = request["text"]  # object array of bytes
        lengths = np.vectorize(len, otypes=[np.int64])(text) if text.size else np.zeros(text.shape, np.int64)
        responses.append({"text": text, "length": lengths})
    return responses


def main() -> None:
    with Triton() as triton:
        triton.bind(
            model_name="Identity",
            infer_func=identity,
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="text", dtype=bytes, shape=(1,)), Tensor(name="length", dtype=np.int64, shape=(1,))],
            config=ModelConfig(max_batch_size=32),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
