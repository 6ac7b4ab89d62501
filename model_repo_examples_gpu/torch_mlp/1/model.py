"""A small torch network on the GPU, as a user would write it for Triton's Python backend.

Its weights are made from a fixed seed in initialize() (nothing is downloaded), on the GPU the
instance was placed on (`model_instance_device_id`). Tensors cross the model's boundary through
DLPack without a copy: an input that arrives on the GPU (a CUDA shared-memory region, another
model's GPU output) is used where it is; one that arrives in host memory (plain HTTP or gRPC) is
moved to the GPU once; the output is handed back as a GPU tensor, which Kernel copies to the host
only for a client that reads it over the wire (a CUDA shared-memory output stays on the GPU).
"""

import torch
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import from_dlpack, to_dlpack

SEED = 0  # tests/gpu/test_gpu_example.py builds the same network on the CPU from it


def build_network() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


class TritonPythonModel:
    def initialize(self, args):
        if args["model_instance_kind"] != "GPU":
            raise pb_utils.TritonModelException("torch_mlp runs on a GPU: give it instance_group kind KIND_GPU")
        self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        self.network = build_network().to(self.device).eval()

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            x = from_dlpack(tensor.to_dlpack()).to(self.device)  # no copy when it is on this GPU already
            with torch.inference_mode():
                y = self.network(x).contiguous()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(y))]))
        return responses
