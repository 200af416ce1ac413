"""The Triton Python-backend adapter, the only importer of triton_python_backend_utils: the model
class, the response sender, response channels and engine metrics. Imports every backend package.
"""
