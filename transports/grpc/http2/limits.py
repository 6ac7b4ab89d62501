"""What one HTTP/2 connection may make the server hold or do, and the rate limits that police it.

A production HTTP/2 server bounds everything a peer controls: streams open at
once, header list size, flow-control windows, queued output, the rate of cheap
frames that cost the server work (PING, SETTINGS, RST_STREAM: the rapid-reset
attack, CVE-2023-44487), and how long a connection may take to start, sit idle
or live. The defaults follow grpc C-core (ping policing, header sizes) and
common servers; the ones tritonserver exposes are set from its --grpc-* flags.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Http2Limits:
    # Streams one connection may have open; more are refused with RST_STREAM(REFUSED_STREAM).
    # Advertised as SETTINGS_MAX_CONCURRENT_STREAMS (nginx 128, Go 250).
    max_concurrent_streams: int = 256
    # Decoded header list size (RFC 7541 sizes: name + value + 32 per field) a request may carry;
    # advertised as SETTINGS_MAX_HEADER_LIST_SIZE. Larger lists up to the hard limit fail the
    # stream; a compressed block beyond the hard limit ends the connection (as grpc C-core's
    # 16 KiB soft / hard limits). The HPACK state must be kept, so nothing between is skipped.
    max_header_list_size: int = 16 * 1024
    hard_header_list_size: int = 64 * 1024
    # HEADERS + CONTINUATION frames of one header block (empty CONTINUATION floods).
    max_header_frames: int = 32
    # Flow control: what this server advertises (and enforces) per stream and per connection.
    initial_window: int = 16 * 1024 * 1024
    max_frame_size: int = 1024 * 1024
    # Output queued to a client that does not read: above this the server stops reading from it.
    output_limit: int = 4 * 1024 * 1024
    # Answers one connection may hold for its client (DATA waiting for its flow-control window
    # plus the transport's unread buffer: views of a worker's arena, as a rule). An answer that
    # would take the connection past it fails instead of being held, unless the connection holds
    # nothing else (one answer may always go, however large); calls that start while it is past
    # it fail at once. Together with the server-wide --max-held-output-bytes and the stall timeout
    # this keeps a client that never opens its window from pinning memory (issue 23).
    max_pending_output: int = 256 * 1024 * 1024
    # PING/SETTINGS acknowledgements queued while the client does not read (Netty's
    # maxQueuedControlFrames): more is a flood, answered with GOAWAY(ENHANCE_YOUR_CALM).
    max_queued_control_frames: int = 10_000
    # SETTINGS frames: a burst, then a sustained rate per second.
    settings_burst: int = 100
    settings_rate: float = 10.0
    # Streams the client resets (or that are refused) before they are answered: a burst,
    # then a sustained rate per second (rapid reset).
    reset_burst: int = 1000
    reset_rate: float = 200.0
    # Frames that cost work and do nothing (empty DATA, PRIORITY, unknown types: CVE-2019-9518).
    idle_frames_burst: int = 10_000
    idle_frames_rate: float = 1000.0
    # Ping policing as grpc C-core: a ping sooner than the interval after the previous one,
    # with no DATA/HEADERS sent in between, is a strike; more than max_ping_strikes strikes
    # (0: no limit) end the connection with GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings").
    max_ping_strikes: int = 2
    min_recv_ping_interval_without_data: float = 300.0
    permit_pings_without_calls: bool = False
    # Seconds: to send the connection preface and SETTINGS; with no stream open before a
    # graceful GOAWAY (0: never); the age after which a graceful GOAWAY is sent and the grace
    # after it before the connection is closed (None: no limit, tritonserver's default).
    handshake_timeout: float = 20.0
    idle_timeout: float = 300.0
    max_connection_age: Optional[float] = None
    max_connection_age_grace: Optional[float] = None

    def __post_init__(self) -> None:
        if self.max_concurrent_streams < 1:
            raise ValueError("max_concurrent_streams must be at least 1")
        if not 0 < self.max_header_list_size <= self.hard_header_list_size:
            raise ValueError("max_header_list_size must be positive and at most hard_header_list_size")
        if self.max_pending_output <= 0:
            raise ValueError("max_pending_output must be positive")
        if not 65_535 <= self.initial_window <= 2**31 - 1:
            raise ValueError("initial_window must be between 65535 and 2^31-1")
        if not 16_384 <= self.max_frame_size <= 16_777_215:
            raise ValueError("max_frame_size must be between 16384 and 16777215")
        if self.max_ping_strikes < 0 or self.min_recv_ping_interval_without_data < 0:
            raise ValueError("ping strikes and the minimum ping interval must be >= 0")
        for name in ("max_connection_age", "max_connection_age_grace"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive")


class RateLimit:
    """A token bucket: `burst` events at once, refilled at `rate` per second."""

    __slots__ = ("burst", "rate", "tokens", "stamp")

    def __init__(self, burst: int, rate: float):
        self.burst = burst
        self.rate = rate
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def allow(self) -> bool:
        """Spend one token; False when none is left (the caller has seen a flood)."""
        tokens = self.tokens
        if tokens < 1.0:
            now = time.monotonic()
            tokens = min(self.burst, tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if tokens < 1.0:
                self.tokens = tokens
                return False
        self.tokens = tokens - 1.0
        return True


class PingPolicy:
    """grpc C-core's ping abuse policy: too many pings with no data sent in between are strikes."""

    __slots__ = ("limits", "last", "strikes")

    def __init__(self, limits: Http2Limits):
        self.limits = limits
        self.last: Optional[float] = None  # when the previous ping arrived; None after data was sent
        self.strikes = 0

    def reset(self) -> None:
        """The server sent DATA or HEADERS: pings are welcome again."""
        self.last = None
        self.strikes = 0

    def bad(self, idle: bool) -> bool:
        """Record a ping; True when it is one strike too many. `idle`: no stream is open."""
        limits = self.limits
        now = time.monotonic()
        last, self.last = self.last, now
        if last is None:
            return False
        interval = limits.min_recv_ping_interval_without_data
        if idle and not limits.permit_pings_without_calls:
            interval = max(interval, 7200.0)  # grpc C-core: 2 hours between pings with no call
        if now - last >= interval:
            return False
        self.strikes += 1
        return limits.max_ping_strikes != 0 and self.strikes > limits.max_ping_strikes
