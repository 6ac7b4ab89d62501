"""Kernel: an asyncio-native inference server for Triton Python-backend models."""

__version__ = "0.1.0"
