"""The clocks of one HTTP/2 connection: keepalive pings, and handshake, idle and age timeouts.

Each bounds how long a peer can hold a connection without doing what the
protocol expects: answer pings (tritonserver's --grpc-keepalive-*), send the
preface, use the connection, or give way after --grpc-max-connection-age.
"""

from __future__ import annotations

import logging
import random
import struct
import time

from kernel.transports.grpc.http2.frames import PING, frame

log = logging.getLogger("kernel.grpc")


class ConnectionClock:
    """Timers of one connection (an Http2Connection); all stop when it is lost."""

    __slots__ = ("conn", "ping_timer", "ping_deadline", "handshake", "idle", "age", "grace")

    def __init__(self, conn):
        self.conn = conn
        self.ping_timer = None
        self.ping_deadline = None
        self.handshake = None
        self.idle = None
        self.age = None
        self.grace = None

    def start(self) -> None:
        conn = self.conn
        loop, limits = conn.loop, conn.limits
        self._schedule_ping()
        if limits.handshake_timeout:
            self.handshake = loop.call_later(limits.handshake_timeout, self._handshake_expired)
        if limits.idle_timeout:
            self.idle = loop.call_later(limits.idle_timeout, self._idle_check)
        if limits.max_connection_age:
            # jittered by +-10%, as grpc C-core does, so connections made together do not all go at once
            self.age = loop.call_later(limits.max_connection_age * random.uniform(0.9, 1.1), self._age_reached)

    def stop(self) -> None:
        for name in ("ping_timer", "ping_deadline", "handshake", "idle", "age", "grace"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

    def handshake_done(self) -> None:
        if self.handshake is not None:
            self.handshake.cancel()
            self.handshake = None

    def ping_acked(self) -> None:
        if self.ping_deadline is not None:
            self.ping_deadline.cancel()
            self.ping_deadline = None

    def _alive(self) -> bool:
        transport = self.conn.transport
        return transport is not None and not transport.is_closing()

    # ---- timeouts ---------------------------------------------------------------------

    def _handshake_expired(self) -> None:
        self.handshake = None
        if self._alive() and not self.conn.settings_seen:
            log.debug("closing an HTTP/2 connection: no preface within %ss", self.conn.limits.handshake_timeout)
            self.conn.close_now(0)

    def _idle_check(self) -> None:
        self.idle = None
        conn = self.conn
        if not self._alive() or conn.closing:
            return
        timeout = conn.limits.idle_timeout
        wait = timeout
        if not conn.streams:
            idle = conn.loop.time() - conn.idle_since
            if idle >= timeout:
                log.debug("closing an HTTP/2 connection idle for %ss", timeout)
                conn.shutdown()
                return
            wait = timeout - idle
        self.idle = conn.loop.call_later(wait, self._idle_check)

    def _age_reached(self) -> None:
        self.age = None
        conn = self.conn
        if not self._alive():
            return
        conn.shutdown()  # GOAWAY: the client opens its next calls on a new connection
        grace = conn.limits.max_connection_age_grace
        if grace and conn.streams:
            self.grace = conn.loop.call_later(grace, conn.abort)

    # ---- keepalive ------------------------------------------------------------------

    def _schedule_ping(self) -> None:
        interval = self.conn.server.keepalive_time
        if interval:
            self.ping_timer = self.conn.loop.call_later(interval, self._keepalive)

    def _keepalive(self) -> None:
        self.ping_timer = None
        conn = self.conn
        server = conn.server
        if not self._alive():
            return
        allowed = server.keepalive_permit_without_calls or bool(conn.streams)
        limit = server.max_pings_without_data
        if allowed and (limit == 0 or conn.pings_without_data < limit) and self.ping_deadline is None:
            conn.write(frame(PING, 0, 0, struct.pack(">Q", time.monotonic_ns() & (2**64 - 1))))
            conn.pings_without_data += 1
            self.ping_deadline = conn.loop.call_later(server.keepalive_timeout, self._keepalive_expired)
        self._schedule_ping()

    def _keepalive_expired(self) -> None:
        self.ping_deadline = None
        log.info("closing a gRPC connection: no answer to a keepalive ping")
        self.conn.close_now(0)
