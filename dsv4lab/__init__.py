"""dsv4lab: launch, watch, diagnose and benchmark SGLang servers from Jupyter, with a local twin.

The notebook API in one import::

    from dsv4lab import Lab
    lab = Lab(host="local", target="twin")
    a = lab.launch("config_a").wait()
    a.bench(concurrency=[1, 16])

Names are loaded on first use: the twin's processes and the command line import this package too, and
must not pay for pandas, aiohttp and paramiko they never touch.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from dsv4lab.resources import __version__

# jsonschema (behind Altair, nbformat and papermill) imports the optional IRI checker ``rfc3987_syntax``
# when it is installed (jupyter-events pulls it in), and that package compiles a parser grammar at import:
# about 4 s on every kernel start and every command. Nothing dsv4lab validates has IRI-format fields, so
# the checker is left out (jsonschema skips a checker whose import fails). Measured in benchmarks/imports.py.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "ABComparison": "dsv4lab.bench",
    "ABRuns": "dsv4lab.bench",
    "BenchError": "dsv4lab.errors",
    "BenchResult": "dsv4lab.bench",
    "BenchRuns": "dsv4lab.bench",
    "CommandError": "dsv4lab.errors",
    "ConfigError": "dsv4lab.errors",
    "DSV4LabError": "dsv4lab.errors",
    "Diagnosis": "dsv4lab.logs",
    "HardwareProfile": "dsv4lab.config.hardware",
    "Host": "dsv4lab.hosts",
    "HostConnectionError": "dsv4lab.errors",
    "HostError": "dsv4lab.errors",
    "HostKeyError": "dsv4lab.errors",
    "HostSetupError": "dsv4lab.errors",
    "Interrupted": "dsv4lab.errors",
    "KernelBreakdown": "dsv4lab.serving.profiling",
    "Lab": "dsv4lab.notebook.lab",
    "LaunchError": "dsv4lab.errors",
    "LoadSpec": "dsv4lab.bench",
    "LocalHost": "dsv4lab.hosts",
    "NotebookError": "dsv4lab.errors",
    "Preflight": "dsv4lab.model.memory",
    "ProfileError": "dsv4lab.errors",
    "Readiness": "dsv4lab.serving.watch",
    "SSHHost": "dsv4lab.hosts",
    "Server": "dsv4lab.notebook.server",
    "ServerConfig": "dsv4lab.config.server_config",
    "SpeculativeConfig": "dsv4lab.config.server_config",
    "StaleServerError": "dsv4lab.errors",
    "Verdict": "dsv4lab.serving.watch",
    "VllmConfig": "dsv4lab.config.vllm_config",
    "VllmSpeculativeConfig": "dsv4lab.config.vllm_config",
    "attach": "dsv4lab.serving.launch",
    "compare": "dsv4lab.bench",
    "config_a": "dsv4lab.config.presets",
    "config_b": "dsv4lab.config.presets",
    "config_b_fixed": "dsv4lab.config.presets",
    "diagnose_with_model": "dsv4lab.model.diagnosis",
    "hardware_profile": "dsv4lab.config.hardware",
    "kernel_breakdown": "dsv4lab.serving.profiling",
    "open_host": "dsv4lab.hosts",
    "preflight": "dsv4lab.model.memory",
    "preset": "dsv4lab.config.presets",
    "random_workload": "dsv4lab.bench",
    "suggest": "dsv4lab.model.memory",
    "wait_ready": "dsv4lab.serving.watch",
}

__all__ = [
    "ABComparison",
    "ABRuns",
    "BenchError",
    "BenchResult",
    "BenchRuns",
    "CommandError",
    "ConfigError",
    "DSV4LabError",
    "Diagnosis",
    "HardwareProfile",
    "Host",
    "HostConnectionError",
    "HostError",
    "HostKeyError",
    "HostSetupError",
    "Interrupted",
    "KernelBreakdown",
    "Lab",
    "LaunchError",
    "LoadSpec",
    "LocalHost",
    "NotebookError",
    "Preflight",
    "ProfileError",
    "Readiness",
    "SSHHost",
    "Server",
    "ServerConfig",
    "SpeculativeConfig",
    "StaleServerError",
    "Verdict",
    "VllmConfig",
    "VllmSpeculativeConfig",
    "__version__",
    "attach",
    "compare",
    "config_a",
    "config_b",
    "config_b_fixed",
    "diagnose_with_model",
    "hardware_profile",
    "kernel_breakdown",
    "open_host",
    "preflight",
    "preset",
    "random_workload",
    "suggest",
    "wait_ready",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dsv4lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from dsv4lab.bench import ABComparison, ABRuns, BenchResult, BenchRuns, LoadSpec, compare, random_workload
    from dsv4lab.config.hardware import HardwareProfile, hardware_profile
    from dsv4lab.config.presets import config_a, config_b, config_b_fixed, preset
    from dsv4lab.config.server_config import ServerConfig, SpeculativeConfig
    from dsv4lab.config.vllm_config import VllmConfig, VllmSpeculativeConfig
    from dsv4lab.errors import (
        BenchError,
        CommandError,
        ConfigError,
        DSV4LabError,
        HostConnectionError,
        HostError,
        HostKeyError,
        HostSetupError,
        Interrupted,
        LaunchError,
        NotebookError,
        ProfileError,
        StaleServerError,
    )
    from dsv4lab.hosts import Host, LocalHost, SSHHost, open_host
    from dsv4lab.logs import Diagnosis
    from dsv4lab.model.diagnosis import diagnose_with_model
    from dsv4lab.model.memory import Preflight, preflight, suggest
    from dsv4lab.notebook.lab import Lab
    from dsv4lab.notebook.server import Server
    from dsv4lab.serving.launch import attach
    from dsv4lab.serving.profiling import KernelBreakdown, kernel_breakdown
    from dsv4lab.serving.watch import Readiness, Verdict, wait_ready
