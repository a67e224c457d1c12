"""The config layer: what a server is asked to be, before anything runs.

``server_config`` (ServerConfig, SpeculativeConfig: typed, frozen, validated; TOML/JSON; ``diff``),
``hardware`` (GPU hosts and models as data), ``versions`` (what each SGLang release calls its flags),
``launch_script`` (argv, env file and launch script for a release), ``presets`` (the story's configs);
for vLLM, ``vllm_config`` (VllmConfig, VllmSpeculativeConfig), ``vllm_releases`` (what each vLLM release
calls its ``vllm serve`` flags) and ``vllm_launch`` (its argv and environment); ``fields`` is the typed-field
machinery both configs share. It imports only the base modules. ``from dsv4lab.config import ServerConfig``
(or ``VllmConfig``) is the config's public name.
"""

from __future__ import annotations

from dsv4lab.config.server_config import (
    KV_CACHE_DTYPES,
    SPECULATIVE_ALGORITHMS,
    ConfigChange,
    ConfigDiff,
    EnvVars,
    ServerConfig,
    SpeculativeConfig,
    diff,
    field_help,
    field_names,
    load,
    save,
)
from dsv4lab.config.vllm_config import VllmConfig, VllmSpeculativeConfig

#: A config of any engine: SGLang's flags (the twin and SGLang) or vLLM's.
AnyConfig = ServerConfig | VllmConfig

__all__ = [
    "KV_CACHE_DTYPES",
    "SPECULATIVE_ALGORITHMS",
    "AnyConfig",
    "ConfigChange",
    "ConfigDiff",
    "EnvVars",
    "ServerConfig",
    "SpeculativeConfig",
    "VllmConfig",
    "VllmSpeculativeConfig",
    "diff",
    "field_help",
    "field_names",
    "load",
    "save",
]
