"""Warning classes of `pytriton.client.warnings`, so filters naming them keep working."""


class PyTritonWarning(UserWarning):
    """Base of the client warnings."""


class NotSupportedTimeoutWarning(PyTritonWarning):
    """A timeout the underlying client library cannot apply."""
