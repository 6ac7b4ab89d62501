"""A PyTriton-style decoupled model on Kernel: a generator streams several responses per request.

    python model_repo_examples/pytriton_decoupled.py [--http-port 8000 --grpc-port 8001 --metrics-port 8002]

Serves model "Countdown" until Ctrl-C. Each request holds "start" (INT32,
[1]); the model answers with one response per step, "value" = start, start-1,
..., 1, then ends the stream. Decoupled models answer over gRPC streaming
(tritonclient start_stream / kernel.client.DecoupledModelClient).
"""

import argparse
import logging

import numpy as np

from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton, TritonConfig

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def config_from_argv() -> TritonConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("http", "grpc", "metrics"):
        parser.add_argument(f"--{name}-port", type=int, default=None)
    args = parser.parse_args()
    return TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)


def countdown(requests):
    """Each yield is one list with a response for every request still counting."""
    if len(requests) != 1:
        raise ValueError("Countdown streams one request at a time")
    start = int(requests[0]["start"].reshape(-1)[0])
    for value in range(start, 0, -1):
        yield [{"value": np.array([value], dtype=np.int32)}]


def main() -> None:
    with Triton(config=config_from_argv()) as triton:
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
