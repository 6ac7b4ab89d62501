"""Never run: a Python-based backend's own model.py wins over the model's."""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("the model repository's model.py must not be used for a Python-based backend")

    def execute(self, requests):
        raise RuntimeError("unreachable")
