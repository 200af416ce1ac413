"""Optional CPU speed paths (prepacked linear layers, merged projections, the lean decode step,
decode attention, native kernels); the engine runs without them. May import protocol, torch and
transformers, nothing else of ours: it sits below the engine and the model loader, which import
it. The lean step's inputs (``fast_decode.DecodeRows``, ``PromptSegment``) take any transformers
cache, so the engine's own (``engine/batch_cache.py``) passes through unnamed.
"""
