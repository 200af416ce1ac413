"""A Hugging Face folder onto a device: loading, device and dtype choice, LoRA adapters, compute
threads. Imports protocol, prompt, cpu, torch and transformers.
"""
