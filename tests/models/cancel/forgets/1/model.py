"""Returns None without answering through the response senders, ever; logs once for each request
it sees cancelled."""

import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        self.kept = []
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def execute(self, requests):
        with self.lock:
            self.kept.extend(requests)
        return None

    def _watch(self):
        while True:
            with self.lock:
                cancelled = [r for r in self.kept if r.is_cancelled()]
                self.kept = [r for r in self.kept if not r.is_cancelled()]
            for request in cancelled:
                pb_utils.Logger.log_info(f"{self.name} saw the cancellation of '{request.request_id()}'")
            time.sleep(0.05)
