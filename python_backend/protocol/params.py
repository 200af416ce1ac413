"""Generation parameters: the keys of the ``parameters`` tensor, their ranges and cross-field rules.

Owns: ``GenerationParams`` (the validated, typed form), ``parse_parameters`` (the only way to
build one from untrusted JSON) and ``GenerationParams.to_wire`` (its canonical JSON). The frontend
runs the same function on the HTTP request, so a ``tritonclient`` caller and an HTTP caller get the
same errors, and sends the canonical form: the model parses one shape. Each key's own type and
range are read by ``param_fields``; the rules across keys are here. Imports the standard library
and ``protocol``'s ``errors`` and ``param_fields`` only; no torch.

Ranges and rules are MindIE's, with our choices where its page contradicts itself (docs/api.md).
``None`` means "not given": the engine then takes the model's ``generation_config.json`` value or
MindIE's default.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from python_backend.protocol import param_fields
from python_backend.protocol.errors import invalid
from python_backend.protocol.param_fields import INT32_MAX, MAX_N, MAX_TOP_LOGPROBS, UINT64_MAX


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

    temperature = param_fields.number(raw, "temperature", 0.0, float("inf"))
    top_logprobs = param_fields.integer(raw, "top_logprobs", 0, max_logprobs)
    logprobs = param_fields.boolean(raw, "logprobs", False)
    if raw.get("top_logprobs") is not None and raw.get("logprobs") is None:
        logprobs = True  # MindIE: a valid top_logprobs turns logprobs on
    lora = raw.get("lora")
    if lora is not None and (not isinstance(lora, str) or not lora):
        raise invalid("'lora' must be a non-empty string", "lora")
    tools = param_fields.tools(raw)
    params = GenerationParams(
        temperature=temperature,
        top_p=param_fields.number(raw, "top_p", 1e-6, 1.0, lo_open=True),
        top_k=param_fields.top_k(raw),
        repetition_penalty=param_fields.number(raw, "repetition_penalty", 0.0, 2.0, lo_open=True) or 1.0,
        presence_penalty=param_fields.number(raw, "presence_penalty", -2.0, 2.0) or 0.0,
        frequency_penalty=param_fields.number(raw, "frequency_penalty", -2.0, 2.0) or 0.0,
        seed=param_fields.integer(raw, "seed", 0, UINT64_MAX),
        stop=param_fields.stop(raw),
        stop_token_ids=param_fields.stop_token_ids(raw),
        include_stop_str_in_output=param_fields.boolean(raw, "include_stop_str_in_output", False),
        skip_special_tokens=param_fields.boolean(raw, "skip_special_tokens", True),
        ignore_eos=param_fields.boolean(raw, "ignore_eos", False),
        max_tokens=param_fields.integer(raw, max_tokens_key, 1, INT32_MAX),
        min_tokens=param_fields.integer(raw, "min_tokens", 0, INT32_MAX) or 0,
        n=param_fields.integer(raw, "n", 1, MAX_N) or 1,
        best_of=param_fields.integer(raw, "best_of", 1, MAX_N),
        use_beam_search=param_fields.boolean(raw, "use_beam_search", False),
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        tools=tools,
        tool_choice=param_fields.tool_choice(raw, tools),
        parallel_tool_calls=param_fields.boolean(raw, "parallel_tool_calls", True),
        chat_template_kwargs=param_fields.chat_template_kwargs(raw),
        response_format=param_fields.response_format(raw),
        lora=lora,
        logit_bias=param_fields.logit_bias(raw),
        min_p=param_fields.number(raw, "min_p", 0.0, 1.0) or 0.0,
        add_generation_prompt=param_fields.boolean(raw, "add_generation_prompt", True),
        continue_final_message=param_fields.boolean(raw, "continue_final_message", False),
        prompt_logprobs=param_fields.integer(raw, "prompt_logprobs", 0, max_logprobs),
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
