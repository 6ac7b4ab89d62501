"""execute() never returns: a hung model."""

import time


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(3600)
        return []
