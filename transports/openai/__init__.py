"""The OpenAI-compatible API (chat completions, completions, embeddings, models) on its own port."""

from kernel.transports.openai.transport import DEFAULT_PORT, OpenAITransport

__all__ = ["DEFAULT_PORT", "OpenAITransport"]
