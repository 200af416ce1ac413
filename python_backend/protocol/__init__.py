"""What both processes share: tensor names and specs, deltas and their wire forms, errors,
generation parameters, message rules and engine settings. Imports the standard library and
numpy only: the frontend and the launcher import nothing else of the backend. What only the
backend uses lives in the backend's packages (the vLLM backend's dialect: ``prompt.vllm_compat``).
"""
