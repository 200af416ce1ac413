"""A fake ``triton_python_backend_utils``: the part of it ``python_backend.triton`` uses.

Triton's module exists only inside its Python-backend stub. These small classes behave as its
own do where the adapter can tell: tensors by name, requests with inputs, an id, parameters (a
JSON string) and one response sender, responses with tensors or an error, custom metrics. The
response sender records every response and flag, can be marked cancelled as a client that goes
away does, and refuses a send after the final one as Triton does.

``install`` puts this module in ``sys.modules`` under Triton's name for one test (through
``monkeypatch``) and imports the adapter afresh against it; nothing is installed at import.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
# The adapter's modules that import this one by Triton's name: imported afresh per install.
ADAPTER_MODULES = ("python_backend.triton.sender", "python_backend.triton.model")


class TritonModelException(Exception):
    """What Triton raises for a misuse, e.g. a send after the final response."""


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    INTERNAL = 13

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._tensors = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


@dataclass(frozen=True)
class Sent:
    """One call of ``send``: the response (None for a flags-only one) and its flags."""

    response: InferenceResponse | None
    flags: int

    @property
    def final(self) -> bool:
        return bool(self.flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class InferenceResponseSender:
    """Records what the model sends on one request's stream; thread-safe, as the real one is."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._sent: list[Sent] = []
        self._refused: list[Sent] = []  # sends after the final one, which Triton refuses
        self._cancelled = False
        self._asked_after_final = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        sent = Sent(response, flags)
        with self._changed:
            if any(s.final for s in self._sent):
                self._refused.append(sent)
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            self._sent.append(sent)
            self._changed.notify_all()

    def is_cancelled(self) -> bool:
        with self._changed:
            if any(s.final for s in self._sent):
                # Triton frees the request's state with its final response: asking is a crash there.
                self._asked_after_final += 1
            return self._cancelled

    def cancel(self) -> None:
        """The client went away: ``is_cancelled()`` answers True from now on."""
        with self._changed:
            self._cancelled = True

    @property
    def sent(self) -> list[Sent]:
        with self._changed:
            return list(self._sent)

    @property
    def refused(self) -> list[Sent]:
        with self._changed:
            return list(self._refused)

    @property
    def asked_after_final(self) -> int:
        with self._changed:
            return self._asked_after_final

    def finals(self) -> list[Sent]:
        return [s for s in self.sent if s.final]

    def wait_for(self, ready: Callable[[list[Sent]], bool], timeout: float = 30.0) -> list[Sent]:
        """Block until ``ready(sent)`` holds (woken by each send); the responses then."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not ready(self._sent):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"still waiting after {timeout} s; sent so far: {self._sent}")
                self._changed.wait(left)
            return list(self._sent)

    def wait_final(self, timeout: float = 30.0) -> list[Sent]:
        return self.wait_for(lambda sent: any(s.final for s in sent), timeout)


class InferenceRequest:
    """A request as the model's ``execute`` receives it."""

    def __init__(
        self,
        inputs: list[Tensor],
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        sender: InferenceResponseSender | None = None,
    ) -> None:
        self._inputs = list(inputs)
        self._request_id = request_id
        self._parameters = json.dumps(parameters or {})
        self._sender = sender or InferenceResponseSender()

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def request_id(self) -> str:
        return self._request_id

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as Triton gives them."""
        return self._parameters

    def get_response_sender(self) -> InferenceResponseSender:
        return self._sender

    def is_cancelled(self) -> bool:
        return self._sender.is_cancelled()


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class Metric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = dict(labels)
        self._value = 0.0
        self._lock = threading.Lock()

    def set(self, value: float) -> None:
        with self._lock:
            self._value = value

    def increment(self, value: float) -> None:
        with self._lock:
            self._value += value

    def value(self) -> float:
        with self._lock:
            return self._value


class MetricFamily:
    COUNTER = 0
    GAUGE = 1

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.metrics: list[Metric] = []

    def Metric(self, labels: dict[str, str]) -> Metric:  # Triton's own (method) name
        metric = Metric(labels)
        self.metrics.append(metric)
        return metric


def install(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Make this module ``triton_python_backend_utils`` for one test and import the adapter
    against it; ``monkeypatch`` undoes both. Returns ``python_backend.triton.model``."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", sys.modules[__name__])
    for name in ADAPTER_MODULES:
        # Recorded first, so that undo restores what was there (or removes the fresh import).
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        del sys.modules[name]
    return importlib.import_module("python_backend.triton.model")
