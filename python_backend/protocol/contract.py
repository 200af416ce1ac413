"""The tensor contract between the Triton model and every caller (our frontend or plain tritonclient).

Owns: the name, datatype and shape of every input and output tensor, the JSON layout of the
JSON-carrying tensors, and the encode/decode helpers both sides use (errors: ``errors.py``).
It imports neither torch nor tritonclient (numpy only), so the frontend can use it without
loading a model, and the backend without loading a client.

The tensors are declared once, in ``INPUT_SPECS`` and ``OUTPUT_SPECS`` below (name, datatype,
dims, optional); config.pbtxt's ``input`` and ``output`` sections and the tables of
docs/tensor-contract.md, which says what each tensor means, are checked against them by tests.
Exactly one of ``messages`` / ``text_input`` / ``prompt_token_ids`` must be given. One response
describes one choice; ``text_output`` is in every response, the other outputs only when they say
something (an absent output reads as empty, an absent ``choice_index`` as 0). A request with
``text_input`` and none of our own inputs speaks the Triton vLLM backend's dialect
(``python_backend.prompt.vllm_compat``).

The parameters tensor is not called ``parameters``: Triton's HTTP generate endpoint reserves that
JSON key for request parameters and refuses an input tensor of the same name.

Errors travel as a Triton error whose message is ``errors.ErrorInfo.to_wire()`` (a JSON object), so that
plain tritonclient callers read a clear message and the frontend recovers the HTTP status, the
OpenAI error type and the offending field. Every request ends with exactly one final response.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from python_backend.protocol.errors import ContractError, invalid, nested_too_deep
from python_backend.protocol.input_limits import MAX_NESTING_DEPTH
from python_backend.protocol.prompt_logprobs import PromptLogprobs, prompt_logprobs_wire, read_prompt_logprobs

# --- input tensor names -------------------------------------------------------------------------
MESSAGES = "messages"
TEXT_INPUT = "text_input"
PROMPT_TOKEN_IDS = "prompt_token_ids"
PARAMETERS = "generation_parameters"
SAMPLING_PARAMETERS = "sampling_parameters"
STREAM = "stream"
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"
RETURN_FINISH_REASON = "return_finish_reason"
RETURN_CUMULATIVE_LOGPROB = "return_cumulative_logprob"
RETURN_LOGPROBS = "return_logprobs"
RETURN_NUM_INPUT_TOKENS = "return_num_input_tokens"
RETURN_NUM_OUTPUT_TOKENS = "return_num_output_tokens"
RETURN_FLAGS = (  # the vLLM backend's additional-output flags, in its order
    RETURN_FINISH_REASON,
    RETURN_CUMULATIVE_LOGPROB,
    RETURN_LOGPROBS,
    RETURN_NUM_INPUT_TOKENS,
    RETURN_NUM_OUTPUT_TOKENS,
)
MEDIA = "media"
MEDIA_TYPES = "media_types"
HEALTH_PROBE = "health_probe"
OPEN_CHANNEL = "open_channel"
STREAM_CHANNEL = "stream_channel"
CANCEL_REQUEST = "cancel_request"
TOKENIZE = "tokenize"

# --- output tensor names ------------------------------------------------------------------------
TEXT_OUTPUT = "text_output"
REASONING_OUTPUT = "reasoning_output"
TOOL_CALLS = "tool_calls"
CHOICE_INDEX = "choice_index"
FINISH_REASON = "finish_reason"
LOGPROBS = "logprobs"
USAGE = "usage"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"
CUMULATIVE_LOGPROB = "cumulative_logprob"
CHANNEL_DELTAS = "channel_deltas"
PROMPT_LOGPROBS = "prompt_logprobs"

DELTA_OUTPUT_NAMES = (  # what a request's own response may carry in our contract
    TEXT_OUTPUT,
    REASONING_OUTPUT,
    TOOL_CALLS,
    CHOICE_INDEX,
    FINISH_REASON,
    LOGPROBS,
    USAGE,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    PROMPT_LOGPROBS,
)
# The config's order: then the vLLM contract's own output and the channels' one.
OUTPUT_NAMES = (*DELTA_OUTPUT_NAMES, CUMULATIVE_LOGPROB, CHANNEL_DELTAS)

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_TOOL_CALLS = "tool_calls"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the contract, as config.pbtxt and tritonclient need it."""

    name: str
    datatype: str  # Triton datatype string: "BYTES", "BOOL", "INT32", "UINT32", "FP32"
    dims: tuple[int, ...]
    optional: bool = True


# How a request's input tensors are read: by name, None when the request did not send it.
TensorGetter = Callable[[str], "np.ndarray | None"]

INPUT_SPECS: tuple[TensorSpec, ...] = (
    TensorSpec(MESSAGES, "BYTES", (1,)),
    TensorSpec(TEXT_INPUT, "BYTES", (1,)),
    TensorSpec(PROMPT_TOKEN_IDS, "INT32", (-1,)),
    TensorSpec(PARAMETERS, "BYTES", (1,)),
    TensorSpec(SAMPLING_PARAMETERS, "BYTES", (1,)),
    TensorSpec(STREAM, "BOOL", (1,)),
    TensorSpec(EXCLUDE_INPUT_IN_OUTPUT, "BOOL", (1,)),
    *(TensorSpec(name, "BOOL", (1,)) for name in RETURN_FLAGS),
    TensorSpec(MEDIA, "BYTES", (-1,)),
    TensorSpec(MEDIA_TYPES, "BYTES", (-1,)),
    TensorSpec(HEALTH_PROBE, "BOOL", (1,)),
    TensorSpec(OPEN_CHANNEL, "BYTES", (1,)),
    TensorSpec(STREAM_CHANNEL, "BYTES", (1,)),
    TensorSpec(CANCEL_REQUEST, "BYTES", (1,)),
    TensorSpec(TOKENIZE, "BYTES", (1,)),
)

# Every output has one element; all are BYTES (text or JSON) but these.
_OUTPUT_NUMBERS = {
    CHOICE_INDEX: "INT32",
    NUM_INPUT_TOKENS: "UINT32",
    NUM_OUTPUT_TOKENS: "UINT32",
    CUMULATIVE_LOGPROB: "FP32",
}
OUTPUT_SPECS: tuple[TensorSpec, ...] = tuple(
    TensorSpec(name, _OUTPUT_NUMBERS.get(name, "BYTES"), (1,), optional=False) for name in OUTPUT_NAMES
)


# --- per-response payloads ----------------------------------------------------------------------
@dataclass
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int]
    token_id: int = -1  # for the vLLM format only; not in our logprobs JSON


@dataclass
class TokenLogprob:
    """One generated token's log-probability, OpenAI ``logprobs.content[i]`` shape."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob] = field(default_factory=list)
    token_id: int = -1  # token_id and rank: for the vLLM format only; not in our logprobs JSON
    rank: int = 0  # 1 + how many vocabulary entries were more likely


def logprob_wire(item: TokenLogprob) -> dict[str, Any]:
    """One token's entry in our ``logprobs`` JSON (the OpenAI fields only)."""
    return {
        "token": item.token,
        "logprob": item.logprob,
        "bytes": item.bytes,
        "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in item.top_logprobs],
    }


@dataclass
class ChoiceUsage:
    """Usage and timing of one choice; sent on the choice's last response.

    Invariants (docs/api.md, telemetry): ``len(batch_size) == len(queue_wait_time)
    == completion_tokens`` and ``len(decode_time_arr) == max(completion_tokens - 1, 0)``.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int | None = None  # only for reasoning models
    batch_size: list[int] = field(default_factory=list)  # sequences in the step of each token
    queue_wait_time: list[int] = field(default_factory=list)  # µs waited before each token's step
    prefill_time: float = 0.0  # ms from arrival to the first token
    decode_time_arr: list[float] = field(default_factory=list)  # ms of each later token's step
    cumulative_logprob: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> ChoiceUsage:
        return ChoiceUsage(**json.loads(text))


@dataclass
class ChoiceDelta:
    """What one response says about one choice (decoded form of the output tensors)."""

    index: int
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    usage: ChoiceUsage | None = None
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    cumulative_logprob: float = 0.0  # of the choice so far (the vLLM contract's output)
    prompt_logprobs: PromptLogprobs | None = None  # the request's, on its first response only


_DELTA_FIELDS = tuple(spec.name for spec in fields(ChoiceDelta))
_NULLABLE_FIELDS = frozenset(spec.name for spec in fields(ChoiceDelta) if spec.default is None)


def said(delta: ChoiceDelta) -> dict[str, Any]:
    """The fields of ``delta`` that say something, by name: every wire form leaves the others out
    (output tensors, channel entries, the frontend's chunks), and an absent one reads back as
    empty, 0 or None. A field whose default is None says something whenever it is set (an empty
    ``logprobs`` list: asked for, none in this response); the others when not empty or 0."""
    return {
        name: value
        for name in _DELTA_FIELDS
        if (value := getattr(delta, name)) is not None and (value or name in _NULLABLE_FIELDS)
    }


# --- encode / decode helpers --------------------------------------------------------------------
def bytes_tensor(value: str | bytes) -> np.ndarray:
    """A BYTES tensor of shape [1] holding one UTF-8 string."""
    data = value.encode("utf-8") if isinstance(value, str) else value
    return np.array([data], dtype=np.object_)


def json_tensor(value: Any) -> np.ndarray:
    return bytes_tensor(json.dumps(value, ensure_ascii=False))


def bool_tensor(value: bool) -> np.ndarray:
    return np.array([value], dtype=np.bool_)


def read_string(array: np.ndarray | None) -> str | None:
    """The single string of a BYTES [1] tensor (None when the tensor is absent)."""
    if array is None:
        return None
    flat = array.reshape(-1)
    if flat.size == 0:
        return ""
    item = flat[0]
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)


def read_json(array: np.ndarray | None, name: str) -> Any:
    text = read_string(array)
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except RecursionError as exc:  # the parser recurses per level: far past the nesting ceiling
        raise ContractError(nested_too_deep(name, MAX_NESTING_DEPTH)) from exc
    except json.JSONDecodeError as exc:
        raise invalid(f"tensor '{name}' is not valid JSON: {exc.msg}", name) from exc


def read_bool(array: np.ndarray | None, default: bool = False) -> bool:
    if array is None or array.size == 0:
        return default
    return bool(array.reshape(-1)[0])


@dataclass(frozen=True)
class CountOutputs:
    """Which token counts a request wants in every response (the vLLM backend's
    ``return_num_*_tokens`` flags); a choice's last response carries both regardless."""

    input_tokens: bool = False
    output_tokens: bool = False


def encode_delta(delta: ChoiceDelta, counts: CountOutputs = CountOutputs()) -> dict[str, np.ndarray]:
    """The output tensors of one response.

    Only ``text_output`` is in every response; ``choice_index`` when it is not 0, the token counts
    on a choice's last response (or on every one, as ``counts`` asks), the others when they say
    something. Each tensor costs shared-memory IPC in the stub, an output buffer in tritonserver
    and a gRPC field per streamed token (a streamed token with four tensors cost the three
    processes ~650 µs of CPU, with one ~490 µs), and an absent output reads as empty or 0
    (``decode_delta``).
    """
    last = delta.finish_reason is not None
    tensors = {TEXT_OUTPUT: bytes_tensor(delta.text)}
    for name, value in said(delta).items():
        if name in _DELTA_TENSORS:
            tensor, encode = _DELTA_TENSORS[name]
            tensors[tensor] = encode(value)
    if last or counts.input_tokens:
        tensors[NUM_INPUT_TOKENS] = np.array([delta.num_input_tokens], dtype=np.uint32)
    if last or counts.output_tokens:
        tensors[NUM_OUTPUT_TOKENS] = np.array([delta.num_output_tokens], dtype=np.uint32)
    return tensors


# The output tensor of each ChoiceDelta field ``said`` may name, and its encoding; text_output
# and the token counts follow encode_delta's own rules, cumulative_logprob is the vLLM contract's.
_DELTA_TENSORS: dict[str, tuple[str, Callable[[Any], np.ndarray]]] = {
    "index": (CHOICE_INDEX, lambda index: np.array([index], dtype=np.int32)),
    "reasoning": (REASONING_OUTPUT, bytes_tensor),
    "tool_calls": (TOOL_CALLS, lambda calls: bytes_tensor(json.dumps(calls))),
    "finish_reason": (FINISH_REASON, bytes_tensor),
    "logprobs": (LOGPROBS, lambda items: bytes_tensor(json.dumps([logprob_wire(lp) for lp in items]))),
    "usage": (USAGE, lambda usage: bytes_tensor(usage.to_json())),
    "prompt_logprobs": (PROMPT_LOGPROBS, lambda scores: json_tensor(prompt_logprobs_wire(scores))),
}


def token_logprob(raw: dict[str, Any]) -> TokenLogprob:
    """A ``TokenLogprob`` from its JSON object (``logprob_wire`` form)."""
    return TokenLogprob(
        token=raw["token"],
        logprob=float(raw["logprob"]),
        bytes=list(raw["bytes"]),
        top_logprobs=[TopLogprob(**top) for top in raw.get("top_logprobs", [])],
    )


def decode_delta(outputs: Mapping[str, np.ndarray | None]) -> ChoiceDelta:
    """Decode one response's output tensors (missing tensors read as empty)."""
    index = outputs.get(CHOICE_INDEX)
    logprobs_text = read_string(outputs.get(LOGPROBS)) or ""
    usage_text = read_string(outputs.get(USAGE)) or ""
    tool_text = read_string(outputs.get(TOOL_CALLS)) or ""
    n_in = outputs.get(NUM_INPUT_TOKENS)
    n_out = outputs.get(NUM_OUTPUT_TOKENS)
    prompt_raw = read_json(outputs.get(PROMPT_LOGPROBS), PROMPT_LOGPROBS)
    return ChoiceDelta(
        index=int(index.reshape(-1)[0]) if index is not None else 0,
        text=read_string(outputs.get(TEXT_OUTPUT)) or "",
        reasoning=read_string(outputs.get(REASONING_OUTPUT)) or "",
        tool_calls=json.loads(tool_text) if tool_text else [],
        finish_reason=read_string(outputs.get(FINISH_REASON)) or None,
        logprobs=[token_logprob(x) for x in json.loads(logprobs_text)] if logprobs_text else None,
        usage=ChoiceUsage.from_json(usage_text) if usage_text else None,
        num_input_tokens=int(n_in.reshape(-1)[0]) if n_in is not None else 0,
        num_output_tokens=int(n_out.reshape(-1)[0]) if n_out is not None else 0,
        prompt_logprobs=read_prompt_logprobs(prompt_raw) if prompt_raw is not None else None,
    )
