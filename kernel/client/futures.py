"""FuturesModelClient: ModelClient calls run on a pool of threads, answered with concurrent.futures.Future.

Each worker thread owns its own ModelClient (tritonclient's HTTP client is bound to the
thread's gevent hub, so clients are never shared across threads). Threads start on
demand up to max_workers; calls wait in a queue of at most max_queue_size.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable, List, Optional

from kernel.client import request as req
from kernel.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientQueueFullError,
    PyTritonClientValueError,
)
from kernel.client.sync import ModelClient
from kernel.client.url import TritonUrl
from kernel.model_config.triton_model_config import TritonModelConfig

_STOP = object()  # tells one worker thread to finish


class FuturesModelClient:
    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: Optional[str] = None,
        *,
        max_workers: int = 128,
        max_queue_size: int = 128,
        non_blocking: bool = False,
        init_timeout_s: Optional[float] = None,
        inference_timeout_s: Optional[float] = None,
    ):
        if max_workers is not None and max_workers <= 0:
            raise PyTritonClientValueError("max_workers must be greater than 0")
        if max_queue_size is not None and max_queue_size <= 0:
            raise PyTritonClientValueError("max_queue_size must be greater than 0")
        self._triton_url = TritonUrl.from_url(url)
        self._url = url
        self._model_name = model_name
        self._model_version = model_version
        self._max_workers = max_workers
        self._non_blocking = non_blocking
        self._init_timeout_s = init_timeout_s
        self._inference_timeout_s = inference_timeout_s
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue_size or 0)
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        self._idle = 0  # workers not running a call
        self._config: Optional[TritonModelConfig] = None  # the first config a worker fetched, shared
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def close(self, wait: bool = True) -> None:
        """Stops the workers once the queued calls are done; wait=True blocks until then."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(_STOP)
        if wait:
            for thread in threads:
                thread.join()

    # ---- calls -------------------------------------------------------------------------

    def wait_for_model(self, timeout_s: float) -> Future:
        return self._submit(lambda client: client.wait_for_model(timeout_s))

    def model_config(self) -> Future:
        return self._submit(lambda client: client.model_config)

    def infer_sample(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ) -> Future:
        return self._submit(
            lambda client: client.infer_sample(*inputs, parameters=parameters, headers=headers, **named_inputs)
        )

    def infer_batch(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ) -> Future:
        return self._submit(
            lambda client: client.infer_batch(*inputs, parameters=parameters, headers=headers, **named_inputs)
        )

    def _submit(self, call: Callable[[ModelClient], object]) -> Future:
        if self._closed:
            raise PyTritonClientClosedError(f"FuturesModelClient for model {self._model_name} is closed")
        future: Future = Future()
        try:
            if self._non_blocking:
                self._queue.put_nowait((future, call))
            else:
                self._queue.put((future, call), timeout=self._inference_timeout_s)
        except queue.Full:
            raise PyTritonClientQueueFullError(
                f"FuturesModelClient queue for model {self._model_name} is full "
                f"({self._queue.maxsize} calls waiting)"
            ) from None
        self._add_worker_if_needed()
        return future

    # ---- workers -----------------------------------------------------------------------

    def _add_worker_if_needed(self) -> None:
        with self._lock:
            if self._closed or self._queue.qsize() <= self._idle:
                return
            if self._max_workers is not None and len(self._threads) >= self._max_workers:
                return
            self._idle += 1
            thread = threading.Thread(
                target=self._work, name=f"FuturesModelClient-{self._model_name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def _new_client(self) -> ModelClient:
        with self._lock:
            config = self._config
        return ModelClient(
            self._url,
            self._model_name,
            self._model_version,
            init_timeout_s=self._init_timeout_s,
            inference_timeout_s=self._inference_timeout_s,
            model_config=config,
            ensure_model_is_ready=config is None,
        )

    def _work(self) -> None:
        client: Optional[ModelClient] = None
        try:
            while True:
                item = self._queue.get()
                with self._lock:
                    self._idle -= 1
                if item is _STOP:
                    return
                future, call = item
                if future.set_running_or_notify_cancel():
                    try:
                        if client is None:
                            client = self._new_client()
                        future.set_result(call(client))
                    except BaseException as exc:  # noqa: BLE001 - the caller sees it through the future
                        future.set_exception(exc)
                    if client is not None and client._model_config is not None and self._config is None:
                        with self._lock:
                            self._config = self._config or client._model_config
                with self._lock:
                    self._idle += 1
        finally:
            if client is not None:
                client.close()
                if self._triton_url.scheme == "http":
                    _release_gevent_hub()


def _release_gevent_hub() -> None:
    """tritonclient's HTTP client gives each thread a gevent hub; free it when the thread ends."""
    import gevent

    gevent.get_hub().destroy(destroy_loop=True)
