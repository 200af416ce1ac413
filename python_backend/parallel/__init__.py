"""Tensor parallel: one model instance over several devices, one process per rank, on one node or
several.

Owns the ranks' process group (``group.py``), rank 0's rendezvous where the ranks of every node
meet (``rendezvous.py``), keeping their engines in step (``sync.py``, the engine's ``StepSync``),
starting, watching and stopping the other ranks from rank 0 (``ranks.py``), a node's rank
processes and the headless node's loop that keeps them joined (``node.py``, which the launcher's
``triton-chat worker`` execs), the worker process itself (``worker.py``) and ending a model's
process with its parent (``lifeline.py``, which Triton's stub uses too). Imports protocol,
engine, model, sampling, torch and transformers; never triton, the frontend or the launcher. The
engine never imports it: the adapter hands the engine its group.
"""
