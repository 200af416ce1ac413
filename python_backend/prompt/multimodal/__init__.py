"""Multimodal inputs for vision and audio chat models (Qwen2-VL, Qwen2.5-VL, Qwen2-Audio).

``media_decode`` turns the ``media`` tensor's bytes into pixels and samples, ``features`` turns
those into the model's extra inputs, ``processor`` joins them with the rendered prompt, and
``positions`` computes M-RoPE positions for the engine. See docs/multimodal.md.
"""
