"""A decoupled model that enables the response cache: Triton refuses to load it."""


class TritonPythonModel:
    def execute(self, requests):
        return None
