"""Triton's ``config.pbtxt`` as a message: parsing and printing it with tritonclient's protobuf types.

The launcher writes a run's model configuration from the shipped one; the message types come from
``tritonclient``, which only this package imports.
"""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

ModelConfig = model_config_pb2.ModelConfig


class ModelConfigError(RuntimeError):
    """A config.pbtxt that does not parse."""


def parse_model_config(text: str) -> model_config_pb2.ModelConfig:
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(str(exc)) from exc


def model_config_text(config: model_config_pb2.ModelConfig) -> str:
    return text_format.MessageToString(config)
