"""The OpenAI/MindIE-compatible HTTP frontend and the triton-chat launcher: chat, http, client, media,
routes and launcher. Imports python_backend.protocol only, never the engine or torch.
"""
