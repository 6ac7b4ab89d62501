"""Request and response parameters: a dict of str keys and bool/int/str
values, checked and turned into the JSON string ``parameters()`` returns."""

from __future__ import annotations

import json

from ._errors import TritonModelException


def parameters_to_json(parameters):
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        # Triton's wording, which names the C++ type of its binding's dict.
        raise TritonModelException(
            "Expect N8pybind114dictE, got " + str(type(parameters))
        )
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                "Expect parameters keys to have type str, found type "
                + str(type(key))
            )
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters values to have type bool/int/str, found type "
                + str(type(value))
            )
    return json.dumps(parameters)
