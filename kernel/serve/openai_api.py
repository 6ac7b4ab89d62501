"""`kernel serve --openai-port`: the OpenAI-compatible API's flags and its transport (Kernel only;
tritonserver has no such flags, Triton's OpenAI frontend is a separate program listening on 9000).

Off unless --openai-port is given. It listens on --openai-address (default: --http-address) and
shares the KServe HTTP endpoint's limits and restrictions (--http-max-input-size,
--http-max-json-output-size, --http-max-header-size, --http-header-timeout-secs,
--http-body-timeout-secs, --http-restricted-api). --openai-api-key (or the environment variable
KERNEL_OPENAI_API_KEY, as vLLM's --api-key and VLLM_API_KEY) asks every /v1 and tokenizer call for
`Authorization: Bearer KEY`.
"""

from __future__ import annotations

import os
from typing import Optional

from kernel.serve.flags import parse_int

API_KEY_ENV = "KERNEL_OPENAI_API_KEY"


def add_flags(a) -> None:
    """The flags, added with the CLI's flag adder of a help group."""
    a("--openai-port", type=parse_int, default=None,
      help="Kernel only: serve the OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/embeddings, "
           "/v1/models) on this port; off unless given (Triton's OpenAI frontend uses 9000)")
    a("--openai-address", default=None, help="Kernel only: address the OpenAI-compatible API listens on "
                                             "(default: --http-address)")
    a("--openai-api-key", default=None,
      help="Kernel only: the API key the OpenAI-compatible API asks for (Authorization: Bearer KEY) on /v1/* and "
           "/tokenize, /detokenize; a call without it gets 401 (default: the environment variable "
           f"{API_KEY_ENV}, else none)")


def openai_transport(server, args, restricted) -> Optional[object]:
    """The OpenAI transport the flags ask for, or None; StartupError for a port it cannot use."""
    if args.openai_port is None:
        return None
    from kernel.core.server import StartupError
    from kernel.transports.openai import OpenAITransport

    address = args.openai_address or args.http_address
    port = args.openai_port
    if not 0 <= port <= 65535:
        raise StartupError(f"OpenAI port {port} is out of range: a port is 0 to 65535")
    for name, allowed, other_address, other_port in (
        ("HTTP", args.allow_http, args.http_address, args.http_port),
        ("GRPC", args.allow_grpc, args.grpc_address, args.grpc_port),
        ("metrics", args.allow_metrics, args.metrics_address, args.metrics_port),
    ):
        if allowed and port != 0 and other_port == port and other_address == address:
            raise StartupError(f"The server cannot listen to OpenAI requests and {name} requests "
                               f"at the same address and port {address}:{port}")
    key = getattr(args, "openai_api_key", None) or os.environ.get(API_KEY_ENV) or None
    return OpenAITransport(server, address, port, args.http_max_input_size, restricted,
                           args.http_max_json_output_size, key)
