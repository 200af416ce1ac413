"""The Triton Python-backend adapter, the only importer of triton_python_backend_utils: the model
class (``model``), the sender thread and response links (``sender``), response channels
(``channels``) and engine metrics (``metrics``). Imports every backend package.
"""
