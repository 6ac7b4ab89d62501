"""Generated protobuf modules for the gRPC API (run scripts/gen_protos.py after editing the .proto)."""
