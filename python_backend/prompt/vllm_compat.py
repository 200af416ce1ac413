"""The Triton vLLM backend's dialect of the tensor contract: its requests in, its responses out.

Owns: telling which contract a request speaks (``speaks_vllm``); reading a vLLM-contract request's
sampling parameters (the ``sampling_parameters`` tensor, else the Triton request parameters, with
numbers possibly sent as strings and cast by the field's type as the vLLM backend does) into our
parameter keys; which additional outputs it asked for (``VllmOutputs``); and ``VllmResponder``,
which writes each response's tensors in the vLLM backend's formats (per-response token counts,
``"None"`` finish reasons while running, logprobs keyed by token id). stdlib + numpy only.

A request speaks the vLLM contract when it has ``text_input`` and none of our own inputs
(``messages``, ``generation_parameters``, ``media``, ``stream_channel``): our frontend always
sends ``messages`` and ``generation_parameters``, so it keeps our contract.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from python_backend.protocol import contract
from python_backend.protocol.contract import ChoiceDelta, TensorGetter, TokenLogprob
from python_backend.protocol.errors import invalid

# vLLM's SamplingParams default when a request gives no max_tokens.
VLLM_DEFAULT_MAX_TOKENS = 16
# Inputs only our contract has: a request with any of them speaks ours.
OWN_INPUTS = (contract.MESSAGES, contract.PARAMETERS, contract.MEDIA, contract.MEDIA_TYPES, contract.STREAM_CHANNEL)
# Triton keeps request parameters with this prefix for its own flags; they are not sampling ones.
RESERVED_PREFIX = "triton_"

# vLLM SamplingParams fields by type: a string value is cast to it, as the vLLM backend casts.
FLOAT_FIELDS = frozenset(
    {"temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"}
)
INT_FIELDS = frozenset(
    {
        "n",
        "best_of",
        "top_k",
        "seed",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "prompt_logprobs",
        "truncate_prompt_tokens",
    }
)
BOOL_FIELDS = frozenset(
    {
        "ignore_eos",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "use_beam_search",
        "detokenize",
        "spaces_between_special_tokens",
    }
)
# Fields we carry over under the same name (parse_parameters checks their ranges).
SAME_NAME = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "n",
        "best_of",
        "seed",
        "max_tokens",
        "min_tokens",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "use_beam_search",
    }
)
# vLLM fields this model does not implement: accepted only at the value that means "off".
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "min_p": (0, 0.0),
    "detokenize": (True,),
    "spaces_between_special_tokens": (True,),
    "prompt_logprobs": (None,),
    "truncate_prompt_tokens": (None,),
    "logit_bias": (None, {}),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
}
VLLM_FIELDS = SAME_NAME | frozenset(DEFAULT_ONLY) | {"logprobs", "lora_name", "structured_outputs"}


def speaks_vllm(get: TensorGetter) -> bool:
    """True when the request is in the vLLM backend's contract (module docstring)."""
    return get(contract.TEXT_INPUT) is not None and all(get(name) is None for name in OWN_INPUTS)


@dataclass(frozen=True)
class VllmOutputs:
    """The vLLM backend's additional outputs one request asked for (all off by default)."""

    finish_reason: bool = False
    cumulative_logprob: bool = False
    logprobs: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False
    logprobs_asked: bool = False  # 'logprobs' was a sampling parameter (else the output is "null")


@dataclass(frozen=True)
class VllmRequest:
    """A vLLM-contract request's parameters in our keys, its outputs and its echo rule."""

    parameters: dict[str, Any]
    outputs: VllmOutputs
    echo_prompt: bool  # prepend the prompt to the first response's text


def read_vllm_request(get: TensorGetter, request_parameters: str, stream: bool) -> VllmRequest:
    """Read a vLLM-contract request; raise ``ContractError`` naming the bad input or field."""
    tensor = contract.read_json(get(contract.SAMPLING_PARAMETERS), contract.SAMPLING_PARAMETERS)
    if tensor is not None:
        if not isinstance(tensor, dict):
            raise invalid("'sampling_parameters' must be a JSON object", contract.SAMPLING_PARAMETERS)
        raw = tensor
    else:
        # The vLLM backend reads the request parameters only when the tensor is absent.
        raw = {k: v for k, v in _request_parameters(request_parameters).items() if not k.startswith(RESERVED_PREFIX)}
    outputs = VllmOutputs(
        finish_reason=contract.read_bool(get(contract.RETURN_FINISH_REASON)),
        cumulative_logprob=contract.read_bool(get(contract.RETURN_CUMULATIVE_LOGPROB)),
        logprobs=contract.read_bool(get(contract.RETURN_LOGPROBS)),
        num_input_tokens=contract.read_bool(get(contract.RETURN_NUM_INPUT_TOKENS)),
        num_output_tokens=contract.read_bool(get(contract.RETURN_NUM_OUTPUT_TOKENS)),
        logprobs_asked=raw.get("logprobs") is not None,
    )
    parameters = to_generation_parameters(raw)
    if outputs.cumulative_logprob and not parameters.get("logprobs"):
        # The engine sums token logprobs only when it computes them; none are returned.
        parameters["logprobs"], parameters["top_logprobs"] = True, 0
    exclude = get(contract.EXCLUDE_INPUT_IN_OUTPUT)
    echo = not contract.read_bool(exclude) if exclude is not None else not stream
    if echo and stream:
        raise invalid(
            "when streaming, 'exclude_input_in_output' = false is not allowed", contract.EXCLUDE_INPUT_IN_OUTPUT
        )
    return VllmRequest(parameters, outputs, echo)


def _request_parameters(text: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(f"the request parameters are not valid JSON: {exc.msg}", contract.SAMPLING_PARAMETERS) from exc
    return value if isinstance(value, dict) else {}


def to_generation_parameters(raw: dict[str, Any]) -> dict[str, Any]:
    """The vLLM backend's sampling parameters as our ``generation_parameters`` keys.

    Strings in number or boolean fields are cast by the field's type (``"0.1"``, ``"100"``,
    ``"true"``); ``logprobs`` is vLLM's top-N count; ``lora_name`` names the adapter; a missing
    ``max_tokens`` is vLLM's default of 16.
    """
    unknown = sorted(set(raw) - VLLM_FIELDS)
    if unknown:
        raise invalid(f"unknown sampling parameter '{unknown[0]}'", unknown[0])
    values = {key: _cast(key, value) for key, value in raw.items()}
    for key, allowed in DEFAULT_ONLY.items():
        if key in values and values[key] not in allowed:
            raise invalid(f"sampling parameter '{key}' is not supported by this model", key)
    ours: dict[str, Any] = {key: values[key] for key in SAME_NAME if values.get(key) is not None}
    ours.setdefault("max_tokens", VLLM_DEFAULT_MAX_TOKENS)
    top_n = values.get("logprobs")
    if top_n is not None:
        if top_n < 0:
            raise invalid(f"'logprobs' must be >= 0, got {top_n}", "logprobs")
        ours["logprobs"], ours["top_logprobs"] = True, top_n
    if values.get("lora_name") is not None:
        ours["lora"] = values["lora_name"]
    if values.get("structured_outputs") is not None:
        ours["response_format"] = _response_format(values["structured_outputs"])
    return ours


def _cast(key: str, value: Any) -> Any:
    if value is None:
        return None
    if key in FLOAT_FIELDS and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise invalid(f"'{key}' must be a number, got '{value}'", key) from None
    if key in INT_FIELDS and isinstance(value, (str, bool)):
        return _to_int(key, value)
    if key in BOOL_FIELDS and isinstance(value, str):
        # Not Python's bool(): "false" is false (the vLLM backend's cast reads any string as true).
        lowered = value.strip().lower()
        if lowered not in ("true", "false", "1", "0"):
            raise invalid(f"'{key}' must be a boolean, got '{value}'", key)
        return lowered in ("true", "1")
    if key == "lora_name" and not isinstance(value, str):
        return str(value)
    return value


def _to_int(key: str, value: str | bool) -> int:
    if isinstance(value, bool):
        return int(value)
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        raise invalid(f"'{key}' must be an integer, got '{value}'", key) from None
    if not number.is_integer():
        raise invalid(f"'{key}' must be an integer, got '{value}'", key)
    return int(number)


def _response_format(value: Any) -> dict[str, Any]:
    """vLLM's ``structured_outputs`` (a JSON object or its text): ``json`` or ``json_object``."""
    spec = value
    if isinstance(value, str):
        try:
            spec = json.loads(value)
        except json.JSONDecodeError as exc:
            raise invalid(f"'structured_outputs' is not valid JSON: {exc.msg}", "structured_outputs") from exc
    if not isinstance(spec, dict):
        raise invalid("'structured_outputs' must be an object", "structured_outputs")
    given = {key for key, item in spec.items() if item not in (None, False)}
    schema = spec.get("json")
    if given == {"json"}:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise invalid(f"'structured_outputs.json' is not valid JSON: {exc.msg}", "structured_outputs") from exc
        return {"type": "json_schema", "json_schema": {"name": "structured_outputs", "schema": schema}}
    if given == {"json_object"}:
        return {"type": "json_object"}
    raise invalid("'structured_outputs' supports only 'json' or 'json_object' here", "structured_outputs")


@dataclass
class VllmResponder:
    """Writes one vLLM-contract request's responses: only the outputs it asked for, in the vLLM
    backend's formats. It remembers how many tokens each choice has reported, because the vLLM
    backend's ``num_output_tokens`` counts the tokens of *this* response (clients sum them)."""

    outputs: VllmOutputs
    reported: dict[int, int] = field(default_factory=dict)  # choice index -> tokens reported

    def encode(self, delta: ChoiceDelta) -> dict[str, np.ndarray]:
        asked = self.outputs
        tensors = {contract.TEXT_OUTPUT: contract.bytes_tensor(delta.text)}
        if delta.index:
            tensors[contract.CHOICE_INDEX] = np.array([delta.index], dtype=np.int32)
        if asked.finish_reason:
            # str() of vLLM's reason: "None" while the choice runs.
            tensors[contract.FINISH_REASON] = contract.bytes_tensor(str(delta.finish_reason))
        if asked.cumulative_logprob:
            tensors[contract.CUMULATIVE_LOGPROB] = np.array([delta.cumulative_logprob], dtype=np.float32)
        if asked.logprobs:
            text = logprobs_json(delta.logprobs) if asked.logprobs_asked else "null"
            tensors[contract.LOGPROBS] = contract.bytes_tensor(text)
        if asked.num_input_tokens:
            tensors[contract.NUM_INPUT_TOKENS] = np.array([delta.num_input_tokens], dtype=np.uint32)
        before = self.reported.get(delta.index, 0)
        self.reported[delta.index] = delta.num_output_tokens
        if asked.num_output_tokens:
            count = max(delta.num_output_tokens - before, 0)
            tensors[contract.NUM_OUTPUT_TOKENS] = np.array([count], dtype=np.uint32)
        return tensors


def logprobs_json(items: list[TokenLogprob] | None) -> str:
    """The vLLM backend's ``logprobs`` text: per token of this response, ``{token id: {logprob,
    rank, decoded_token}}`` for the sampled token and the requested top alternatives."""
    return json.dumps([_token_entry(item) for item in items or []], ensure_ascii=False)


def _token_entry(item: TokenLogprob) -> dict[str, dict[str, Any]]:
    entry = {
        str(top.token_id): {"logprob": _finite(top.logprob), "rank": rank, "decoded_token": top.token}
        for rank, top in enumerate(item.top_logprobs, start=1)
    }
    entry[str(item.token_id)] = {"logprob": _finite(item.logprob), "rank": item.rank, "decoded_token": item.token}
    return entry


def _finite(value: float) -> float:
    # JSON has no -Infinity; a token outside the distribution reads as the lowest float.
    return value if math.isfinite(value) else -3.4028234663852886e38
