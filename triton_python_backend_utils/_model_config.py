"""pb_utils.ModelConfig: what auto_complete_config receives and completes,
refusing changes that contradict the configuration file."""

from __future__ import annotations

import copy
import json


def _same_dims(a, b):
    try:
        return [int(d) for d in a] == [int(d) for d in b]
    except (TypeError, ValueError):
        return a == b


class ModelConfig:
    """The model configuration handed to ``auto_complete_config``.

    Built from the config as a JSON string or dict.  ``as_dict()`` gives
    read access; the setters below complete the config and refuse changes
    that contradict what the configuration file already states.  The worker
    reads the result from ``_model_config``.
    """

    def __init__(self, model_config):
        if isinstance(model_config, (str, bytes, bytearray)):
            self._model_config = json.loads(model_config)
        elif isinstance(model_config, dict):
            self._model_config = copy.deepcopy(model_config)
        else:
            raise TypeError("ModelConfig expects a JSON string or a dict")

    def _name(self):
        return str(self._model_config.get("name", ""))

    def as_dict(self):
        return self._model_config

    def set_max_batch_size(self, max_batch_size):
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(
                "configuration specified max_batch_size " + str(current)
                + ", but in auto-complete-config function for model '"
                + self._name() + "' specified max_batch_size "
                + str(max_batch_size)
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    "Configuration specified scheduling_choice as '" + other
                    + "', but auto-complete-config function for model '"
                    + self._name()
                    + "' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind, tensor, allowed, allowed_text):
        config_name = self._name()
        for key in tensor:
            if key not in allowed:
                raise ValueError(
                    kind + " '" + str(tensor.get("name", "")) + "' in "
                    "auto-complete-config function for model '" + config_name
                    + "' contains property other than " + allowed_text + "."
                )
        if "name" not in tensor:
            raise ValueError(
                kind + " in auto-complete-config function for model '"
                + config_name + "' is missing 'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    kind + " '" + tensor["name"] + "' in auto-complete-config "
                    "function for model '" + config_name + "' is missing '"
                    + key + "' property."
                )

        entries = self._model_config.setdefault(kind, [])
        for existing in entries:
            if existing.get("name") != tensor["name"]:
                continue
            existing_type = existing.get("data_type", "TYPE_INVALID")
            if existing_type != "TYPE_INVALID" and existing_type != tensor["data_type"]:
                raise ValueError(
                    "unable to load model '" + config_name
                    + "', configuration expects datatype " + existing_type
                    + " for " + kind + " '" + tensor["name"]
                    + "', model provides " + tensor["data_type"]
                )
            existing_dims = existing.get("dims")
            if existing_dims and not _same_dims(existing_dims, tensor["dims"]):
                raise ValueError(
                    "model '" + config_name + "', tensor '" + tensor["name"]
                    + "': the model expects dims " + str(tensor["dims"])
                    + " but the model configuration specifies dims "
                    + str(existing_dims)
                )
            if (
                kind == "input"
                and "optional" in existing
                and "optional" in tensor
                and existing["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    "model '" + config_name + "', tensor '" + tensor["name"]
                    + "': the model expects optional " + str(tensor["optional"])
                    + " but the model configuration specifies optional "
                    + str(existing["optional"])
                )
            existing["data_type"] = tensor["data_type"]
            existing["dims"] = tensor["dims"]
            if kind == "input" and "optional" in tensor:
                existing["optional"] = tensor["optional"]
            return
        entries.append(tensor)

    def add_input(self, input):  # noqa: A002 - Triton's parameter name
        self._add_tensor(
            "input", input, ("name", "data_type", "dims", "optional"),
            "'name', 'data_type', 'dims' and 'optional'",
        )

    def add_output(self, output):
        self._add_tensor(
            "output", output, ("name", "data_type", "dims"),
            "'name', 'data_type' and 'dims'",
        )

    def set_model_transaction_policy(self, transaction_policy_dict):
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config "
                    "function for model '" + self._name()
                    + "' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config "
                    "for model '" + self._name() + "', which is already set to '"
                    + str(policy["decoupled"]) + "'."
                )
            policy["decoupled"] = wanted
