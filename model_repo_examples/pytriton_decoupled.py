"""A PyTriton-style decoupled model on Kernel: a generator streams several responses per request.

    python model_repo_examples/pytriton_decoupled.py    (HTTP :8000, gRPC :8001, metrics :8002)

Serves model "Countdown" until Ctrl-C. Each request holds "start" (INT32,
[1]); the model answers with one response per step, "value" = start, start-1,
..., 1, then ends the stream. Decoupled models answer over gRPC streaming
(tritonclient start_stream / kernel.client.DecoupledModelClient).
"""

import logging

import numpy as np

from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def countdown(requests):
    """Each yield is one list with a response for every request still counting."""
    if len(requests) != 1:
        raise ValueError("Countdown streams one request at a time")
    start = int(requests[0]["start"].reshape(-1)[0])
    for value in range(start, 0, -1):
        yield [{"value": np.array([value], dtype=np.int32)}]


def main() -> None:
    with Triton() as triton:
        triton.bind(
            model_name="Countdown",
            infer_func=countdown,
            inputs=[Tensor(name="start", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="value", dtype=np.int32, shape=(1,))],
            config=ModelConfig(batching=False, decoupled=True),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
