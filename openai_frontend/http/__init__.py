"""Cross-cutting HTTP concerns: authentication, body limit, drain, metrics, the error envelope and
client-disconnect cancellation. Imports protocol, client.base, fastapi and starlette.
"""
