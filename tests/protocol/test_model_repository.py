"""model_repository/triton_chat matches the tensor contract and the engine settings exactly."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from python_backend.protocol import contract
from python_backend.protocol.settings import EngineSettings

MODEL_DIR = Path(__file__).resolve().parents[2] / "model_repository" / "triton_chat"
# contract.TensorSpec.datatype -> config.pbtxt data_type
PBTXT_TYPES = {
    "BYTES": "TYPE_STRING",
    "BOOL": "TYPE_BOOL",
    "INT32": "TYPE_INT32",
    "UINT32": "TYPE_UINT32",
    "FP32": "TYPE_FP32",
}


def _config() -> model_config_pb2.ModelConfig:
    text = (MODEL_DIR / "config.pbtxt").read_text(encoding="utf-8")
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _spec_rows(specs: tuple[contract.TensorSpec, ...]) -> list[tuple[str, str, list[int]]]:
    return [(s.name, PBTXT_TYPES[s.datatype], list(s.dims)) for s in specs]


def _tensor_rows(tensors: object) -> list[tuple[str, str, list[int]]]:
    return [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in tensors]  # type: ignore[attr-defined]


def test_model_is_a_decoupled_python_model_without_triton_batching() -> None:
    config = _config()
    assert config.backend == "python"
    assert config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled is True
    assert [(g.kind, g.count) for g in config.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_CPU, 1)]


def test_inputs_match_the_contract() -> None:
    config = _config()
    assert _tensor_rows(config.input) == _spec_rows(contract.INPUT_SPECS)
    assert [i.optional for i in config.input] == [s.optional for s in contract.INPUT_SPECS]
    assert all(i.optional for i in config.input)


def test_outputs_match_the_contract() -> None:
    config = _config()
    assert _tensor_rows(config.output) == _spec_rows(contract.OUTPUT_SPECS)
    assert [o.name for o in config.output] == list(contract.OUTPUT_NAMES)


def test_parameters_are_the_engine_settings_with_their_defaults() -> None:
    config = _config()
    params = {key: value.string_value for key, value in config.parameters.items()}
    assert set(params) == {f.name for f in fields(EngineSettings)}
    assert params == EngineSettings().to_parameters()
    assert params["model_path"] == ""
    # The model reads them back through the same function it uses inside Triton.
    assert EngineSettings.from_parameters(params) == EngineSettings()


def test_version_folder_is_a_shim_into_python_backend() -> None:
    tree = ast.parse((MODEL_DIR / "1" / "model.py").read_text(encoding="utf-8"))
    statements = [
        node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
    ]
    assert [ast.unparse(node) for node in statements] == [
        "from python_backend.triton.model import TritonPythonModel",
        "__all__ = ['TritonPythonModel']",
    ]
