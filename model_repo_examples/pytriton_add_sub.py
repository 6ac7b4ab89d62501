"""A PyTriton-style model on Kernel: element-wise sum and difference of two batched vectors.

    python model_repo_examples/pytriton_add_sub.py [--http-port 8000 --grpc-port 8001 --metrics-port 8002]

Ports may also come from PYTRITON_TRITON_CONFIG_HTTP_PORT (and the other
PYTRITON_TRITON_CONFIG_* variables). Serves model "AddSub" until Ctrl-C:
inputs a, b (FP32, [-1, -1]); outputs add, sub. @batch hands the callable one
stacked array per input for the whole batch the dynamic batcher formed.
"""

import argparse
import logging

import numpy as np

from kernel.decorators import batch
from kernel.model_config import DynamicBatcher, ModelConfig, Tensor
from kernel.triton import Triton, TritonConfig

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def config_from_argv() -> TritonConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("http", "grpc", "metrics"):
        parser.add_argument(f"--{name}-port", type=int, default=None)
    args = parser.parse_args()
    return TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)


@batch
def add_sub(a: np.ndarray, b: np.ndarray):
    return {"add": a + b, "sub": a - b}


def main() -> None:
    with Triton(config=config_from_argv()) as triton:
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
