"""Tensor parallel: one model instance over several devices, one process per rank.

Owns the ranks' process group (``group.py``), keeping their engines in step (``sync.py``, the
engine's ``StepSync``), starting, watching and stopping the worker processes from rank 0
(``ranks.py``), the worker process itself (``worker.py``) and ending a model's process with its
parent (``lifeline.py``, which Triton's stub uses too). Imports protocol, engine, model,
sampling, torch and transformers; never triton, the frontend or the launcher. The engine never
imports it: the adapter hands the engine its group.
"""
