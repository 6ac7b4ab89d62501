"""A PyTriton-style model on Kernel with optional inputs filled in by @fill_optionals.

    python model_repo_examples/pytriton_optional.py    (HTTP :8000, gRPC :8001, metrics :8002)

Serves model "Scale" until Ctrl-C: y = x * scale + offset. Input x (FP32,
[-1, -1]) is required; scale and offset (FP32, [-1, 1]) are optional and
default to 1 and 0 when a request leaves them out. @fill_optionals adds the
defaults per request before @batch stacks the requests.
"""

import logging

import numpy as np

from kernel.decorators import batch, fill_optionals
from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@fill_optionals(scale=np.array([1.0], dtype=np.float32), offset=np.array([0.0], dtype=np.float32))
@batch
def scale(x: np.ndarray, scale: np.ndarray, offset: np.ndarray):
    return {"y": x * scale + offset}


def main() -> None:
    with Triton() as triton:
        triton.bind(
            model_name="Scale",
            infer_func=scale,
            inputs=[
                Tensor(name="x", dtype=np.float32, shape=(-1,)),
                Tensor(name="scale", dtype=np.float32, shape=(1,), optional=True),
                Tensor(name="offset", dtype=np.float32, shape=(1,), optional=True),
            ],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=16),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
