"""Which tool-call and reasoning formats a model has, and the plan for one request's output.

Owns: ``ModelFormats`` / ``resolve_formats`` (once per model, from the ``tool_call_parser`` and
``reasoning_parser`` settings and the tokenizer) and ``plan_output`` (once per request: the
validation rules that depend on the model, the prompt suffix that forces a tool call, and the
``OutputPlan`` the sequences follow).

Forcing calls (``tool_choice`` ``"required"`` or a named function) works by prefilling: the
start of a call is appended after the generation prompt and the parser starts as if the model
had written it. Hermes: ``<tool_call>\\n`` (required) or ``<tool_call>\\n{"name": "<fn>",
"arguments":`` (named). Llama 3 JSON: ``{"name": "`` (required) or ``{"name": "<fn>",
"parameters":`` (named). Mistral: ``[TOOL_CALLS]`` (required) or ``[TOOL_CALLS][{"name": "<fn>",
"arguments":`` (named). ChatGLM3: ``<fn>\\n`` (named). With exactly one tool, "required" is
that tool named; ChatGLM3 rejects "required" with several tools, since its format has no prefix
common to all calls. A forced call skips thinking: an open ``<think>`` at the end of the prompt
is closed before the prefill.

Reasoning parsing and ``stop`` / ``include_stop_str_in_output`` exclude each other (the
reference, §4.6): a stop string could cut a ``</think>`` and would end the answer inside its
reasoning. ``stop_token_ids`` stay allowed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from python_backend.protocol.errors import invalid
from python_backend.protocol.params import GenerationParams
from python_backend.text.output_plan import REASONING_DETECT, REASONING_FORCED, REASONING_OFF, OutputPlan
from python_backend.text.reasoning import CLOSE_TAG, OPEN_TAG
from python_backend.text.tool_parsers import CHATGLM3, HERMES, LLAMA3_JSON, MISTRAL
from python_backend.text.tool_parsers.hermes import OPEN_TAG as HERMES_OPEN
from python_backend.text.tool_parsers.llama3_json import PYTHON_TAG
from python_backend.text.tool_parsers.mistral import TOOL_CALLS

# Llama 3.1-3.3's templates ask for JSON calls with this sentence (and write <|python_tag|>).
LLAMA3_JSON_INSTRUCTION = '"parameters": dictionary of argument name and its value'
AUTO = "auto"
NONE = "none"
THINK = "think"


@dataclass(frozen=True)
class ModelFormats:
    """The output formats of one model."""

    tool_parser: str | None = None  # a name from TOOL_PARSERS; None: the model cannot call tools
    reasoning: bool = False  # the model writes <think>...</think>

    @property
    def keeps_special_tokens_for_tools(self) -> bool:
        """ChatGLM3 separates turns with special tokens and Mistral marks calls with one
        (``[TOOL_CALLS]``): their parsers must see them."""
        return self.tool_parser in (CHATGLM3, MISTRAL)


def _template_text(tokenizer: PreTrainedTokenizerBase) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    # A tokenizer may carry several named templates (a dict); any of them counts.
    return " ".join(template.values()) if isinstance(template, dict) else str(template)


def resolve_formats(
    tool_call_parser: str, reasoning_parser: str, tokenizer: PreTrainedTokenizerBase, model_type: str
) -> ModelFormats:
    """``auto`` picks by evidence: hermes when the chat template writes ``<tool_call>``, mistral
    when it writes ``[TOOL_CALLS]``, llama3_json when it asks for Llama 3's JSON calls or writes
    ``<|python_tag|>``, chatglm3 for ``model_type`` chatglm; ``<think>`` reasoning when the
    vocabulary or template has it."""
    template = _template_text(tokenizer)
    tool: str | None
    if tool_call_parser == AUTO:
        if HERMES_OPEN in template:
            tool = HERMES
        elif TOOL_CALLS in template:
            tool = MISTRAL
        elif LLAMA3_JSON_INSTRUCTION in template or PYTHON_TAG in template:
            tool = LLAMA3_JSON
        elif model_type == "chatglm":
            tool = CHATGLM3
        else:
            tool = None
    else:
        tool = None if tool_call_parser == NONE else tool_call_parser
    if reasoning_parser == AUTO:
        vocab = tokenizer.get_vocab()
        reasoning = (OPEN_TAG in vocab and CLOSE_TAG in vocab) or OPEN_TAG in template
    else:
        reasoning = reasoning_parser == THINK
    return ModelFormats(tool_parser=tool, reasoning=reasoning)


def _named_function(params: GenerationParams) -> str | None:
    choice = params.tool_choice
    if isinstance(choice, dict):
        return str(choice["function"]["name"])
    if choice == "required" and len(params.tools) == 1:
        return str(params.tools[0]["function"]["name"])
    return None


def _prefill(parser: str, params: GenerationParams) -> str:
    """Call text appended to the prompt so the answer must be a call ("" when not forced)."""
    named = _named_function(params)
    if parser == HERMES:
        if named is not None:
            # No trailing space: BPE vocabularies attach a space to the following token, so the
            # model continues with its usual ' {' token instead of an unusual lone '{'.
            return f'{HERMES_OPEN}\n{{"name": {json.dumps(named, ensure_ascii=False)}, "arguments":'
        return f"{HERMES_OPEN}\n" if params.tool_choice == "required" else ""
    if parser == LLAMA3_JSON:
        if named is not None:
            return f'{{"name": {json.dumps(named, ensure_ascii=False)}, "parameters":'
        return '{"name": "' if params.tool_choice == "required" else ""
    if parser == MISTRAL:
        if named is not None:
            return f'{TOOL_CALLS}[{{"name": {json.dumps(named, ensure_ascii=False)}, "arguments":'
        return TOOL_CALLS if params.tool_choice == "required" else ""
    if named is not None:
        return f"{named}\n"
    if params.tool_choice == "required":
        raise invalid(
            "'tool_choice' \"required\" needs a named function for this model's tool-call format "
            "(chatglm3) when 'tools' has more than one function",
            "tool_choice",
        )
    return ""


def _reasoning_mode(formats: ModelFormats, params: GenerationParams, prompt: str, forced_call: bool) -> str:
    if not formats.reasoning or forced_call or params.chat_template_kwargs.get("enable_thinking") is False:
        return REASONING_OFF
    tail = prompt.rstrip()
    if tail.endswith(CLOSE_TAG):
        return REASONING_OFF  # the template wrote an (empty) think block: the answer follows
    if tail.endswith(OPEN_TAG):
        return REASONING_FORCED
    return REASONING_DETECT


def plan_output(formats: ModelFormats, params: GenerationParams, prompt: str) -> tuple[OutputPlan, str]:
    """The request's output plan and the text to append to its rendered ``prompt``.

    Raises ``ContractError`` for ``tools`` on a model without a tool-call format and for stop
    strings while reasoning is parsed.
    """
    tools_active = bool(params.tools) and params.tool_choice != "none"
    parser: str | None = None
    prefill = ""
    if tools_active:
        if formats.tool_parser is None:
            raise invalid(
                "'tools' cannot be used: this model has no tool-call format "
                "(set the model's tool_call_parser if it has one)",
                "tools",
            )
        parser = formats.tool_parser
        prefill = _prefill(parser, params)
    reasoning = _reasoning_mode(formats, params, prompt, forced_call=bool(prefill))
    suffix = prefill
    if prefill and formats.reasoning and prompt.rstrip().endswith(OPEN_TAG):
        suffix = f"\n{CLOSE_TAG}\n\n{prefill}"  # a forced call is the answer: no thinking first
    if reasoning != REASONING_OFF:
        for name, active in (
            ("stop", bool(params.stop)),
            ("include_stop_str_in_output", params.include_stop_str_in_output),
        ):
            if active:
                raise invalid(
                    f"'{name}' cannot be used while reasoning is parsed; "
                    "set chat_template_kwargs.enable_thinking to false to use it",
                    name,
                )
    plan = OutputPlan(
        tool_parser=parser,
        tool_names=frozenset(str(t["function"]["name"]) for t in params.tools) if parser else frozenset(),
        tool_prefill=prefill,
        max_tool_calls=None if params.parallel_tool_calls else 1,
        reasoning=reasoning,
        report_reasoning_tokens=formats.reasoning,
    )
    return plan, suffix
