"""The one way into the engine: contract inputs in, an ``EngineRequest`` out.

Owns ``Intake`` (the chat template, prompt token ids, media, the output plan, the grammar of a
``response_format``, and the request the engine takes) and ``RequestPreparer`` (the same steps off
the caller's thread, each under its deadline). The Triton adapter, the tensor-parallel ranks and
the benchmarks all build their requests here, so a request is read the same way whoever sends it.
Imports protocol, prompt, text, sampling, model (the loaded model's parts) and the engine's request
types and admission rule; never parallel, triton, the frontend or the launcher, and the engine
never imports it (it sits above the engine, below parallel and triton). No transport: a caller
hands in numpy arrays by name and a ``Connection`` (where events go, how cancellation is asked).
"""
