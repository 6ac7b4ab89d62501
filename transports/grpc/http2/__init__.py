"""The HTTP/2 half of Kernel's own gRPC server: frames, HPACK, streams, flow control and limits.

Nothing here knows gRPC; native_server.py builds the gRPC calls on top, as grpclib
keeps its protocol module apart from its server.
"""
