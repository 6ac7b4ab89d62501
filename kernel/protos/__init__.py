"""Generated protobuf modules (run scripts/gen_protos.py after editing a .proto)."""
