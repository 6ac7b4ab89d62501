"""Loading models: the model repository, model control modes, the repository API."""
