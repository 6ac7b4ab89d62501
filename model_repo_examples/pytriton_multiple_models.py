"""Several PyTriton-style models in one Kernel server, one of them with two instances.

    python model_repo_examples/pytriton_multiple_models.py    (HTTP :8000, gRPC :8001, metrics :8002)

Serves until Ctrl-C:
  "Square"   x (FP32, [-1, -1]) -> y = x * x              (@batch)
  "Negate"   x (FP32, [-1, -1]) -> y = -x, two instances  (a list of callables, one per instance)
  "Describe" x (FP32, [-1]) -> mean (FP64, [1]) and label (BYTES, [1]), no batching, async callable
"""

import asyncio
import logging

import numpy as np

from kernel.decorators import batch
from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@batch
def square(x: np.ndarray):
    return {"y": x * x}


class Negate:
    """A callable object: each instance of the model gets its own."""

    def __init__(self, index: int):
        self.index = index

    @batch
    def __call__(self, x: np.ndarray):
        return {"y": -x}


async def describe(requests):
    await asyncio.sleep(0)  # async callables run on the server's async loop, never blocking it
    responses = []
    for request in requests:
        mean = float(np.mean(request["x"])) if request["x"].size else 0.0
        label = b"positive" if mean > 0 else b"non-positive"
        responses.append({"mean": np.array([mean], dtype=np.float64), "label": np.array([label], dtype=np.object_)})
    return responses


def main() -> None:
    vector = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    with Triton() as triton:
        triton.bind("Square", square, vector, [Tensor(name="y", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=16), strict=True)
        triton.bind("Negate", [Negate(0), Negate(1)], vector, [Tensor(name="y", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=16), strict=True)
        triton.bind("Describe", describe, vector,
                    [Tensor(name="mean", dtype=np.float64, shape=(1,)), Tensor(name="label", dtype=bytes, shape=(1,))],
                    config=ModelConfig(batching=False), strict=True)
        triton.serve()


if __name__ == "__main__":
    main()
