"""Test doubles shared across the test packages: a fake of Triton's Python-backend module
(``pb_utils``) and scripted gRPC streams and clients (``grpc``). Importing them changes nothing:
installing the fake module is a fixture's job.
"""
