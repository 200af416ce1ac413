"""Optional CPU speed paths (prepacked linear layers, merged projections, the lean decode step,
decode attention, native kernels); the engine runs without them. Imports protocol, torch and
transformers.
"""
