"""Turn a :class:`~dsv4lab.config.vllm_config.VllmConfig` into the ``vllm serve`` argv and environment of one
vLLM release.

The argv is a list, never a string: the caller quotes it (``shlex.quote``) if it must go through a shell, so
a model path with a space or a quote stays one word. Settings the release has no flag for, or values it does
not accept, raise :class:`~dsv4lab.errors.UnsupportedFlagError` naming the release and what it does accept;
dropping them would launch a server that silently differs from the config recorded beside its results.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from dsv4lab.config.fields import refuse_placeholder
from dsv4lab.config.vllm_config import VllmConfig
from dsv4lab.config.vllm_releases import VllmRelease, resolve_vllm_release
from dsv4lab.errors import ConfigError, UnsupportedFlagError

__all__ = ["render_vllm_argv", "render_vllm_env", "vllm_server_command"]

#: Fields that shape the process around the command, or are placed by hand, not by the flag loop.
_NOT_FLAGS = ("model_path", "env", "extra_args", "speculative", "cudagraph_capture_sizes", "max_cudagraph_capture_size")


def _unsupported(release: VllmRelease, field: str, hint: str) -> UnsupportedFlagError:
    return UnsupportedFlagError(field, release.version, hint, engine="vLLM")


def _value_text(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def render_vllm_argv(config: VllmConfig, version: str | VllmRelease | None = "0.32.0") -> list[str]:
    """The words after the program (``vllm`` or ``python -m vllm.entrypoints.cli.main``): ``serve``, the model,
    then the flags of that release, then ``extra_args`` as given.

    vLLM's defaults are left to vLLM (an unset field renders nothing) except the host, which is always
    rendered because vLLM's own default binds every interface. The environment is not part of the argv:
    :func:`render_vllm_env`.
    """
    release = resolve_vllm_release(version)
    argv = ["serve", config.model_path]
    for f in dataclasses.fields(config):
        if f.name in _NOT_FLAGS:
            continue
        _add_flag(argv, release, f.name, getattr(config, f.name))
    argv += _graph_args(config, release)
    argv += _speculative_args(config, release)
    refuse_placeholder("extra_args", config.extra_args)
    rendered = {w.split("=", 1)[0] for w in argv[2:] if w.startswith("--")}
    for word in config.extra_args:
        flag = word.split("=", 1)[0]
        if flag in rendered:
            raise ConfigError(
                "extra_args",
                word,
                f"flags the config does not already render for vLLM {release.version}; {flag} is rendered from "
                "a field (merge the two settings into one)",
            )
    argv += config.extra_args
    return argv


def _add_flag(argv: list[str], release: VllmRelease, name: str, value: Any) -> None:
    if value is None or (name == "enforce_eager" and value is False):
        return  # unset, or vLLM's own default: vLLM decides
    if (name == "port" and value == 8000) or (name.endswith("_parallel_size") and value == 1):
        return  # vLLM's default in every supported release; keeps rendered lines short and diffable
    flag = release.flag_for(name)
    if flag is None:
        raise _unsupported(release, name, _accepts_hint(release, name))
    _check_choice(release, name, value)
    if value is True:
        argv.append(flag)
    elif value is False:
        argv.append(release.negative_flags[name])
    else:
        text = _value_text(value)
        argv.extend([f"{flag}={text}"] if text.startswith("-") else [flag, text])


def _check_choice(release: VllmRelease, name: str, value: Any) -> None:
    choices: tuple[Any, ...] | None = {
        "kv_cache_dtype": release.kv_cache_dtypes,
        "dtype": release.dtypes,
        "block_size": release.block_sizes,
    }.get(name)
    if choices is not None and value not in choices:
        shown = ", ".join(str(c) for c in choices)
        raise _unsupported(release, name, f"it accepts {shown}, not {value}")


#: Why an older release lacks a field, where that says more than the list of what it takes.
_WHY_MISSING = {
    "kv_cache_memory_bytes": "it is new in vLLM 0.10.2; size the KV cache with gpu_memory_utilization instead",
}


def _accepts_hint(release: VllmRelease, name: str = "") -> str:
    if name in _WHY_MISSING:
        return _WHY_MISSING[name]
    return "its vllm serve takes these fields: " + ", ".join(
        sorted({*release.flags, *release.compilation_keys, "model_path", "env", "extra_args"})
    )


def _graph_args(config: VllmConfig, release: VllmRelease) -> list[str]:
    """CUDA-graph sizes, spelled the release's way: their own flags (0.32), or compilation-config JSON for an
    exact list with ``--cuda-graph-sizes N`` for "up to N" (0.11), or the JSON only (0.8.5)."""
    sizes, largest = config.cudagraph_capture_sizes, config.max_cudagraph_capture_size
    out: list[str] = []
    if sizes is not None:
        if "cudagraph_capture_sizes" in release.flags:
            out += [release.flags["cudagraph_capture_sizes"], *(str(s) for s in sizes)]
        elif "cudagraph_capture_sizes" in release.compilation_keys:
            key = release.compilation_keys["cudagraph_capture_sizes"]
            out += ["--compilation-config", json.dumps({key: list(sizes)}, separators=(",", ":"))]
        else:
            raise _unsupported(release, "cudagraph_capture_sizes", _accepts_hint(release))
    if largest is not None:
        flag = release.flags.get("max_cudagraph_capture_size")
        if flag is None:
            if sizes is not None:
                return out  # the exact list already ends at it (VllmConfig checks that they agree)
            raise _unsupported(
                release,
                "max_cudagraph_capture_size",
                "it has no setting for the largest graph alone; set cudagraph_capture_sizes to the exact list",
            )
        if sizes is not None and "cudagraph_capture_sizes" not in release.flags:
            return out  # 0.11: the compilation-config list overrides --cuda-graph-sizes, and ends at it anyway
        out += [flag, str(largest)]
    return out


def _speculative_args(config: VllmConfig, release: VllmRelease) -> list[str]:
    spec = config.speculative
    if spec is None or not spec.enabled:
        return []
    table = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if getattr(spec, f.name) is not None}
    for key in table:
        if key not in release.speculative_keys:
            raise _unsupported(
                release,
                f"speculative.{key}",
                f"its --speculative-config takes {', '.join(release.speculative_keys)}",
            )
    if spec.method is not None and spec.method not in release.speculative_methods:
        raise _unsupported(
            release,
            "speculative.method",
            f"it accepts {', '.join(release.speculative_methods)}, not {spec.method}",
        )
    return [release.flags["speculative"], json.dumps(table, separators=(",", ":"))]


def render_vllm_env(config: VllmConfig) -> dict[str, str]:
    """The server's environment additions (``VLLM_CPU_KVCACHE_SPACE``, ``CUDA_VISIBLE_DEVICES``, ...), in the
    order written; kept out of the argv, where ``ps`` and logs would show a token."""
    for name, value in config.env.items():
        refuse_placeholder(f"env.{name}", [value])
    return dict(config.env)


def vllm_server_command(version: str | VllmRelease | None = "0.32.0", *, python: str = "python3") -> list[str]:
    """The argv prefix that starts vLLM's CLI; :func:`render_vllm_argv` goes after it.

    Every supported release ships the ``vllm`` console script for the same ``main``; ``python -m`` of the
    module works where the venv's ``bin`` is not on PATH (a remote host reached over SSH).
    """
    return [python, "-m", resolve_vllm_release(version).cli_module]
