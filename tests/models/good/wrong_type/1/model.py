class TritonPythonModel:
    def execute(self, requests):
        return {"not": "a list"}
