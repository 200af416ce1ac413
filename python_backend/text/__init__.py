"""Tokens into what the user reads: incremental detokenization, stop strings, token text for
logprobs, reasoning split and tool-call parsing (every hold-back rule). Imports protocol and
transformers.
"""
