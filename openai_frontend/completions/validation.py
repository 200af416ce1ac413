"""Validation of one completions request body.

Owns: ``validate_completion_request`` and the ``ValidatedCompletion`` it returns. Order: JSON
body -> body schema -> ``prompt`` (all of it under the input ceiling, then each) -> ``suffix`` / ``echo`` / ``logprobs`` -> the shared steps
(``chat.validation.check_generation``: unknown fields, stream options, generation parameters,
``model``). The first failure raises ``ContractError`` naming the field the client sent.

A prompt is a string, a list of strings, a list of token ids or a list of such lists (OpenAI's
and vLLM's forms); each becomes one backend request, text as ``text_input``, ids as
``prompt_token_ids`` (checked here to be non-empty integers in [0, 2^31); the model checks them
against its vocabulary).

Completions' own rules, mapped onto the shared parameters: ``logprobs`` k in [0, 5] (OpenAI's
limit) asks for the top k alternatives of each token (0 or null: none); with ``echo`` it also
scores the prompt's tokens (``prompt_logprobs`` k, as vLLM does); ``max_tokens`` defaults to 16
(OpenAI's and vLLM's default for this endpoint), or ``min_tokens`` when larger, and may be 0 with
``echo``: the prompt alone is answered, nothing generated counted (vLLM's answer: ``length``,
``completion_tokens`` 0; the engine, whose ``max_tokens`` is at least 1, samples one token from
the prompt's prefill, which ``serving.prompt_only`` leaves out); the
text is never split into reasoning; ``n`` applies to each prompt, and the prompts times ``n`` are
at most ``MAX_N`` choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openai_frontend.chat.validation import check_generation, load_json_object, parse_body
from openai_frontend.completions.schemas import CompletionRequest
from openai_frontend.settings import FrontendSettings
from python_backend.protocol.errors import invalid
from python_backend.protocol.input_limits import check_input_size
from python_backend.protocol.params import MAX_N, GenerationParams

DEFAULT_MAX_TOKENS = 16
TOKEN_ID_LIMIT = 1 << 31  # the contract's ``prompt_token_ids`` are INT32; no vocabulary is larger

# One backend request's prompt: raw text, or token ids used as they are.
PromptInput = str | tuple[int, ...]


@dataclass(frozen=True)
class ValidatedCompletion:
    """A request that passed every check, with what the route and the formatters need."""

    request: CompletionRequest
    prompts: tuple[PromptInput, ...]  # one backend request each; choice i*n+k is prompt i's k-th
    prompt_params: tuple[str, ...]  # each prompt's field in the body: "prompt" or "prompt.<i>"
    params: GenerationParams  # validated; ``lora`` names the adapter when ``model`` is one
    stream: bool
    include_usage: bool  # OpenAI mode: stream_options.include_usage
    ignored: tuple[str, ...]  # unknown body fields, reported in ``x-ignored-params``
    echo: bool  # each choice's text starts with its prompt
    continuous_usage: bool = False  # OpenAI mode: usage on every chunk (include_usage as well)
    echo_only: bool = False  # ``echo`` with ``max_tokens`` 0: the prompt alone, nothing generated shown

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.params.n


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(value: list[Any], param: str) -> tuple[int, ...]:
    if not value:
        raise invalid(f"'{param}' must not be empty", param)
    for i, token in enumerate(value):
        if not _is_token(token) or token < 0:
            raise invalid(f"'{param}.{i}' must be a token id (an integer >= 0), got {token!r}", f"{param}.{i}")
        if token >= TOKEN_ID_LIMIT:
            raise invalid(f"'{param}.{i}' is {token}, outside the vocabulary", f"{param}.{i}")
    return tuple(value)


def _prompts(value: Any) -> tuple[tuple[PromptInput, ...], tuple[str, ...]]:
    """The prompts, and the field that names each in the body (``prompt`` or ``prompt.<i>``)."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value:
        items = value
    elif isinstance(value, list):
        raise invalid("'prompt' must not be empty", "prompt")
    else:
        raise invalid("'prompt' must be a string, a list of strings or token ids", "prompt")
    # The first item says which form the list is; an item of another form is named below.
    if _is_token(items[0]):
        return (_token_ids(items, "prompt"),), ("prompt",)
    params = tuple("prompt" if isinstance(value, str) else f"prompt.{i}" for i in range(len(items)))
    prompts: list[PromptInput] = []
    for item, param in zip(items, params, strict=True):
        if isinstance(items[0], list):
            if not isinstance(item, list):
                raise invalid(f"'{param}' must be a list of token ids", param)
            prompts.append(_token_ids(item, param))
            continue
        if not isinstance(item, str):
            raise invalid(f"'{param}' must be a string", param)
        if not item:
            raise invalid(f"'{param}' must not be empty", param)
        prompts.append(item)
    return tuple(prompts), params


def _logprobs(value: Any, ceiling: int) -> dict[str, Any]:
    """The shared parameters that completions' integer ``logprobs`` stands for, at most ``ceiling``."""
    if value is None:
        return {}
    if not _is_token(value):
        raise invalid(f"'logprobs' must be an integer, got {type(value).__name__}", "logprobs")
    if value < 0 or value > ceiling:
        raise invalid(f"'logprobs' must be in [0, {ceiling}], got {value}", "logprobs")
    return {"logprobs": True, "top_logprobs": value} if value else {}


def validate_completion_request(body: bytes, settings: FrontendSettings) -> ValidatedCompletion:
    """Check a raw request body; raise ``ContractError`` (400 or 404) naming the first bad field."""
    request = parse_body(CompletionRequest, load_json_object(body))
    check_input_size(request.prompt, "prompt")  # every prompt together, before any is looked at
    prompts, prompt_params = _prompts(request.prompt)
    if request.suffix is not None:
        raise invalid("'suffix' is not supported: this server does not insert text after a completion", "suffix")
    if request.echo is not None and not isinstance(request.echo, bool):
        raise invalid(f"'echo' must be a boolean, got {type(request.echo).__name__}", "echo")
    parameters = {**request.to_backend_parameters(), **_logprobs(request.logprobs, settings.max_logprobs)}
    echo = bool(request.echo)
    if echo and parameters.get("logprobs") and request.prompt_logprobs is None:
        parameters["prompt_logprobs"] = parameters["top_logprobs"]  # the echoed tokens are scored too
    echo_only = echo and _is_token(request.max_tokens) and request.max_tokens == 0
    if echo_only:
        parameters["max_tokens"] = 1  # the engine's least; serving.prompt_only leaves the token out
    if parameters.get("max_tokens") is None and parameters.get("max_completion_tokens") is None:
        # Never below min_tokens: a client that sent no max_tokens must not read an error about it.
        floor = parameters.get("min_tokens")
        parameters["max_tokens"] = DEFAULT_MAX_TOKENS
        if isinstance(floor, int) and not isinstance(floor, bool):
            parameters["max_tokens"] = max(DEFAULT_MAX_TOKENS, floor)
    # A completion is the model's raw text: on a reasoning model the backend would otherwise move
    # ``<think>`` text out of it (and refuse ``stop``). Without a chat template this switch only
    # turns that parsing off.
    parameters["chat_template_kwargs"] = {"enable_thinking": False}
    checked = check_generation(request, parameters, settings)
    if len(prompts) * checked.params.n > MAX_N:
        raise invalid(f"'prompt' count times 'n' must be at most {MAX_N}, got {len(prompts) * checked.params.n}", "n")
    return ValidatedCompletion(
        request,
        prompts,
        prompt_params,
        checked.params,
        checked.stream,
        checked.include_usage,
        checked.ignored,
        echo,
        checked.continuous_usage,
        echo_only,
    )
