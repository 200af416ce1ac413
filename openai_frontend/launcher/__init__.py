"""The ``triton-chat`` launcher: starts a real ``tritonserver`` with the chat model, then the frontend.

Modules: ``cli`` (argument parsing, the console script), ``serve`` (the start/stop sequence),
``triton_install`` (finding or preparing the ``tritonserver`` binary), ``tritonserver`` (one
server process: command line, readiness, shutdown), ``triton_endpoints`` (its private sockets,
or the ports asked for), ``local_http`` (HTTP over those sockets), ``triton_access`` (the
admin-API secret of an exposed listener, safe versions), ``tied_child`` (children that die with
``serve``), ``supervisor`` (restarts) and ``log_rotation`` (its log under a size),
``start_stages`` (the start's stage lines and progress, with the model's events),
``process_group`` (its stubs, found in ``/proc``), ``model_repo`` (the generated model repository),
``demo_model`` (the default SmolLM2 model), ``model_check`` and ``dtype_check`` (what is
checked before tritonserver starts), ``network`` (hosts and ports), ``cache`` (where the
launcher keeps what it prepares once). Nothing here imports torch; the demo conversion runs in
a child process.
"""
