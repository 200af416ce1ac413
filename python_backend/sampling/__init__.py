"""Choosing each row's next token: per-request sampling rules and grammar-constrained decoding.
Imports protocol, torch, transformers and xgrammar.
"""
