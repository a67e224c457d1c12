"""Typed, validated vLLM server configuration.

A :class:`VllmConfig` is to ``vllm serve`` what :class:`~dsv4lab.config.server_config.ServerConfig` is to
SGLang's launcher: frozen, so that a config recorded beside a result is the one that produced it, and
validated on construction, so that ``gpu_memory_utilization=1.5`` fails here with the field named rather
than after a model download. Its fields are spelled as vLLM's flags with underscores, so a vLLM user reads
them without a mapping table; which release spells a field how is :mod:`dsv4lab.config.vllm_releases`'
business, and a value only some releases accept is checked when rendering for one of them
(:mod:`dsv4lab.config.vllm_launch`), not here. It shares the field machinery (types, ``--set`` text,
overrides, TOML/JSON) with ServerConfig through :mod:`dsv4lab.config.fields`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import tomli_w

from dsv4lab.config import fields as _fields
from dsv4lab.config.fields import help_meta as _help
from dsv4lab.config.server_config import EnvVars
from dsv4lab.config.vllm_releases import VLLM_DTYPE_CHOICES, VLLM_RELEASES, flags_owned_by_vllm_fields
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError, UnknownNameError

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - exercised on Python 3.10 only
    pass

__all__ = [
    "VLLM_DTYPES",
    "VLLM_KV_CACHE_DTYPES",
    "VLLM_SPECULATIVE_METHODS",
    "VllmConfig",
    "VllmSpeculativeConfig",
    "field_help",
    "field_names",
]


def _union(lists: list[tuple[str, ...]]) -> tuple[str, ...]:
    out: list[str] = []
    for items in lists:
        out += [i for i in items if i not in out]
    return tuple(out)


#: ``--dtype`` values (the same in every supported release).
VLLM_DTYPES = VLLM_DTYPE_CHOICES
#: Every KV-cache dtype some supported vLLM release accepts; the renderer checks the chosen release's list.
VLLM_KV_CACHE_DTYPES = _union([r.kv_cache_dtypes for r in VLLM_RELEASES])
#: Every speculative method some supported vLLM release accepts; the renderer checks the chosen release's.
VLLM_SPECULATIVE_METHODS = _union([r.speculative_methods for r in VLLM_RELEASES])


@dataclass(frozen=True)
class VllmSpeculativeConfig:
    """Speculative decoding, as the keys of vLLM's ``--speculative-config`` JSON (unset keys are left out)."""

    method: str | None = field(
        default=None,
        metadata=_help("speculative method (ngram, eagle3, mtp, ...); unset = vLLM detects it from model"),
    )
    model: str | None = field(
        default=None, metadata=_help("draft model, EAGLE head or extra weights: a Hugging Face id or a path")
    )
    num_speculative_tokens: int | None = field(
        default=None, metadata=_help("tokens drafted per step; unset = the draft model's own number")
    )
    draft_tensor_parallel_size: int | None = field(
        default=None, metadata=_help("tensor-parallel size of the draft model: 1 or the target's")
    )
    prompt_lookup_min: int | None = field(default=None, metadata=_help("ngram only: smallest n-gram matched"))
    prompt_lookup_max: int | None = field(default=None, metadata=_help("ngram only: largest n-gram matched"))
    enforce_eager: bool | None = field(
        default=None, metadata=_help("run the draft without CUDA graphs; unset = as the target (vLLM 0.11+)")
    )

    def __post_init__(self) -> None:
        where = "speculative"
        if not self.enabled:
            set_fields = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]
            if set_fields:
                raise ConfigError(
                    f"{where}.method",
                    None,
                    f"{', '.join(set_fields)} {plural(len(set_fields), 'needs', 'need', number=False)} a method, "
                    "a draft model, or num_speculative_tokens alone (the target checkpoint's own MTP head)",
                )
            return
        if self.method is not None and self.method not in VLLM_SPECULATIVE_METHODS:
            raise UnknownNameError("speculative method", self.method, VLLM_SPECULATIVE_METHODS, field=f"{where}.method")
        if self.model is not None:
            _fields.no_control_chars(f"{where}.model", self.model)
            if not self.model.strip():
                raise ConfigError(f"{where}.model", self.model, "a non-empty Hugging Face id or path, or unset")
        for name in ("num_speculative_tokens", "draft_tensor_parallel_size", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{where}.{name}", value, "an integer >= 1, or unset")
        lookup = [n for n in ("prompt_lookup_min", "prompt_lookup_max") if getattr(self, n) is not None]
        if lookup and self.method != "ngram":
            raise ConfigError(
                f"{where}.{lookup[0]}", getattr(self, lookup[0]), "set only with method 'ngram' (the prompt lookup)"
            )
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise ConfigError(f"{where}.prompt_lookup_min", low, f"at most prompt_lookup_max={high}")

    @property
    def enabled(self) -> bool:
        """vLLM drafts when it is told a method, a draft model, or only how many tokens (an MTP head)."""
        return self.method is not None or self.model is not None or self.num_speculative_tokens is not None


@dataclass(frozen=True)
class VllmConfig:
    """How one vLLM server (``vllm serve``) is launched: the flags and the environment."""

    #: The engine this config launches (ServerConfig says ``"sglang"``): code that takes either asks it.
    engine: ClassVar[str] = "vllm"

    model_path: str = field(metadata=_help("model weights: a Hugging Face id or a path on the server host"))
    served_model_name: str | None = field(
        default=None, metadata=_help("name the OpenAI API reports; unset = model_path")
    )
    host: str = field(
        default="127.0.0.1",
        metadata=_help("address the HTTP server binds (always rendered: vLLM's own default is every interface)"),
    )
    port: int = field(default=8000, metadata=_help("HTTP port of the server"))
    tensor_parallel_size: int = field(default=1, metadata=_help("tensor-parallel size (GPUs per pipeline stage)"))
    pipeline_parallel_size: int = field(default=1, metadata=_help("pipeline-parallel stages"))
    gpu_memory_utilization: float | None = field(
        default=None,
        metadata=_help("share of each GPU's memory vLLM may use (0 < f <= 1); unset = vLLM's (0.9; 0.92 in 0.32)"),
    )
    kv_cache_memory_bytes: int | None = field(
        default=None,
        metadata=_help("KV cache per GPU in bytes, instead of sizing it from gpu_memory_utilization (vLLM 0.10.2+)"),
    )
    max_model_len: int | None = field(default=None, metadata=_help("context length; unset = the model's"))
    max_num_seqs: int | None = field(default=None, metadata=_help("cap on sequences in one step (running requests)"))
    max_num_batched_tokens: int | None = field(default=None, metadata=_help("cap on tokens scheduled in one step"))
    dtype: str | None = field(default=None, metadata=_help(f"weights and activations dtype: {', '.join(VLLM_DTYPES)}"))
    kv_cache_dtype: str | None = field(default=None, metadata=_help("KV cache dtype (auto, fp8, ...); unset = auto"))
    enforce_eager: bool = field(default=False, metadata=_help("run without CUDA graphs (slower decode, no capture)"))
    block_size: int | None = field(default=None, metadata=_help("KV cache block in tokens; unset = vLLM's choice"))
    enable_prefix_caching: bool | None = field(
        default=None, metadata=_help("reuse KV of shared prompt prefixes; unset = vLLM's default (on in V1)")
    )
    enable_chunked_prefill: bool | None = field(
        default=None, metadata=_help("split long prefills over steps; unset = vLLM's default")
    )
    cudagraph_capture_sizes: tuple[int, ...] | None = field(
        default=None, metadata=_help("exact batch sizes captured as CUDA graphs, ascending")
    )
    max_cudagraph_capture_size: int | None = field(
        default=None, metadata=_help("largest batch captured as a CUDA graph (smaller sizes chosen by vLLM)")
    )
    speculative: VllmSpeculativeConfig | None = field(
        default=None, metadata=_help("speculative decoding (--speculative-config); unset = off")
    )
    env: Mapping[str, str] = field(
        default_factory=EnvVars,
        metadata=_help("environment for the server, e.g. VLLM_CPU_KVCACHE_SPACE=4, CUDA_VISIBLE_DEVICES"),
    )
    extra_args: tuple[str, ...] = field(
        default=(), metadata=_help("further vllm serve flags passed through as given, e.g. --seed 0")
    )

    def __post_init__(self) -> None:
        # Normalise containers so that equal configs compare and hash equal whatever the caller passed.
        if not isinstance(self.env, EnvVars):
            if not isinstance(self.env, Mapping):
                raise ConfigError("env", self.env, "a mapping of variable names to string values")
            object.__setattr__(self, "env", EnvVars(self.env))
        if isinstance(self.extra_args, str) or not isinstance(self.extra_args, (list, tuple)):
            raise ConfigError("extra_args", self.extra_args, "a list of strings")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        sizes = self.cudagraph_capture_sizes
        if sizes is not None:
            if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (list, tuple)):
                raise ConfigError("cudagraph_capture_sizes", sizes, "a list of batch sizes")
            object.__setattr__(self, "cudagraph_capture_sizes", tuple(sizes))
        if isinstance(self.speculative, Mapping):
            spec = _fields.nested_from_dict(VllmSpeculativeConfig, dict(self.speculative), "speculative")
            object.__setattr__(self, "speculative", spec)
        _fields.check_types(VllmConfig, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if isinstance(self.gpu_memory_utilization, int):  # TOML/JSON may hand over 1 for 1.0
            object.__setattr__(self, "gpu_memory_utilization", float(self.gpu_memory_utilization))
        self._validate()

    # -- validation -------------------------------------------------------------------------------

    def _validate(self) -> None:
        _fields.no_control_chars("model_path", self.model_path)
        if not self.model_path.strip():
            raise ConfigError("model_path", self.model_path, "a non-empty Hugging Face id or path")
        if self.model_path.startswith("-"):
            raise ConfigError("model_path", self.model_path, "a path or id that does not start with '-'")
        if self.served_model_name is not None:
            _fields.no_control_chars("served_model_name", self.served_model_name)
            if not self.served_model_name.strip():
                raise ConfigError("served_model_name", self.served_model_name, "a non-empty name or unset")
        if not _fields.HOST.match(self.host):
            raise ConfigError("host", self.host, "a host name or IP address (letters, digits, . : - [ ])")
        if not 1 <= self.port <= 65535:
            raise ConfigError("port", self.port, "an integer from 1 to 65535")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "an integer >= 1")
        f = self.gpu_memory_utilization
        if f is not None and not (math.isfinite(f) and 0.0 < f <= 1.0):
            raise ConfigError("gpu_memory_utilization", f, "a number in (0, 1], or unset")
        for name in (
            "kv_cache_memory_bytes",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "max_cudagraph_capture_size",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(name, value, "an integer >= 1, or unset")
        if self.dtype is not None and self.dtype not in VLLM_DTYPES:
            raise UnknownNameError("dtype", self.dtype, VLLM_DTYPES, field="dtype")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in VLLM_KV_CACHE_DTYPES:
            raise UnknownNameError("kv_cache_dtype", self.kv_cache_dtype, VLLM_KV_CACHE_DTYPES, field="kv_cache_dtype")
        self._check_graphs()
        _fields.check_env(self.env)
        _fields.check_flag_list(self.extra_args, flags_owned_by_vllm_fields, example="--seed")

    def _check_graphs(self) -> None:
        sizes, largest = self.cudagraph_capture_sizes, self.max_cudagraph_capture_size
        if sizes is not None and (not sizes or any(b < 1 for b in sizes) or list(sizes) != sorted(set(sizes))):
            raise ConfigError(
                "cudagraph_capture_sizes", list(sizes), "a non-empty, strictly ascending list of integers >= 1"
            )
        if sizes is not None and largest is not None and largest != sizes[-1]:
            raise ConfigError(
                "max_cudagraph_capture_size",
                largest,
                f"the largest of cudagraph_capture_sizes ({sizes[-1]}), or unset",
                detail="vLLM requires the two to agree",
            )
        if self.enforce_eager and (sizes is not None or largest is not None):
            raise ConfigError(
                "enforce_eager",
                True,
                "false when cudagraph_capture_sizes or max_cudagraph_capture_size is set "
                "(graphs cannot be both off and sized)",
            )

    # -- conveniences -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The model name clients must send (vLLM defaults it to the model path)."""
        return self.served_model_name or self.model_path

    @property
    def speculative_enabled(self) -> bool:
        return self.speculative is not None and self.speculative.enabled

    def replace(self, **changes: Any) -> VllmConfig:
        """A copy with some fields changed (validated like a new config)."""
        return dataclasses.replace(self, **changes)

    def with_overrides(self, overrides: Mapping[str, str]) -> VllmConfig:
        """Apply ``field=value`` strings as typed by a user (CLI ``--set``, papermill parameters).

        Dotted names reach nested settings (``speculative.num_speculative_tokens=2``,
        ``env.VLLM_CPU_KVCACHE_SPACE=1``); the literal ``none`` unsets an optional field.
        """
        data = self.to_dict()
        for key, raw in overrides.items():
            _fields.apply_override(data, key, raw, VllmConfig, _NESTED)
        return VllmConfig.from_dict(data)

    def with_values(self, values: Mapping[str, Any]) -> VllmConfig:
        """Apply overrides given as Python values *or* as text, by field name (the rules of
        :meth:`ServerConfig.with_values <dsv4lab.config.server_config.ServerConfig.with_values>`:
        ``speculative__method`` for the dot, ``None`` unsets, text parsed as the field's type)."""
        data = self.to_dict()
        _fields.apply_values(data, values, VllmConfig, _NESTED)
        return VllmConfig.from_dict(data)

    def to_dict(self, *, redact: bool = False) -> dict[str, Any]:
        """Plain data (lists, dicts, scalars), unset fields omitted: the TOML/JSON form.

        ``redact`` replaces secret values (``env.HF_TOKEN``, ``--api-key ...``; :mod:`dsv4lab.secrets`) with
        a placeholder: the form for files people read.
        """
        return _fields.config_data(self, _NESTED, redact=redact)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VllmConfig:
        """Build from plain data, rejecting unknown keys by name."""
        return _fields.from_plain(cls, data, _NESTED, required=_REQUIRED)

    def to_toml(self, *, redact: bool = False) -> str:
        return tomli_w.dumps(self.to_dict(redact=redact))

    @classmethod
    def from_toml(cls, text: str) -> VllmConfig:
        return cls.from_dict(_fields.data_from_toml(text))

    def to_json(self, *, redact: bool = False) -> str:
        return json.dumps(self.to_dict(redact=redact), indent=2)

    @classmethod
    def from_json(cls, text: str) -> VllmConfig:
        return cls.from_dict(_fields.data_from_json(text))

    def flat(self) -> dict[str, Any]:
        """Every setting under its dotted name (``speculative.method``, ``env.VLLM_CPU_KVCACHE_SPACE``)."""
        return _fields.flatten(self, _NESTED)

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv
        from dsv4lab.secrets import collect_secrets, redact_data

        shown = redact_data(self.flat(), collect_secrets(self))  # a notebook output: no token
        rows = [{"field": k, "value": _fields.fmt(v), "meaning": field_help(k)} for k, v in shown.items()]
        return hv.card(f"vLLM config ({self.name})", hv.table(rows, max_rows=12))


#: VllmConfig's one nested table, for the shared field machinery.
_NESTED: Mapping[str, type] = {"speculative": VllmSpeculativeConfig}
_REQUIRED = {"model_path": "required: a Hugging Face id or a path on the server host"}


def field_names() -> list[str]:
    """Every settable VllmConfig name, nested ones dotted (``speculative.num_speculative_tokens``)."""
    return _fields.field_names_of(VllmConfig, _NESTED)


def field_help(name: str) -> str:
    """The one-line help of a VllmConfig field (dotted for nested; ``env.X`` gets the env help)."""
    return _fields.field_help_of(VllmConfig, _NESTED, name)
