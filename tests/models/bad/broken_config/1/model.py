class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("this model always fails")
