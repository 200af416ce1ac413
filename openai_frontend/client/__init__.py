"""The frontend's seam to the model: the ChatBackend interface and its Triton implementation, the
only importer of tritonclient and grpc. Imports protocol and aio.
"""
