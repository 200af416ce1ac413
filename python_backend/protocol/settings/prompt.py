"""The prompt's engine settings: where the tokenizer and the chat template come from, and the seed
of requests that send none (vLLM's ``--tokenizer``, ``--chat-template`` and ``--seed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from python_backend.protocol.settings.info import SettingInfo, setting


@dataclass(frozen=True)
class PromptSettings:
    """The tokenizer and chat template the prompts are made with, and the default seed."""

    # vLLM's --tokenizer: a folder whose tokenizer (and chat template) replace the model folder's.
    tokenizer: str = setting(
        "",
        SettingInfo(
            "local tokenizer folder to use instead of the model folder's (default: the model folder)",
            flag="--tokenizer",
            metavar="DIR",
            docs="a local folder whose tokenizer (vocabulary, special tokens, chat template) is used instead "
            "of the model folder's, as vLLM's `--tokenizer`; a template only the model folder has (its "
            "`chat_template.json`) still applies. Its ids must be the model's",
            docs_default="the model folder",
        ),
    )
    # vLLM's --chat-template: a file, or the Jinja template itself on one line.
    chat_template: str = setting(
        "",
        SettingInfo(
            "chat template for every chat request instead of the tokenizer's: a file, or the Jinja "
            "template itself on one line (\\n for newlines)",
            flag="--chat-template",
            metavar="FILE|TEMPLATE",
            docs="the Jinja chat template every chat request is rendered with instead of the tokenizer's, as "
            "vLLM's `--chat-template`: a file's path, or the template itself on one line (`\\n` for "
            "newlines); a file that cannot be read or a template that does not compile stops the start",
            docs_default="the tokenizer's",
        ),
    )
    # vLLM's --seed: requests without `seed` draw theirs from a generator seeded with it, so a
    # restart given the same requests in the same order samples the same answers.
    seed: int = setting(
        -1,
        SettingInfo(
            "seed of the generator that draws the seed of each request without `seed`; -1 = a fresh random seed each",
            flag="--seed",
            minimum=-1,
            metavar="N",
            docs="as vLLM's `--seed`: the seed of the generator that draws a seed for each request that "
            "sends none, so the same requests in the same order after a restart sample the same answers; "
            "a request's own `seed` still wins. Unset: a fresh random seed per request (vLLM's default is 0)",
            docs_default="unset (random)",
        ),
    )
