"""A PyTriton-style model on Kernel: element-wise sum and difference of two batched vectors.

    python model_repo_examples/pytriton_add_sub.py    (HTTP :8000, gRPC :8001, metrics :8002)

Other ports come from PYTRITON_TRITON_CONFIG_HTTP_PORT (and the other
PYTRITON_TRITON_CONFIG_* variables). Serves model "AddSub" until Ctrl-C:
inputs a, b (FP32, [-1, -1]); outputs add, sub. @batch hands the callable one
stacked array per input for the whole batch the dynamic batcher formed.
"""

import logging

import numpy as np

from kernel.decorators import batch
from kernel.model_config import DynamicBatcher, ModelConfig, Tensor
from kernel.triton import Triton

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@batch
def add_sub(a: np.ndarray, b: np.ndarray):
    return {"add": a + b, "sub": a - b}


def main() -> None:
    with Triton() as triton:
        triton.bind(
            model_name="AddSub",
            infer_func=add_sub,
            inputs=[Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="add", dtype=np.float32, shape=(-1,)),
                     Tensor(name="sub", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=200)),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
