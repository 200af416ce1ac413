"""The contract's ``tokenize`` request over gRPC: one call, one final response with the answer.

Owns ``ask_model``: send a ``TokenizeQuery`` or ``DetokenizeQuery`` as the ``tokenize`` input,
read the call to its end (a cancel after the final response would keep the model from unloading
at shutdown, as for every call), and return the answer's JSON text, or raise ``BackendError``
with the model's error (a bad query is the model's 400, since only it knows the vocabulary).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.utils import InferenceServerException

from openai_frontend.client.base import BackendError, backend_unavailable
from openai_frontend.client.results import contract_input, is_final, outputs_by_name
from python_backend.protocol import contract
from python_backend.protocol.errors import ErrorInfo, e2e_timeout
from python_backend.protocol.tokenize import DetokenizeQuery, TokenizeQuery

logger = logging.getLogger(__name__)


async def ask_model(client: Any, model_name: str, query: TokenizeQuery | DetokenizeQuery, timeout_s: float) -> str:
    """The ``text_output`` of the model's answer to ``query``."""

    async def request() -> AsyncIterator[dict[str, Any]]:
        inputs = [contract_input(contract.TOKENIZE, contract.bytes_tensor(query.to_wire()))]
        yield {"model_name": model_name, "inputs": inputs, "request_id": f"tokenize-{uuid.uuid4().hex}"}

    answer: str | None = None
    failure: BackendError | None = None
    try:
        async for result, error in client.stream_infer(request(), stream_timeout=timeout_s):
            if answer is not None or failure is not None:
                continue  # read on to the stream's end
            if error is not None:
                failure = BackendError(ErrorInfo.from_wire(str(error)))
            elif len(result.get_response().outputs) > 0 or is_final(result):
                answer = contract.read_string(outputs_by_name(result).get(contract.TEXT_OUTPUT)) or ""
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise BackendError(e2e_timeout(timeout_s)) from exc
        logger.warning("Triton tokenize call failed: %s", exc)
        raise backend_unavailable() from exc
    except (InferenceServerException, grpc.RpcError) as exc:
        logger.warning("Triton tokenize call failed: %s", exc)
        raise backend_unavailable() from exc
    if failure is not None:
        raise failure
    if not answer:
        raise backend_unavailable()
    return answer
