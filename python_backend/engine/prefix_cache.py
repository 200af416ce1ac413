"""Prefix cache: keys and values of recent prompts, reused by prompts that start the same way.

Owns: ``PrefixCache``, an LRU store of per-layer keys/values for token sequences, bounded in
tokens, with the longest-common-prefix lookup the prefill uses to skip work, and ``PrefixHit``.
Chat traffic repeats itself at the front: a system prompt, tool definitions, the earlier turns of
a conversation. A hit skips those tokens' share of the prefill; the first token of a request whose
prompt was seen before costs about one decode step.

Lookup walks the prompt in blocks of ``BLOCK`` tokens through a chain of hashes (each block's key
hashes the previous key with the block's tokens, as vLLM's and SGLang's caches do), then compares
tokens one by one against the entry found, so a hit is exact to the token and never relies on a
hash alone. Entries are namespaced by LoRA adapter: an adapter changes every layer's keys/values.
Prompts with images, video or audio are not cached (their placeholder tokens do not say which
media they stand for). The engine thread alone uses it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

BLOCK = 16  # tokens per hash-chain block
LayerStates = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, T, dim]


@dataclass(frozen=True)
class PrefixHit:
    """The first ``tokens`` positions of a prompt, already computed."""

    tokens: int
    states: LayerStates  # views of the entry: [1, heads, tokens, dim] per layer

    def layer_slice(self, count: int) -> LayerStates:
        """The keys/values of the first ``count`` (<= tokens) positions."""
        return _first(self.states, count)


@dataclass(eq=False)
class _Entry:
    namespace: str
    tokens: tuple[int, ...]
    states: LayerStates
    chain: list[int] = field(default_factory=list)  # hash-chain keys of its whole blocks


def _chain_keys(namespace: str, tokens: tuple[int, ...] | list[int], limit: int) -> list[int]:
    """Keys of the first ``limit // BLOCK`` whole blocks."""
    keys: list[int] = []
    key = hash(("triton-chat-prefix", namespace))
    for start in range(0, limit - limit % BLOCK, BLOCK):
        key = hash((key, tuple(tokens[start : start + BLOCK])))
        keys.append(key)
    return keys


def _first(states: LayerStates, count: int) -> LayerStates:
    return [(k[:, :, :count], v[:, :, :count]) for k, v in states]


def _nbytes(states: LayerStates) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in states)


def _common_length(a: tuple[int, ...], b: list[int], start: int, limit: int) -> int:
    n = start
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class PrefixCache:
    """LRU prefix store of at most ``capacity_tokens`` token positions (all entries together)."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], _Entry] = OrderedDict()
        self._index: dict[int, list[_Entry]] = {}  # block-chain key -> entries holding it, newest last
        self.tokens_held = 0
        self.bytes_held = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_tokens > 0

    def lookup(self, prompt: list[int], namespace: str = "") -> PrefixHit | None:
        """The longest cached prefix of ``prompt``, leaving at least its last token to compute."""
        limit = len(prompt) - 1  # the last prompt token's logits give the first output token
        if not self.enabled or limit < BLOCK:
            return None
        found: _Entry | None = None
        blocks = 0
        for key in _chain_keys(namespace, prompt, limit):
            holders = self._index.get(key)
            if not holders:
                break
            found, blocks = holders[-1], blocks + 1
        if found is None:
            return None
        # The chain says the first blocks match; check them and extend past them token by token.
        if tuple(prompt[: blocks * BLOCK]) != found.tokens[: blocks * BLOCK]:
            return None
        matched = _common_length(found.tokens, prompt, blocks * BLOCK, min(limit, len(found.tokens)))
        self._entries.move_to_end((found.namespace, found.tokens))
        return PrefixHit(matched, _first(found.states, matched))

    def insert(self, tokens: list[int], states: LayerStates, namespace: str = "") -> None:
        """Keep ``states`` (per layer [1, heads, len(tokens), dim]; copied) for ``tokens``."""
        size = len(tokens)
        if not self.enabled or size < BLOCK or size > self.capacity_tokens:
            return
        key = (namespace, tuple(tokens))
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        chain = _chain_keys(namespace, key[1], size)
        # One dense copy each: the states are windows of a prefill's buffer (not contiguous),
        # which ``contiguous()`` would copy once more before a clone.
        dense = torch.contiguous_format
        copies = [(k.clone(memory_format=dense), v.clone(memory_format=dense)) for k, v in states]
        entry = _Entry(namespace, key[1], copies, chain)
        # An entry this one extends (an earlier turn of the same conversation) is redundant now.
        # Only the newest holder of each block is checked: that is where the earlier turn is.
        newest = (self._index[k][-1] for k in chain if k in self._index)
        shorter = {id(e): e for e in newest if entry.tokens[: len(e.tokens)] == e.tokens}
        for other in shorter.values():
            self._drop(other)
        for chain_key in chain:
            self._index.setdefault(chain_key, []).append(entry)
        self._entries[key] = entry
        self.tokens_held += size
        self.bytes_held += _nbytes(entry.states)
        while self.tokens_held > self.capacity_tokens:
            _key, oldest = next(iter(self._entries.items()))
            self._drop(oldest)

    def _drop(self, entry: _Entry) -> None:
        del self._entries[(entry.namespace, entry.tokens)]
        for chain_key in entry.chain:
            holders = self._index[chain_key]
            holders.remove(entry)
            if not holders:
                del self._index[chain_key]
        self.tokens_held -= len(entry.tokens)
        self.bytes_held -= _nbytes(entry.states)
