"""A PyTriton-style model on Kernel that reads request parameters and forwarded HTTP headers.

    python model_repo_examples/pytriton_parameters.py    (HTTP :8000, gRPC :8001, metrics :8002)

Serves model "Affine" until Ctrl-C: y = x * <parameter "factor"> + <header
"x-bias">. Parameters travel in the KServe request's "parameters" object (or
gRPC parameters map); HTTP headers and gRPC metadata whose names match
http_header_forward_pattern / grpc_header_forward_pattern ("x-.*" here) are
forwarded to the model as string parameters.
"""

import logging

import numpy as np

from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton, TritonConfig

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def affine(requests):
    responses = []
    for request in requests:
        factor = float(request.parameters.get("factor", 1))
        bias = float(request.parameters.get("x-bias", 0))
        responses.append({"y": (request["x"] * factor + bias).astype(np.float32)})
    return responses


def main() -> None:
    with Triton(config=TritonConfig(http_header_forward_pattern="x-.*", grpc_header_forward_pattern="x-.*")) as triton:
        triton.bind(
            model_name="Affine",
            infer_func=affine,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
