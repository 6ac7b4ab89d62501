"""A module next to model.py, imported both relatively (`from .helpers import`) and absolutely."""


def describe():
    return {"name": __name__, "package": __package__}
