"""tritonclient's tensors both ways: the contract's inputs, and outputs by name, the final flag,
the end of a stream in its gRPC results.

Owns the helpers that both per-request streams (``client.triton``) and the response channel
(``client.channel``) use on each request they build and each response they read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import InferInput

from python_backend.protocol import contract


def contract_input(name: str, array: np.ndarray) -> InferInput:
    """An input tensor named and typed as ``contract.INPUT_SPECS`` says."""
    datatype = next(spec.datatype for spec in contract.INPUT_SPECS if spec.name == name)
    tensor = InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def single_bytes(raw: bytes) -> bytes | None:
    """The element of a one-element BYTES tensor in Triton's raw layout (4-byte little-endian
    length, then the bytes); None when the buffer holds anything else."""
    if len(raw) < 4:
        return None
    length = int.from_bytes(raw[:4], "little")
    return raw[4:] if len(raw) == 4 + length else None


def outputs_by_name(result: Any) -> dict[str, np.ndarray | None]:
    """The response's outputs by name, read in one pass over the raw buffers.

    This runs once per streamed token; ``InferResult.as_numpy`` scans every output for each name
    it is asked for and deserializes BYTES tensors through a general loop. One-element BYTES
    tensors (every text and JSON output of the contract) are sliced directly; anything else goes
    through ``as_numpy``.
    """
    response = result.get_response()
    raw = response.raw_output_contents
    arrays: dict[str, np.ndarray | None] = {}
    for index, output in enumerate(response.outputs):
        if index < len(raw) and output.datatype == "BYTES" and list(output.shape) == [1]:
            value = single_bytes(raw[index])
            if value is not None:
                arrays[output.name] = np.array([value], dtype=np.object_)
                continue
        arrays[output.name] = result.as_numpy(output.name)
    return arrays


def is_final(result: Any) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and bool(params["triton_final_response"].bool_param)


def ends_stream(item: tuple[Any, Any]) -> bool:
    """A ``(result, error)`` pair after which Triton sends nothing more for the request."""
    result, error = item
    return error is not None or is_final(result)
