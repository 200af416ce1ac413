"""The inference core that runs inside Triton's Python backend: protocol (shared with the frontend),
engine, sampling, text, prompt, model, cpu, and the triton adapter (the only Triton-facing package).
"""
