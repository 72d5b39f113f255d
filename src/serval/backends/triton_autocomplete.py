"""pb_utils.ModelConfig: what a Triton Python model's auto_complete_config() receives and
returns (triton_utils exposes it under that name)."""

from __future__ import annotations

import json
from typing import Any

from serval.protocol.dtypes import from_config_type

_TENSOR_PROPERTIES = ("name", "data_type", "dims", "optional")


class ModelConfig:
    """The model configuration auto_complete_config(auto_complete_model_config) receives and
    returns: read it with as_dict(), change the batch size, scheduler, inputs and outputs."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._config: dict[str, Any] = config
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {configured}, but "
                             f"auto_complete_config of model '{self._name()}' specified "
                             f"max_batch_size {max_batch_size}")
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._config:
                raise ValueError(f"configuration specified scheduling_choice as '{scheduler}', "
                                 f"but auto_complete_config of model '{self._name()}' tries to "
                                 "set it to 'dynamic_batching'")
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        unknown = sorted(set(transaction_policy_dict) - {"decoupled"})
        if unknown:
            raise ValueError(f"model_transaction_policy of model '{self._name()}' has unknown "
                             f"properties {unknown}")
        policy = self._config.setdefault("model_transaction_policy", {})
        policy["decoupled"] = bool(transaction_policy_dict.get("decoupled", False))

    def add_input(self, input: dict[str, Any]) -> None:
        self._add_tensor("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output)

    def _add_tensor(self, kind: str, tensor: dict[str, Any]) -> None:
        where = (f"{kind} '{tensor.get('name', '')}' in auto_complete_config of model "
                 f"'{self._name()}'")
        unknown = sorted(set(tensor) - set(_TENSOR_PROPERTIES))
        if unknown:
            raise ValueError(f"{where} has properties other than name, data_type, dims, "
                             f"optional: {unknown}")
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{where} is missing its '{required}' property")
        if from_config_type(tensor["data_type"]) is None:
            raise ValueError(f"{where}: unknown data_type '{tensor['data_type']}'")
        for current in self._config[kind]:
            if current["name"] != tensor["name"]:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID",
                                                                 tensor["data_type"]):
                raise ValueError(f"{where}: the configuration says data_type "
                                 f"{current['data_type']}, the model {tensor['data_type']}")
            if current.get("dims") and [int(d) for d in current["dims"]] != list(tensor["dims"]):
                raise ValueError(f"{where}: the configuration says dims {current['dims']}, "
                                 f"the model {tensor['dims']}")
            current.update(tensor)
            return
        self._config[kind].append(dict(tensor))
