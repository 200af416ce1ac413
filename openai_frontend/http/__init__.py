"""Cross-cutting HTTP concerns: authentication, body and header limits, the connection cap and
request deadlines, drain, metrics, the error envelope, safe response headers, the OpenAPI
document's finishing and client-disconnect cancellation. Imports protocol, client.base, settings,
aio, fastapi, starlette and (for the protocol-level limits) uvicorn.
"""
