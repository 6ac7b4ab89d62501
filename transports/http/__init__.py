"""KServe v2 HTTP/REST transport."""

from transports.http.transport import HttpTransport

__all__ = ["HttpTransport"]
