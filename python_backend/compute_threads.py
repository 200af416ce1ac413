"""Which thread runs PyTorch's parallel CPU work, and with how many OpenMP threads.

Owns ``serialize_current_thread`` and ``engine_thread_count``. PyTorch's CPU build uses GNU
OpenMP, which gives every thread that enters a parallel region its own team of worker threads.
When the thread that loaded the model (Triton's stub thread) has a team and the engine thread
starts a second one, libgomp counts more threads than cores and switches every team to
near-zero spinning, so each of the thousand small parallel regions in a decode step waits on a
futex wake-up. Measured on the 2-core test machine (SmolLM2-135M, bfloat16): a decode step took
47 ms at batch 1 and 66 ms at batch 16 on the engine thread, against 30 and 48 ms when the
loading thread never had a team. So the loading thread runs torch serially, and only the engine
thread (which runs every forward pass) uses several threads.
"""

from __future__ import annotations

import torch


def engine_thread_count(requested: int) -> int:
    """The engine's intra-op threads: ``requested`` if set, else the calling thread's torch count."""
    return requested if requested > 0 else torch.get_num_threads()


def serialize_current_thread() -> int:
    """Keep this thread's torch work on itself, so it never starts an OpenMP team of its own.

    Call it on the thread that loads the model and serves requests, before any torch work there;
    returns the thread count torch had chosen, for the engine thread to use instead (``Engine``
    sets it when its thread starts).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads
