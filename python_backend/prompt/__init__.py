"""Request inputs into prompt ids: the input tensors of a request, the chat template, and
multimodal media. Imports protocol, text, torch and transformers.
"""
