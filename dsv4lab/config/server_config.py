"""Typed, validated SGLang server configuration.

A :class:`ServerConfig` is the one description of "how this server is launched" that every other part
of dsv4lab reads: the version-aware renderer turns it into argv and a launch script, the memory model
predicts whether it fits, reports diff two of them. It is frozen so that a config recorded next to a
result is the config that produced it, and validated on construction so that a bad value fails here,
with the field named, rather than five minutes into a launch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import tomli_w

from dsv4lab.config import fields as _fields
from dsv4lab.config.fields import HOST as _HOST
from dsv4lab.config.fields import fmt as _fmt
from dsv4lab.config.fields import help_meta as _help
from dsv4lab.config.fields import no_control_chars as _no_control_chars
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError, UnknownNameError

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - exercised on Python 3.10 only
    pass

__all__ = [
    "KV_CACHE_DTYPES",
    "SPECULATIVE_ALGORITHMS",
    "ConfigChange",
    "ConfigDiff",
    "EnvVars",
    "ServerConfig",
    "SpeculativeConfig",
    "diff",
    "field_help",
    "field_names",
    "load",
    "save",
]

#: Every speculative algorithm some supported SGLang release accepts; a release may accept fewer
#: (the renderer checks that).
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")

#: Every KV-cache dtype some supported SGLang release accepts; per-release lists live in ``versions``.
KV_CACHE_DTYPES = (
    "auto",
    "fp8_e5m2",
    "fp8_e4m3",
    "mxfp8",
    "bf16",
    "bfloat16",
    "fp4_e2m1",
    "nvfp4",
    "fp4_mx_block16",
)

_QUANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


class EnvVars(Mapping[str, str]):
    """An immutable, hashable, ordered mapping of environment variables.

    A plain dict would make :class:`ServerConfig` unhashable and mutable behind its frozen front; the
    order is kept because the rendered env file should read in the order the user wrote it.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items: tuple[tuple[str, str], ...] = tuple((items or {}).items())

    def __getitem__(self, key: str) -> str:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"EnvVars({dict(self._items)!r})"


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (EAGLE / MTP and friends)."""

    algorithm: str | None = field(
        default=None,
        metadata=_help("speculative algorithm (EAGLE = MTP/NextN for DeepSeek); none disables it"),
    )
    num_steps: int | None = field(default=None, metadata=_help("draft depth: draft steps per verify step"))
    eagle_topk: int | None = field(default=None, metadata=_help("draft branching per step (DeepSeek-V4: 1)"))
    num_draft_tokens: int | None = field(
        default=None, metadata=_help("tokens verified per request per step; with topk 1 it must be steps + 1")
    )
    draft_model_path: str | None = field(
        default=None,
        metadata=_help("draft weights; unset = the NextN head inside the base checkpoint"),
    )

    def __post_init__(self) -> None:
        where = "speculative"
        if self.algorithm is None:
            set_fields = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]
            if set_fields:
                raise ConfigError(
                    f"{where}.algorithm",
                    None,
                    f"{', '.join(set_fields)} {plural(len(set_fields), 'needs', 'need', number=False)} an algorithm, "
                    f"one of {', '.join(SPECULATIVE_ALGORITHMS)}",
                )
            return
        if self.algorithm not in SPECULATIVE_ALGORITHMS:
            raise UnknownNameError(
                "speculative algorithm", self.algorithm, SPECULATIVE_ALGORITHMS, field=f"{where}.algorithm"
            )
        for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{where}.{name}", value, "an integer >= 1")
        steps, topk, drafts = self.num_steps, self.eagle_topk, self.num_draft_tokens
        given = [v is not None for v in (steps, topk, drafts)]
        if any(given) and not all(given):
            raise ConfigError(
                f"{where}.num_steps/eagle_topk/num_draft_tokens",
                (steps, topk, drafts),
                "set all three or none (none lets SGLang pick its per-model default, e.g. 3/1/4 for DeepSeek)",
            )
        if steps is not None and topk is not None and drafts is not None:
            if topk == 1 and drafts != steps + 1:
                raise ConfigError(
                    f"{where}.num_draft_tokens",
                    drafts,
                    f"with eagle_topk 1 it must be num_steps + 1 = {steps + 1}",
                    detail="SGLang would silently change it to that value",
                )
            if drafts > steps * topk + 1:
                raise ConfigError(
                    f"{where}.num_draft_tokens",
                    drafts,
                    f"at most num_steps x eagle_topk + 1 = {steps * topk + 1} (the draft tree has no more nodes)",
                )
        if self.draft_model_path is not None and not self.draft_model_path.strip():
            raise ConfigError(f"{where}.draft_model_path", self.draft_model_path, "a non-empty path or unset")

    @property
    def enabled(self) -> bool:
        return self.algorithm is not None


@dataclass(frozen=True)
class ServerConfig:
    """How one SGLang server is launched: the flags, the environment and the files around them."""

    #: The engine this config launches: code that takes either config (``VllmConfig`` says ``"vllm"``) asks it.
    engine: ClassVar[str] = "sglang"

    model_path: str = field(metadata=_help("model weights: a Hugging Face id or a path on the server host"))
    served_model_name: str | None = field(
        default=None, metadata=_help("name the OpenAI API reports; unset = model_path")
    )
    tp: int = field(default=1, metadata=_help("tensor-parallel size (GPUs per replica, across all nodes)"))
    dp: int = field(default=1, metadata=_help("data-parallel replicas"))
    host: str = field(default="127.0.0.1", metadata=_help("address the HTTP server binds on the server host"))
    port: int = field(default=30000, metadata=_help("HTTP port of the server"))
    mem_fraction_static: float | None = field(
        default=None,
        metadata=_help("share of free GPU memory for weights + KV pool; graphs live in the rest (0 < f < 1)"),
    )
    cuda_graph_max_bs: int | None = field(
        default=None,
        metadata=_help("largest decode batch captured as a CUDA graph (lower it on capture OOM)"),
    )
    cuda_graph_bs: tuple[int, ...] | None = field(
        default=None, metadata=_help("exact decode batch sizes to capture, ascending")
    )
    disable_cuda_graph: bool = field(default=False, metadata=_help("run without CUDA graphs (much slower)"))
    max_running_requests: int | None = field(default=None, metadata=_help("cap on concurrently running requests"))
    chunked_prefill_size: int | None = field(
        default=None, metadata=_help("prefill chunk in tokens; -1 disables chunking")
    )
    context_length: int | None = field(default=None, metadata=_help("maximum context length in tokens"))
    kv_cache_dtype: str | None = field(default=None, metadata=_help(f"KV cache dtype: {', '.join(KV_CACHE_DTYPES)}"))
    quantization: str | None = field(
        default=None, metadata=_help("weight quantization method; unset = read from the checkpoint")
    )
    trust_remote_code: bool = field(default=False, metadata=_help("allow custom model code from the checkpoint"))
    enable_metrics: bool = field(default=False, metadata=_help("serve Prometheus metrics on /metrics"))
    speculative: SpeculativeConfig | None = field(
        default=None, metadata=_help("speculative decoding settings; unset = off")
    )
    nnodes: int = field(default=1, metadata=_help("number of nodes the server spans"))
    node_rank: int = field(default=0, metadata=_help("this node's rank, 0 .. nnodes-1"))
    dist_init_addr: str | None = field(
        default=None, metadata=_help("HOST:PORT of node 0 for multi-node init (required when nnodes > 1)")
    )
    env: Mapping[str, str] = field(
        default_factory=EnvVars,
        metadata=_help("environment for the server, e.g. NCCL_PROTO=LL, NCCL_ALGO=Ring, CUDA_VISIBLE_DEVICES"),
    )
    env_files: tuple[str, ...] = field(
        default=(), metadata=_help("shell files on the host sourced before launch, in order")
    )
    kernel_config_dir: str | None = field(
        default=None,
        metadata=_help("directory on the host with tuned FP8 block-GEMM kernel JSONs to install"),
    )
    extra_args: tuple[str, ...] = field(
        default=(), metadata=_help("further launch flags passed through as given, e.g. --attention-backend X")
    )

    def __post_init__(self) -> None:
        # Normalise containers so that equal configs compare and hash equal whatever the caller passed.
        if not isinstance(self.env, EnvVars):
            if not isinstance(self.env, Mapping):
                raise ConfigError("env", self.env, "a mapping of variable names to string values")
            object.__setattr__(self, "env", EnvVars(self.env))
        for name in ("env_files", "extra_args"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise ConfigError(name, value, "a list of strings")
            object.__setattr__(self, name, tuple(value))
        if self.cuda_graph_bs is not None:
            if isinstance(self.cuda_graph_bs, (str, bytes)) or not isinstance(self.cuda_graph_bs, (list, tuple)):
                raise ConfigError("cuda_graph_bs", self.cuda_graph_bs, "a list of batch sizes")
            object.__setattr__(self, "cuda_graph_bs", tuple(self.cuda_graph_bs))
        if isinstance(self.speculative, Mapping):
            object.__setattr__(self, "speculative", _spec_from_dict(dict(self.speculative)))
        _check_types(self)
        if isinstance(self.mem_fraction_static, int):  # TOML/JSON may hand over 1 for 1.0
            object.__setattr__(self, "mem_fraction_static", float(self.mem_fraction_static))
        self._validate()

    # -- validation -------------------------------------------------------------------------------

    def _validate(self) -> None:
        _no_control_chars("model_path", self.model_path)
        if not self.model_path.strip():
            raise ConfigError("model_path", self.model_path, "a non-empty Hugging Face id or path")
        if self.served_model_name is not None:
            _no_control_chars("served_model_name", self.served_model_name)
            if not self.served_model_name.strip():
                raise ConfigError("served_model_name", self.served_model_name, "a non-empty name or unset")
        for name in ("tp", "dp", "nnodes"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "an integer >= 1")
        if not _HOST.match(self.host):
            raise ConfigError("host", self.host, "a host name or IP address (letters, digits, . : - [ ])")
        if not 1 <= self.port <= 65535:
            raise ConfigError("port", self.port, "an integer from 1 to 65535")
        f = self.mem_fraction_static
        if f is not None and not (math.isfinite(f) and 0.0 < f < 1.0):
            raise ConfigError("mem_fraction_static", f, "a number strictly between 0 and 1, or unset")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise ConfigError("cuda_graph_max_bs", self.cuda_graph_max_bs, "an integer >= 1, or unset")
        if self.cuda_graph_bs is not None:
            bs = self.cuda_graph_bs
            if not bs or any(b < 1 for b in bs) or list(bs) != sorted(set(bs)):
                raise ConfigError("cuda_graph_bs", list(bs), "a non-empty, strictly ascending list of integers >= 1")
            if self.cuda_graph_max_bs is not None and max(bs) > self.cuda_graph_max_bs:
                raise ConfigError(
                    "cuda_graph_bs",
                    list(bs),
                    f"sizes up to cuda_graph_max_bs={self.cuda_graph_max_bs}",
                )
        if self.disable_cuda_graph and (self.cuda_graph_max_bs is not None or self.cuda_graph_bs is not None):
            raise ConfigError(
                "disable_cuda_graph",
                True,
                "false when cuda_graph_max_bs or cuda_graph_bs is set (graphs cannot be both off and sized)",
            )
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ConfigError("max_running_requests", self.max_running_requests, "an integer >= 1, or unset")
        c = self.chunked_prefill_size
        if c is not None and c != -1 and c < 1:
            raise ConfigError("chunked_prefill_size", c, "-1 (no chunking) or an integer >= 1, or unset")
        if self.context_length is not None and self.context_length < 1:
            raise ConfigError("context_length", self.context_length, "an integer >= 1, or unset")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UnknownNameError("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES, field="kv_cache_dtype")
        if self.quantization is not None and not _QUANT_NAME.match(self.quantization):
            raise ConfigError("quantization", self.quantization, "a method name such as fp8, modelopt_fp4, w8a8_fp8")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError("node_rank", self.node_rank, f"an integer from 0 to nnodes-1 = {self.nnodes - 1}")
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise ConfigError("dist_init_addr", None, "HOST:PORT of node 0, required when nnodes > 1")
        if self.dist_init_addr is not None:
            _check_host_port("dist_init_addr", self.dist_init_addr)
        if self.tp % self.nnodes != 0:
            raise ConfigError("tp", self.tp, f"a multiple of nnodes={self.nnodes} (each node runs tp/nnodes ranks)")
        self._check_heads()
        _fields.check_env(self.env)
        for path in self.env_files:
            _no_control_chars("env_files", path)
            if not path.strip():
                raise ConfigError("env_files", path, "non-empty paths")
        if self.kernel_config_dir is not None:
            _no_control_chars("kernel_config_dir", self.kernel_config_dir)
            if not self.kernel_config_dir.strip():
                raise ConfigError("kernel_config_dir", self.kernel_config_dir, "a non-empty path or unset")
        _validate_extra_args(self.extra_args)

    def _check_heads(self) -> None:
        """A tp that does not divide a known model's attention heads is refused here, not on the host.

        SGLang splits the heads evenly over the attention tensor-parallel ranks (tp, or tp/dp with
        ``--enable-dp-attention``) and stops at weight loading when they do not divide; the profile's head
        count lets a typo like tp=3 fail with that reason before anything is launched.
        """
        from dsv4lab.config.hardware import known_model  # local: hardware is data, loaded only when needed

        model = known_model(self.model_path)
        if model is not None:
            model.check_tp(self.tp, dp=self.dp, dp_attention="--enable-dp-attention" in self.extra_args)

    # -- conveniences -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The model name clients must send (SGLang defaults it to the model path)."""
        return self.served_model_name or self.model_path

    @property
    def speculative_enabled(self) -> bool:
        return self.speculative is not None and self.speculative.enabled

    def replace(self, **changes: Any) -> ServerConfig:
        """A copy with some fields changed (validated like a new config)."""
        return dataclasses.replace(self, **changes)

    def with_overrides(self, overrides: Mapping[str, str]) -> ServerConfig:
        """Apply ``field=value`` strings as typed by a user (CLI ``--set``, papermill parameters).

        Dotted names reach nested settings (``speculative.num_steps=2``, ``env.NCCL_PROTO=LL``); the
        literal ``none`` unsets an optional field.
        """
        data = self.to_dict()
        for key, raw in overrides.items():
            _fields.apply_override(data, key, raw, ServerConfig, _NESTED)
        return ServerConfig.from_dict(data)

    def with_values(self, values: Mapping[str, Any]) -> ServerConfig:
        """Apply overrides given as Python values *or* as text, by field name.

        Names may be dotted (``speculative.num_steps``, ``env.NCCL_PROTO``) or use ``__`` for the dot, so
        they can be keyword arguments (``speculative__num_steps=2``); only the first ``__`` is the dot, so an
        environment variable's own double underscores survive (``env__MY__VAR`` sets ``MY__VAR``). Text is parsed
        as the field's type
        (what a papermill parameter or a widget hands over); ``None`` unsets an optional field. Every
        value is validated like a new config, so a wrong type is a :class:`ConfigError` naming the field.
        """
        data = self.to_dict()
        _fields.apply_values(data, values, ServerConfig, _NESTED)
        return ServerConfig.from_dict(data)

    def to_dict(self, *, redact: bool = False) -> dict[str, Any]:
        """Plain data (lists, dicts, scalars), unset fields omitted: the TOML/JSON form.

        ``redact`` replaces secret values (``env.HF_TOKEN``, ``--api-key ...``; :mod:`dsv4lab.secrets`) with
        a placeholder: the form for files people read (``config.toml`` and ``handle.json`` in a run dir).
        """
        return _fields.config_data(self, _NESTED, redact=redact)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerConfig:
        """Build from plain data, rejecting unknown keys by name."""
        return _fields.from_plain(cls, data, _NESTED, required=_REQUIRED)

    def to_toml(self, *, redact: bool = False) -> str:
        return tomli_w.dumps(self.to_dict(redact=redact))

    @classmethod
    def from_toml(cls, text: str) -> ServerConfig:
        return cls.from_dict(_fields.data_from_toml(text))

    def to_json(self, *, redact: bool = False) -> str:
        return json.dumps(self.to_dict(redact=redact), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ServerConfig:
        return cls.from_dict(_fields.data_from_json(text))

    def flat(self) -> dict[str, Any]:
        """Every setting under its dotted name (``speculative.num_steps``, ``env.NCCL_PROTO``): what
        :func:`diff` compares, for this config type and vLLM's alike."""
        return _fields.flatten(self, _NESTED)

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv
        from dsv4lab.secrets import collect_secrets, redact_data

        shown = redact_data(self.flat(), collect_secrets(self))  # a notebook output: no token in it
        rows = [{"field": k, "value": _fmt(v), "meaning": field_help(k)} for k, v in shown.items()]
        return hv.card(f"server config ({self.name})", hv.table(rows, max_rows=12))


# -- field metadata -------------------------------------------------------------------------------------


def field_names() -> list[str]:
    """Every settable name, nested ones dotted (``speculative.num_steps``)."""
    return _fields.field_names_of(ServerConfig, _NESTED)


def field_help(name: str) -> str:
    """The one-line help of a field (dotted for nested; ``env.X`` gets the env help)."""
    return _fields.field_help_of(ServerConfig, _NESTED, name)


# -- diff -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigChange:
    """One field that differs between two configs, shown as a reader would write it (``(unset) -> 16``)."""

    field: str
    before: Any
    after: Any

    def __str__(self) -> str:
        before, after = self.shown()
        return f"{self.field}: {before} -> {after}"

    def shown(self) -> tuple[str, str]:
        """(before, after) as printed: secret values (``env.HF_TOKEN``) masked, a diff is shown and shared."""
        from dsv4lab.secrets import REDACTED, is_secret_name

        secret = is_secret_name(self.field)

        def show(value: Any) -> str:
            return REDACTED if secret and isinstance(value, str) and value else _fmt(value)

        return show(self.before), show(self.after)


@dataclass(frozen=True)
class ConfigDiff:
    """What changed between two configs, in field order; empty when they are equal."""

    changes: tuple[ConfigChange, ...]

    def __bool__(self) -> bool:
        return bool(self.changes)

    def __iter__(self) -> Iterator[ConfigChange]:
        return iter(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    def __str__(self) -> str:
        return "\n".join(str(c) for c in self.changes) if self.changes else "(no differences)"

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {c.field: {"before": c.before, "after": c.after} for c in self.changes}

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        if not self.changes:
            return hv.card("config diff", hv.p("No differences."))
        rows = [{"field": c.field, "A": c.shown()[0], "B": c.shown()[1]} for c in self.changes]
        return hv.card("config diff", hv.table(rows))


def diff(a: Any, b: Any) -> ConfigDiff:
    """Field-by-field differences of two configs of one engine (two ServerConfigs, or two VllmConfigs),
    nested settings flattened to dotted names."""
    if type(a) is not type(b) or not hasattr(a, "flat"):
        raise ConfigError(
            "b", type(b).__name__, f"a config of the same type as a ({type(a).__name__}): configs of one engine"
        )
    fa, fb = a.flat(), b.flat()
    keys = list(fa) + [k for k in fb if k not in fa]
    return ConfigDiff(tuple(ConfigChange(k, fa.get(k), fb.get(k)) for k in keys if fa.get(k) != fb.get(k)))


# -- files ------------------------------------------------------------------------------------------------


def save(config: ServerConfig, path: str | Path) -> Path:
    """Write as TOML (``.toml``) or JSON (``.json``), chosen by suffix.

    The file is the user's own config, secrets included (it must launch as written), so it is made
    private (0600) when it holds one; files dsv4lab writes for people use ``to_toml(redact=True)``.
    """
    p = Path(path)
    if p.suffix == ".toml":
        text = config.to_toml()
    elif p.suffix == ".json":
        text = config.to_json() + "\n"
    else:
        raise ConfigError("path", str(p), "a file name ending in .toml or .json")
    if config.to_dict(redact=True) == config.to_dict():
        p.write_text(text, encoding="utf-8")
        return p
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return p


def load(path: str | Path) -> ServerConfig:
    """Read a config written by :func:`save` (or by hand) from TOML or JSON."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("path", str(p), "a readable .toml or .json file", detail=exc.strerror or "") from exc
    except UnicodeDecodeError:
        raise ConfigError("path", str(p), "a readable .toml or .json file", detail="not UTF-8 text") from None
    if p.suffix == ".toml":
        return ServerConfig.from_toml(text)
    if p.suffix == ".json":
        return ServerConfig.from_json(text)
    raise ConfigError("path", str(p), "a file name ending in .toml or .json")


# -- helpers ----------------------------------------------------------------------------------------------


#: ServerConfig's one nested table; the shared field machinery (:mod:`dsv4lab.config.fields`) takes it.
_NESTED: Mapping[str, type] = {"speculative": SpeculativeConfig}
_REQUIRED = {"model_path": "required: a Hugging Face id or a path on the server host"}


def _spec_from_dict(data: Any) -> SpeculativeConfig:
    return _fields.nested_from_dict(SpeculativeConfig, data, "speculative")


def _check_types(obj: Any) -> None:
    _fields.check_types(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})


def _check_host_port(name: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not _HOST.match(host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(name, value, "HOST:PORT, e.g. node0.example:5000")


def _validate_extra_args(args: tuple[str, ...]) -> None:
    _fields.check_flag_list(args, _owned_flags, example="--attention-backend")


def _owned_flags() -> Mapping[str, str]:
    from dsv4lab.config.versions import flags_owned_by_fields  # local: versions is loaded only when needed

    return flags_owned_by_fields()
