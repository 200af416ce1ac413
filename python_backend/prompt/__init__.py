"""Request inputs into prompt ids: the input tensors of a request, the chat template, and
multimodal media; and the Triton vLLM backend's dialect of the tensor contract (``vllm_compat``:
its requests in, its responses' tensors out, which the adapter writes). Imports protocol, text,
torch and transformers.
"""
