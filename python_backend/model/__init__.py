"""A Hugging Face folder onto a device: loading (and its start-up progress, for the launcher),
device and dtype choice, LoRA adapters, compute threads. Imports protocol, prompt, cpu, torch and
transformers.
"""
