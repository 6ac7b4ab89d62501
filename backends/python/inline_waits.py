"""What a worker does while a synchronous execute runs inline on its loop and something waits for the front.

The Worker (worker.py) runs a synchronous `execute` on its loop itself: no thread hop each way.
Meanwhile the loop is not polling, so whatever waits for the front (a BLS call, the model loading
API, metric reads, is_cancelled()) pumps the channel itself (see inline_channel.py), on the loop's
thread or on a thread of the model's. These are those waits, as a mixin of the Worker: they use its
loop, channel and the `_inline_busy` flag its inline execute sets.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time

_OFF_LOOP_STEP_S = 0.005


class InlineWaits:
    def pumping_here(self) -> bool:
        """True on the loop's thread while an inline execute runs: waits must pump the channel."""
        return self._inline_busy and threading.get_ident() == self._loop_thread

    def wait_inline(self, done, timeout: float | None = None) -> bool:
        """Dispatch the front's messages until done() (False if timeout seconds pass first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        asyncio.events._set_running_loop(self.loop)  # handlers may schedule tasks
        try:
            while not done():
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.channel.pump(remaining, done)  # reads at least once, even with no time left
                if remaining == 0.0:
                    return done()
            return True
        finally:
            asyncio.events._set_running_loop(None)

    def hold_loop_until(self, done) -> bool:
        """Block the running loop, from a coroutine on it, until done(): the channel is pumped meanwhile.

        For a plain `for` over a BLS response stream inside an async execute (Triton's
        own example iterates that way). Returns False, without waiting, when that is
        unsafe: an inline execute holds the loop already, or sends still sit in the
        transport's buffer (a direct read could answer before they leave).
        """
        if self._inline_busy or not self.channel.can_go_direct():
            return False
        self.hold_channels(True)
        try:
            while not done():
                self.channel.pump(None, done)
        finally:
            self.hold_channels(False)
        return True

    def hold_channels(self, hold: bool) -> None:
        """Enter (or leave) a stretch that holds the loop: the channels are read (and the primary
        written) directly meanwhile. Leaving waits for a model thread's direct read or write to end."""
        if hold:
            self._inline_busy = True
            self.channel.set_direct(True)
            if self.linked:
                self.links.hold(True)
        else:
            if self.linked:
                self.links.hold(False)
            self.channel.set_direct(False)
            self._inline_busy = False

    def take_off_loop(self, answers: queue.SimpleQueue, send=None, timeout: float | None = None):
        """The next item of answers, for a thread other than the loop's (queue.Empty after timeout).

        The loop delivers it, except while an inline execute holds the loop (perhaps
        joining this very thread): then this thread pumps the channel itself, and
        makes the request's send (a OneShot also handed to the loop) if the loop
        has not yet.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        ready = lambda: not answers.empty()  # noqa: E731
        while True:
            step = _OFF_LOOP_STEP_S if deadline is None else min(_OFF_LOOP_STEP_S, deadline - time.monotonic())
            if step <= 0:
                raise queue.Empty
            if send is not None and self._inline_busy:
                with self.channel.lock:
                    if self.channel.direct_writes:
                        send()
            if not (self._inline_busy and self.channel.pump(step, ready)):
                try:
                    return answers.get(timeout=step)
                except queue.Empty:
                    continue
            if not answers.empty():
                return answers.get()

    def poll_inline(self) -> None:
        """Dispatch what already arrived (a Cancel, say) on every link, without waiting."""
        try:
            self.wait_inline(lambda: False, 0)
        except ConnectionError:
            pass
        self.links.poll()
