"""The transport-free engine: the step loop, admission and scheduling, prefill, decode, n-gram
speculative decoding, beam search, the KV and prefix caches, limits and liveness. Imports
protocol, sampling, text, prompt, model, cpu (which imports none of the engine), numpy, torch and
transformers; never parallel (its group is handed in), triton, the frontend or the launcher. The
scheduler's side (scheduler.py, admission.py, request.py) imports no torch, so its decisions are
tested without a model.
"""
