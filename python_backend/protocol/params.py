"""Generation parameters: the keys of the ``parameters`` tensor, their ranges and cross-field rules.

Owns: ``GenerationParams`` (the validated, typed form), ``parse_parameters`` (the only way to
build one from untrusted JSON) and ``GenerationParams.to_wire`` (its canonical JSON). The frontend
runs the same function on the HTTP request, so a ``tritonclient`` caller and an HTTP caller get the
same errors, and sends the canonical form: the model parses one shape. No torch here.

Ranges and rules are MindIE's, with our choices where its page contradicts itself (docs/api.md).
``None`` means "not given": the engine then takes the model's ``generation_config.json`` value or
MindIE's default.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from python_backend.protocol.errors import invalid
from python_backend.protocol.messages import function_of

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
MAX_STOP_CHARS = 32768
MAX_N = 128
MAX_TOP_LOGPROBS = 20  # the default ceiling of top/prompt logprobs (vLLM's --max-logprobs default)
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: [-100, 100]
CHAT_TEMPLATE_KWARGS_ALLOWED = frozenset({"enable_thinking"})


@dataclass(frozen=True)
class GenerationParams:
    """Validated generation parameters of one request."""

    temperature: float | None = None  # 0 = greedy; None = model default, else 1.0
    top_p: float | None = None  # (1e-6, 1]; None = model default, else 1.0
    top_k: int | None = None  # 0 = no top-k; None = model default, else 1000; clamped to vocab
    repetition_penalty: float = 1.0  # (0, 2]; HF rule over prompt and output tokens
    presence_penalty: float = 0.0  # [-2, 2]; OpenAI rule over output tokens
    frequency_penalty: float = 0.0  # [-2, 2]; OpenAI rule over output tokens
    seed: int | None = None  # [0, 2^64-1]; None = random
    stop: tuple[str, ...] = ()  # stop strings, excluded from the output by default
    stop_token_ids: tuple[int, ...] = ()  # token ids that end the choice
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    ignore_eos: bool = False
    max_tokens: int | None = None  # None = the server's maxIterTimes
    min_tokens: int = 0  # EOS and stop tokens are suppressed until this many tokens exist
    n: int = 1  # choices returned
    best_of: int | None = None  # candidates generated (ranked by cumulative logprob)
    use_beam_search: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True  # false: at most one call per answer (extra calls dropped)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    lora: str | None = None  # adapter name; None = base model
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), sorted by token id
    min_p: float = 0.0  # [0, 1]; tokens below min_p x the top token's probability are dropped
    add_generation_prompt: bool = True  # the chat template opens the assistant's turn
    continue_final_message: bool = False  # the final (assistant) message is continued, not closed
    prompt_logprobs: int | None = None  # [0, 20] top tokens per prompt position (vLLM); None = off

    @property
    def candidates(self) -> int:
        """How many sequences are generated: best_of when set, else n."""
        return max(self.n, self.best_of or 0)

    def to_wire(self) -> dict[str, Any]:
        """The canonical JSON object of these parameters: ``parse_parameters(p.to_wire()) == p``.

        Only the fields that differ from their default, plus ``logprobs`` beside ``top_logprobs``
        and ``n`` beside ``best_of``: ``parse_parameters`` reads a lone ``top_logprobs`` as
        logprobs on, and its streaming ``best_of`` rule asks whether ``n`` was given.
        """
        wire: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            default = spec.default if spec.default_factory is MISSING else spec.default_factory()
            if value != default:
                wire[spec.name] = list(value) if isinstance(value, tuple) else value
        if self.logit_bias:
            wire["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}  # OpenAI's shape
        if "top_logprobs" in wire:
            wire["logprobs"] = self.logprobs
        if "best_of" in wire:
            wire["n"] = self.n
        return wire


def _range_message(key: str, lo: float, hi: float, lo_open: bool, value: object) -> str:
    if math.isinf(hi):
        return f"'{key}' must be {'>' if lo_open else '>='} {lo}, got {value}"
    return f"'{key}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}"


def _number(raw: dict[str, Any], key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'{key}' must be a number, got {type(value).__name__}", key)
    if not math.isfinite(value):
        raise invalid(f"'{key}' must be a finite number", key)
    too_low = value <= lo if lo_open else value < lo
    if too_low or value > hi:
        raise invalid(_range_message(key, lo, hi, lo_open, value), key)
    return float(value)


def _integer(raw: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise invalid(f"'{key}' must be an integer, got {type(value).__name__}", key)
    if value < lo or value > hi:
        raise invalid(f"'{key}' must be in [{lo}, {hi}], got {value}", key)
    return int(value)


def _boolean(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{key}' must be a boolean, got {type(value).__name__}", key)
    return value


def _top_k(raw: dict[str, Any]) -> int | None:
    value = raw.get("top_k")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'top_k' must be an integer, got {type(value).__name__}", "top_k")
    if value in (-1, 0):
        return 0  # MindIE's own examples send -1 for "no top-k"
    if value < 0 or value > INT32_MAX:
        raise invalid(f"'top_k' must be -1, 0 or in [1, {INT32_MAX}], got {value}", "top_k")
    return value


def _stop(raw: dict[str, Any]) -> tuple[str, ...]:
    value = raw.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise invalid("'stop' must be a string or a list of strings", "stop")
    total = 0
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise invalid(f"'stop[{i}]' must be a string", f"stop.{i}")
        if not item:
            raise invalid(f"'stop[{i}]' must not be empty", f"stop.{i}")
        total += len(item)
    if total > MAX_STOP_CHARS:
        raise invalid(f"'stop' strings total {total} characters; the limit is {MAX_STOP_CHARS}", "stop")
    return tuple(items)


def _stop_token_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    value = raw.get("stop_token_ids")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("'stop_token_ids' must be a list of integers", "stop_token_ids")
    kept: list[int] = []
    for i, item in enumerate(value):
        if item is None:
            raise invalid(f"'stop_token_ids[{i}]' must not be null", f"stop_token_ids.{i}")
        if isinstance(item, bool) or not isinstance(item, int):
            raise invalid(f"'stop_token_ids[{i}]' must be an integer", f"stop_token_ids.{i}")
        # A token id is an index into the vocabulary (int32 on the wire); the model checks the
        # vocabulary's own size, which only it knows.
        if not 0 <= item <= INT32_MAX:
            raise invalid(f"'stop_token_ids[{i}]' must be in [0, {INT32_MAX}], got {item}", f"stop_token_ids.{i}")
        kept.append(item)
    return tuple(kept)


def _given(raw: dict[str, Any], key: str, kind: type, what: str) -> Any:
    """``raw[key]``, None when not given; a 400 unless it is a ``kind`` (``what`` says one)."""
    value = raw.get(key)
    if value is not None and not isinstance(value, kind):
        raise invalid(f"'{key}' must be {what}", key)
    return value


def _tools(raw: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    value = _given(raw, "tools", list, "a list")
    if value is None:
        return ()
    for i, tool in enumerate(value):
        function = function_of(tool, f"tools[{i}]", f"tools.{i}")
        params = function.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise invalid(f"'tools[{i}].function.parameters' must be an object", f"tools.{i}.function.parameters")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"'tools[{i}].function.strict' must be a boolean", f"tools.{i}.function.strict")
    return tuple(value)


def _tool_choice(raw: dict[str, Any], tools: tuple[dict[str, Any], ...]) -> str | dict[str, Any] | None:
    value = raw.get("tool_choice")
    if value is None:
        return None
    if not tools:
        # OpenAI answers a tool_choice without tools with a 400, whatever its value.
        raise invalid(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.", "tool_choice"
        )
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise invalid('\'tool_choice\' must be "none", "auto", "required" or a named function', "tool_choice")
        return value
    if isinstance(value, dict):
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if value.get("type") != "function" or not isinstance(name, str):
            raise invalid(
                '\'tool_choice\' object must be {"type": "function", "function": {"name": ...}}', "tool_choice"
            )
        if name not in {t["function"]["name"] for t in tools}:
            raise invalid(f"'tool_choice' names function '{name}', which is not in 'tools'", "tool_choice")
        return value
    raise invalid("'tool_choice' must be a string or an object", "tool_choice")


def _chat_template_kwargs(raw: dict[str, Any]) -> dict[str, Any]:
    value = _given(raw, "chat_template_kwargs", dict, "an object")
    if value is None:
        return {}
    for key, item in value.items():
        # An allow-list: template kwargs such as 'tokenize' must never reach apply_chat_template.
        if key not in CHAT_TEMPLATE_KWARGS_ALLOWED:
            allowed = ", ".join(sorted(CHAT_TEMPLATE_KWARGS_ALLOWED))
            raise invalid(
                f"'chat_template_kwargs.{key}' is not supported (allowed: {allowed})", f"chat_template_kwargs.{key}"
            )
        if key == "enable_thinking" and not isinstance(item, bool):
            raise invalid(
                "'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs.enable_thinking"
            )
    return dict(value)


def _response_format(raw: dict[str, Any]) -> dict[str, Any] | None:
    value = raw.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise invalid('\'response_format.type\' must be "text", "json_object" or "json_schema"', "response_format")
    return None if value["type"] == "text" else value


def _logit_bias(raw: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    value = _given(raw, "logit_bias", dict, "an object mapping token ids to biases")
    if value is None:
        return ()
    biases: dict[int, float] = {}
    for key, bias in value.items():
        # OpenAI's keys: token ids written as decimal integers (JSON object keys are strings).
        if not isinstance(key, str) or not key.isascii() or not key.isdigit():
            raise invalid(f"'logit_bias' keys must be token ids (integers as strings), got '{key}'", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise invalid(f"'logit_bias[{key}]' must be a number", "logit_bias")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise invalid(f"'logit_bias[{key}]' must be in [-100, 100], got {bias}", "logit_bias")
        biases[int(key)] = float(bias)
    return tuple(sorted(biases.items()))


def check_vocabulary(params: GenerationParams, vocab_size: int) -> None:
    """The rules that need the model: every ``logit_bias`` token id must be in its vocabulary."""
    for token, _ in params.logit_bias:
        if token >= vocab_size:
            raise invalid(
                f"'logit_bias' names token id {token}, outside the vocabulary (ids 0 to {vocab_size - 1})",
                "logit_bias",
            )


KNOWN_KEYS = frozenset(GenerationParams.__dataclass_fields__) | {"max_completion_tokens"}


def parse_parameters(
    raw: dict[str, Any] | None, *, stream: bool = False, max_logprobs: int = MAX_TOP_LOGPROBS
) -> GenerationParams:
    """Validate untrusted parameters; raise ``ContractError`` naming the first bad field.
    ``max_logprobs`` is the server's ceiling of ``top_logprobs`` and ``prompt_logprobs``."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise invalid(f"unknown parameter '{unknown[0]}'", unknown[0])
    # The OpenAI alias wins when both are given; errors name the field the client sent.
    max_tokens_key = "max_completion_tokens" if raw.get("max_completion_tokens") is not None else "max_tokens"

    temperature = _number(raw, "temperature", 0.0, float("inf"))
    top_logprobs = _integer(raw, "top_logprobs", 0, max_logprobs)
    logprobs = _boolean(raw, "logprobs", False)
    if raw.get("top_logprobs") is not None and raw.get("logprobs") is None:
        logprobs = True  # MindIE: a valid top_logprobs turns logprobs on
    lora = raw.get("lora")
    if lora is not None and (not isinstance(lora, str) or not lora):
        raise invalid("'lora' must be a non-empty string", "lora")
    tools = _tools(raw)
    params = GenerationParams(
        temperature=temperature,
        top_p=_number(raw, "top_p", 1e-6, 1.0, lo_open=True),
        top_k=_top_k(raw),
        repetition_penalty=_number(raw, "repetition_penalty", 0.0, 2.0, lo_open=True) or 1.0,
        presence_penalty=_number(raw, "presence_penalty", -2.0, 2.0) or 0.0,
        frequency_penalty=_number(raw, "frequency_penalty", -2.0, 2.0) or 0.0,
        seed=_integer(raw, "seed", 0, UINT64_MAX),
        stop=_stop(raw),
        stop_token_ids=_stop_token_ids(raw),
        include_stop_str_in_output=_boolean(raw, "include_stop_str_in_output", False),
        skip_special_tokens=_boolean(raw, "skip_special_tokens", True),
        ignore_eos=_boolean(raw, "ignore_eos", False),
        max_tokens=_integer(raw, max_tokens_key, 1, INT32_MAX),
        min_tokens=_integer(raw, "min_tokens", 0, INT32_MAX) or 0,
        n=_integer(raw, "n", 1, MAX_N) or 1,
        best_of=_integer(raw, "best_of", 1, MAX_N),
        use_beam_search=_boolean(raw, "use_beam_search", False),
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        tools=tools,
        tool_choice=_tool_choice(raw, tools),
        parallel_tool_calls=_boolean(raw, "parallel_tool_calls", True),
        chat_template_kwargs=_chat_template_kwargs(raw),
        response_format=_response_format(raw),
        lora=lora,
        logit_bias=_logit_bias(raw),
        min_p=_number(raw, "min_p", 0.0, 1.0) or 0.0,
        add_generation_prompt=_boolean(raw, "add_generation_prompt", True),
        continue_final_message=_boolean(raw, "continue_final_message", False),
        prompt_logprobs=_integer(raw, "prompt_logprobs", 0, max_logprobs),
    )
    _check_cross_field(raw, params, stream)
    return params


def _check_cross_field(raw: dict[str, Any], p: GenerationParams, stream: bool) -> None:
    """The reference's rules that tie several fields together (§4.2, §4.6)."""
    n_set = raw.get("n") is not None
    best_of_set = p.best_of is not None
    if p.use_beam_search:
        if p.stop:
            raise invalid("'stop' cannot be used with 'use_beam_search'", "stop")
        if p.stop_token_ids:
            raise invalid("'stop_token_ids' cannot be used with 'use_beam_search'", "stop_token_ids")
    else:
        if (p.n > 1 or (p.best_of or 1) > 1) and p.temperature is not None and p.temperature <= 0:
            field_name = "n" if p.n > 1 else "best_of"
            raise invalid(f"'temperature' must be > 0 when '{field_name}' > 1", "temperature")
        if stream:
            if best_of_set and not n_set:
                raise invalid("'best_of' cannot be set alone when streaming; set 'n' to the same value", "best_of")
            if best_of_set and p.best_of != p.n:
                raise invalid("'best_of' must equal 'n' when streaming", "best_of")
        elif best_of_set and n_set and (p.best_of or 0) < p.n:
            raise invalid(f"'best_of' ({p.best_of}) must be >= 'n' ({p.n})", "best_of")
    if p.response_format is not None:
        # One decoding constraint at a time: a tool call and a JSON answer are different grammars.
        if p.tools and p.tool_choice != "none":
            raise invalid("'response_format' cannot be used together with 'tools'", "response_format")
        if p.use_beam_search:
            raise invalid("'response_format' cannot be used with 'use_beam_search'", "response_format")
    if p.continue_final_message and p.add_generation_prompt:
        # vLLM's rule: continuing the final message and opening a new turn exclude each other.
        raise invalid(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message"
        )
    if p.use_beam_search:
        # Beam search ranks raw log-probabilities; these per-token rules do not apply to it.
        for name, active in (("logit_bias", bool(p.logit_bias)), ("min_p", p.min_p > 0.0)):
            if active:
                raise invalid(f"'{name}' cannot be used with 'use_beam_search'", name)
        if p.prompt_logprobs is not None:
            # Beam answers are sent whole by their own path, which carries no prompt scores.
            raise invalid("'prompt_logprobs' cannot be used with 'use_beam_search'", "prompt_logprobs")
    if p.min_tokens and p.max_tokens is not None and p.min_tokens > p.max_tokens:
        alias = "max_completion_tokens" if raw.get("max_completion_tokens") is not None else "max_tokens"
        raise invalid(f"'min_tokens' must be <= '{alias}'", "min_tokens")
    if p.tools and p.tool_choice != "none":
        # Function calling excludes these (§4.6): the tool-call text must reach the parser whole.
        for name, active in (
            ("stop", bool(p.stop)),
            ("stop_token_ids", bool(p.stop_token_ids)),
            ("include_stop_str_in_output", p.include_stop_str_in_output),
            ("use_beam_search", p.use_beam_search),
            ("n", p.n > 1),
            ("best_of", (p.best_of or 1) > 1),
            ("logprobs", p.logprobs),
        ):
            if active:
                raise invalid(f"'{name}' cannot be used together with 'tools'", name)
