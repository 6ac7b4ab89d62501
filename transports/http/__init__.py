"""KServe v2 HTTP/REST transport."""

from kernel.transports.http.transport import HttpTransport

__all__ = ["HttpTransport"]
