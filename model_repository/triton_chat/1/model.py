"""Triton's entry point for the triton_chat model: the real code lives in ``python_backend``.

The Python backend stub imports this file by path; ``python_backend`` must be importable from
the stub's interpreter (installed in its environment, or on PYTHONPATH as the launcher sets it).
"""

from python_backend.triton.model import TritonPythonModel

__all__ = ["TritonPythonModel"]
