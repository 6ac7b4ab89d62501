"""execute() returns None and sends nothing."""


class TritonPythonModel:
    def execute(self, requests):
        return None
