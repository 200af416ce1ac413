"""Turning one Triton request's input tensors into a tokenized ``EngineRequest``'s ingredients.

Owns: ``decode_request`` (contract checks, parameter and message validation, the chat template,
raw prompt or prompt token ids, each prompt under the input ceiling before any work) and ``PreparedRequest``. It sees tensors as numpy arrays by name, so it is tested
without Triton; the adapter only fetches the arrays. A request in the vLLM backend's contract
(``vllm_compat.py``) gets its parameters from there and its raw text untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from python_backend.prompt import vllm_compat
from python_backend.prompt.chat_template import encode_chat_prompt, encode_raw_prompt, render_prompt_text
from python_backend.prompt.multimodal.processor import MediaInputs, MediaProcessor
from python_backend.prompt.multimodal.request_media import collect_media
from python_backend.protocol import contract
from python_backend.protocol.contract import TensorGetter
from python_backend.protocol.errors import ContractError, invalid, model_not_found
from python_backend.protocol.input_limits import check_input_size
from python_backend.protocol.messages import validate_tensor_messages
from python_backend.protocol.params import MAX_TOP_LOGPROBS, GenerationParams, parse_parameters
from python_backend.text.output_formats import ModelFormats, plan_output
from python_backend.text.output_plan import OutputPlan


@dataclass(frozen=True)
class PreparedRequest:
    prompt_ids: list[int]
    params: GenerationParams
    stream: bool
    echo_prompt: str  # prepended to non-streaming text (vLLM backend's text_input behaviour)
    output: OutputPlan  # reasoning / tool-call parsing of the generated text
    media: MediaInputs | None = None  # a multimodal request's extra prefill inputs
    counts: contract.CountOutputs = contract.CountOutputs()  # token counts in every response
    vllm: vllm_compat.VllmOutputs | None = None  # set: answer in the vLLM backend's formats


def _check_token_ids(token_ids: tuple[int, ...], tokenizer: PreTrainedTokenizerBase) -> None:
    """Stop token ids must name tokens of this model (the frontend cannot know its vocabulary)."""
    if not token_ids:
        return
    size = len(tokenizer)
    for i, token_id in enumerate(token_ids):
        if token_id >= size:
            raise invalid(
                f"'stop_token_ids[{i}]' is {token_id}; the model's vocabulary has {size} tokens", f"stop_token_ids.{i}"
            )


def _prompt_token_ids(array: np.ndarray, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids of a ``prompt_token_ids`` tensor; each must name a token of this model."""
    name = contract.PROMPT_TOKEN_IDS
    if array.dtype.kind not in "iu":
        raise invalid(f"tensor '{name}' must hold integers, got {array.dtype}", name)
    ids = [int(i) for i in array.reshape(-1)]
    if not ids:
        raise invalid(f"'{name}' must not be empty", name)
    check_input_size(ids, name)
    size = len(tokenizer)
    for i, token_id in enumerate(ids):
        if not 0 <= token_id < size:
            raise invalid(f"'{name}.{i}' is {token_id}, outside the vocabulary (ids 0 to {size - 1})", f"{name}.{i}")
    return ids


def decode_request(
    get: TensorGetter,
    tokenizer: PreTrainedTokenizerBase,
    adapters: frozenset[str],
    formats: ModelFormats | None = None,
    media_processor: MediaProcessor | None = None,
    request_parameters: str = "",
    max_logprobs: int = MAX_TOP_LOGPROBS,
) -> PreparedRequest:
    """Validate the tensors of one request; raise ``ContractError`` naming the bad input.

    ``formats`` are the model's tool-call and reasoning formats (None: plain text only);
    ``media_processor`` is a multimodal model's prompt step (None: media parts are refused);
    ``request_parameters`` is the Triton request's parameters as JSON (read in the vLLM contract);
    ``max_logprobs`` is the ceiling of ``top_logprobs`` and ``prompt_logprobs`` (``--max-logprobs``).
    """
    stream = contract.read_bool(get(contract.STREAM), default=False)
    vllm = vllm_compat.read_vllm_request(get, request_parameters, stream) if vllm_compat.speaks_vllm(get) else None
    raw: dict[str, Any] | None
    if vllm is not None:
        raw = vllm.parameters
        formats = None  # the vLLM backend returns the generated text as it is
    else:
        raw = _own_parameters(get)
    params = parse_parameters(raw, stream=stream, max_logprobs=max_logprobs)
    _check_token_ids(params.stop_token_ids, tokenizer)
    if params.lora is not None and params.lora not in adapters:
        raise ContractError(model_not_found(params.lora))
    messages = contract.read_json(get(contract.MESSAGES), contract.MESSAGES)
    text = contract.read_string(get(contract.TEXT_INPUT))
    token_ids = get(contract.PROMPT_TOKEN_IDS)
    if sum(given is not None for given in (messages, text, token_ids)) != 1:
        raise invalid(
            "give exactly one of the inputs 'messages', 'text_input' and 'prompt_token_ids'", contract.MESSAGES
        )
    echo = ""
    media = None
    formats = formats or ModelFormats()
    if messages is not None:
        messages = validate_tensor_messages(messages)
        kinds = media_processor.kinds if media_processor is not None else frozenset()
        prompt = render_prompt_text(tokenizer, messages, params, kinds)
        plan, suffix = plan_output(formats, params, prompt)
        if media_processor is not None:
            encoded = media_processor.encode(prompt + suffix, collect_media(messages, get, media_processor))
            prompt_ids, media = encoded.prompt_ids, encoded.media
        else:
            prompt_ids = encode_chat_prompt(tokenizer, prompt + suffix)
    elif token_ids is not None:
        prompt_ids = _prompt_token_ids(token_ids, tokenizer)
        # The text is what the ids say: the output plan reads its end, and it is the echo.
        text = str(tokenizer.decode(prompt_ids, skip_special_tokens=False))
        plan, suffix = plan_output(formats, params, text)
        if suffix:
            prompt_ids += [int(i) for i in tokenizer.encode(suffix, add_special_tokens=False)]
        if not stream and not contract.read_bool(get(contract.EXCLUDE_INPUT_IN_OUTPUT), default=False):
            echo = text
    else:
        if not text:
            raise invalid("'text_input' must not be empty", contract.TEXT_INPUT)
        check_input_size(text, contract.TEXT_INPUT)
        plan, suffix = plan_output(formats, params, text)
        prompt_ids = encode_raw_prompt(tokenizer, text + suffix)
        if vllm is not None:
            echo = text if vllm.echo_prompt else ""
        elif not stream and not contract.read_bool(get(contract.EXCLUDE_INPUT_IN_OUTPUT), default=False):
            echo = text
    if plan.tool_parser is not None and formats.keeps_special_tokens_for_tools:
        params = replace(params, skip_special_tokens=False)
    counts = contract.CountOutputs(
        input_tokens=contract.read_bool(get(contract.RETURN_NUM_INPUT_TOKENS), default=False),
        output_tokens=contract.read_bool(get(contract.RETURN_NUM_OUTPUT_TOKENS), default=False),
    )
    return PreparedRequest(
        prompt_ids=prompt_ids,
        params=params,
        stream=stream,
        echo_prompt=echo,
        output=plan,
        media=media,
        counts=counts,
        vllm=vllm.outputs if vllm is not None else None,
    )


def _own_parameters(get: TensorGetter) -> dict[str, Any] | None:
    """Our contract's parameters: ``generation_parameters``, or its alias ``sampling_parameters``."""
    raw = contract.read_json(get(contract.PARAMETERS), contract.PARAMETERS)
    alias = contract.read_json(get(contract.SAMPLING_PARAMETERS), contract.SAMPLING_PARAMETERS)
    if raw is not None and alias is not None:
        raise invalid("give either 'parameters' or 'sampling_parameters', not both", contract.SAMPLING_PARAMETERS)
    raw = raw if raw is not None else alias
    if raw is not None and not isinstance(raw, dict):
        raise invalid("'parameters' must be a JSON object", contract.PARAMETERS)
    return raw
