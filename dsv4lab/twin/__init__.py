"""The SGLang twin: a real process tree and HTTP server that behaves like SGLang on described hardware.

``python -m dsv4lab.twin`` takes ``python -m sglang.launch_server``'s command line for the emulated
release; twin-only settings come from ``DSV4LAB_TWIN_*`` environment variables (:mod:`.settings`). What
happens at startup (fits, or dies in which phase on which GPU by how much) and how fast it serves emerge
from :mod:`dsv4lab.model.memory` and the twin's own allocation and timing simulation — nothing is scripted per
preset. The package is split so that each module has one job:

========================  ============================================================================
``settings``              the ``DSV4LAB_TWIN_*`` environment (hardware, pace, fault, seed, ...)
``clock``                 the modelled clock every process of a twin shares (virtual time, or paced)
``faults``                the faults a user can rehearse
``args``                  SGLang's argparse surface per release, and the ServerConfig it describes
``logfmt``                SGLang's log prefix and line formats per release
``memsim``                per-rank startup memory simulation (weights, KV, graph capture, OOM point)
``startup``               what a scheduler rank process does and logs while starting
``procs``                 forking ranks and the detokenizer, death signals, tree teardown
``timing``                the roofline-style decode-step and prefill cost model
``scheduler``             the continuous-batching loop, a discrete-event simulation on that clock
``sessions``              announced benchmark runs: when each request arrives on the modelled clock
``http``                  the aiohttp server (OpenAI, native, health, info, metrics, profile)
``profiler``              torch-profiler-like Chrome traces from the timing model
``smi``                   the ``nvidia-smi`` stand-in and its state file
``__main__``              the launch sequence of the main process
========================  ============================================================================
"""

from __future__ import annotations

__all__ = ["TWIN_ENV_VARS"]

#: Every environment variable the twin reads (the launch line itself stays SGLang's).
TWIN_ENV_VARS = (
    "DSV4LAB_TWIN_HARDWARE",
    "DSV4LAB_TWIN_PACE",
    "DSV4LAB_TWIN_TIME_SCALE",
    "DSV4LAB_TWIN_FAULT",
    "DSV4LAB_TWIN_SEED",
    "DSV4LAB_TWIN_SGLANG_VERSION",
    "DSV4LAB_TWIN_KERNEL_CONFIG_DIR",
    "DSV4LAB_TWIN_STATE_DIR",
)
