"""Turn a :class:`ServerConfig` into the argv, env file and launch script of one SGLang release.

Everything user-supplied reaches the shell through :func:`shlex.quote` and nowhere else: the story's
launch scripts were hand-written strings, and a model name with a quote in it is enough to turn such a
string into a different command. Comments in generated files carry only text dsv4lab itself chose.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from typing import Literal

from dsv4lab.config.fields import refuse_placeholder as _refuse_placeholder
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.config.versions import SGLangRelease, fallback_note, resolve_release
from dsv4lab.config.vllm_config import VllmConfig
from dsv4lab.errors import ConfigError, UnsupportedFlagError
from dsv4lab.resources import __version__
from dsv4lab.rundir import RunLayout

__all__ = ["Target", "render_argv", "render_env_file", "render_launch_script", "render_script", "server_command"]

#: What a launch script starts: SGLang itself, or the twin with the same flags.
Target = Literal["sglang", "twin"]

#: Module the twin is started as; it takes SGLang's launch flags.
TWIN_MODULE = "dsv4lab.twin"


def _fmt_value(value: object) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def render_argv(config: ServerConfig, sglang_version: str | SGLangRelease | None = None) -> list[str]:
    """The launch flags for ``python -m sglang.launch_server`` of that release (without the prefix).

    A setting the release has no flag (or no such value) for raises instead of being dropped.
    """
    release = resolve_release(sglang_version)
    argv: list[str] = []

    def add(field_name: str, value: object) -> None:
        if value is None or value is False:
            return
        flag = release.flag_for(field_name)
        if flag is None:
            raise UnsupportedFlagError(field_name, release.version)
        if value is True:
            argv.append(flag)
        elif isinstance(value, tuple):
            argv.append(flag)
            argv.extend(_fmt_value(v) for v in value)
        else:
            text = _fmt_value(value)
            # "--flag=-x" keeps a value that starts with a dash from being read as another flag.
            argv.extend([f"{flag}={text}"] if text.startswith("-") else [flag, text])

    for f in dataclasses.fields(config):
        name = f.name
        value = getattr(config, name)
        if name in ("env", "env_files", "kernel_config_dir", "extra_args"):
            continue  # not launch flags: they shape the script around the command
        if name == "speculative":
            if value is not None and value.enabled:
                if value.algorithm not in release.speculative_algorithms:
                    raise UnsupportedFlagError(
                        "speculative.algorithm",
                        release.version,
                        f"it accepts {', '.join(release.speculative_algorithms)}, not {value.algorithm}",
                    )
                for sf in dataclasses.fields(value):
                    add(f"speculative.{sf.name}", getattr(value, sf.name))
            continue
        if name in ("tp", "dp", "nnodes") and value == 1:
            continue  # SGLang's default; keeps rendered lines short and diffable
        if name == "node_rank" and config.nnodes == 1:
            continue
        if (name == "host" and value == "127.0.0.1") or (name == "port" and value == 30000):
            continue
        if name == "quantization" and value is not None and value not in release.quantizations:
            raise UnsupportedFlagError(
                "quantization", release.version, f"it accepts {', '.join(release.quantizations)}, not {value}"
            )
        if name == "kv_cache_dtype" and value is not None and value not in release.kv_cache_dtypes:
            raise UnsupportedFlagError(
                "kv_cache_dtype",
                release.version,
                f"it accepts {', '.join(release.kv_cache_dtypes)}, not {value}",
            )
        add(name, value)
    _refuse_placeholder("extra_args", config.extra_args)
    argv.extend(config.extra_args)
    return argv


def server_command(
    sglang_version: str | SGLangRelease | None = None,
    *,
    python: str = "python3",
    target: Target = "sglang",
) -> list[str]:
    """The argv prefix that starts the server (SGLang's launch module, or the twin in its place)."""
    if target == "twin":
        return [python, "-m", TWIN_MODULE]
    if target == "sglang":
        return [python, "-m", resolve_release(sglang_version, warn=False).launch_module]
    raise ConfigError("target", target, "'sglang' or 'twin'")


def render_env_file(config: ServerConfig | VllmConfig) -> str:
    """A shell file of ``export NAME=value`` lines (like the story's ``dsv4_nccl_env.sh``).

    The one file of a run dir that keeps secret values (``HF_TOKEN``): the server needs them. ``launch``
    writes it 0600 in a 0700 run dir and nothing copies it unredacted (:mod:`dsv4lab.secrets`).
    """
    for name, value in config.env.items():
        _refuse_placeholder(f"env.{name}", [value])
    lines = [
        "# Server environment rendered by dsv4lab from the config's env table.",
        "# Sourced by launch.sh after the user's own env files, so these values win.",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in config.env.items()]
    return "\n".join(lines) + "\n"


def render_launch_script(
    config: ServerConfig,
    *,
    run_dir: str,
    sglang_version: str | SGLangRelease | None = None,
    python: str = "python3",
    target: Target = "sglang",
    twin_env: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
    runtime_words: Mapping[str, str] | None = None,
) -> str:
    """The launch script of an SGLang server (or of the twin in its place): see :func:`render_script`.

    ``twin_env`` exports twin-only settings (profile, time scale, fault) when ``target="twin"``;
    ``command`` replaces the server command prefix (used by tests with a stand-in server);
    ``runtime_words`` as in :func:`render_script`.
    """
    release = resolve_release(sglang_version, warn=False)
    note = fallback_note(sglang_version) if isinstance(sglang_version, str) else None
    prefix = list(command) if command is not None else server_command(release, python=python, target=target)
    exports: dict[str, str] = {}
    setup: list[str] = []
    if target == "twin":
        exports = dict(twin_env or {})
        exports.setdefault("DSV4LAB_TWIN_SGLANG_VERSION", release.version)
        if config.kernel_config_dir is not None:
            exports.setdefault("DSV4LAB_TWIN_KERNEL_CONFIG_DIR", config.kernel_config_dir)
    elif config.kernel_config_dir is not None:
        setup = _kernel_config_install(config.kernel_config_dir, prefix[0])
    return render_script(
        run_dir=run_dir,
        words=[*prefix, *render_argv(config, release)],
        env_files=config.env_files,
        what=f"SGLang {release.version} (target: {target})",
        notes=[note] if note else [],
        exports=exports,
        exports_comment="Twin-only settings (the launch line stays SGLang's).",
        setup=setup,
        runtime_words=runtime_words,
    )


def render_script(
    *,
    run_dir: str,
    words: Sequence[str],
    env_files: Sequence[str] = (),
    what: str,
    notes: Sequence[str] = (),
    exports: Mapping[str, str] | None = None,
    exports_comment: str = "Engine settings.",
    setup: Sequence[str] = (),
    runtime_words: Mapping[str, str] | None = None,
) -> str:
    """A bash script that starts a server with its output in ``server.log`` and records its fate.

    Beside the log it writes ``server.pid`` when the server starts, ``server.exit`` (its exit status;
    137 when it was SIGKILLed) when it ends, and ``launcher.pid`` / ``launcher.exit`` for the script
    itself, so that a watcher can tell "dead" from "slow" from files rather than from log silence. Every
    engine's launch goes through here: the server stays in the script's process group (nothing is
    detached), so stopping the group stops the server's workers too.

    ``words`` is the server's command line, quoted here word by word; ``exports`` are set after the env
    files and the rendered env file; ``setup`` lines (dsv4lab's own text, never user input) run before
    the server starts. ``runtime_words`` maps a word of the command line to a shell expression of dsv4lab's
    own that stands in its place: a value only the node knows when the script runs (a Slurm job's first node,
    the dist-init address of a multi-node server).
    """
    layout = RunLayout(run_dir)
    runtime = dict(runtime_words or {})
    q = shlex.quote
    trap_body = 'echo "$?" > ' + _q_path(layout.launcher_exit)  # bash re-parses this when the trap fires
    out: list[str] = [
        "#!/usr/bin/env bash",
        f"# Launch script generated by dsv4lab {__version__} for {what}.",
    ]
    out += [f"# Note: {n}." for n in notes]
    out += [
        "# Beside the log: server.pid, server.exit (exit status when the server ends; 137 = SIGKILL),",
        "# launcher.pid and launcher.exit (this script).",
        "set -euo pipefail",
        "",
        "# Everything this script and the server create (log, PID files, traces) is private to the user.",
        "umask 077",
        f"RUN_DIR={_q_path(run_dir)}",
        f"LOG={_q_path(layout.log)}",
        "# The script's own errors (a missing env file, say) go to the log too: they are evidence.",
        'exec >> "$LOG" 2>&1 < /dev/null',
        'cd -- "$RUN_DIR"',
        f"rm -f -- {_q_path(layout.server_pid)} {_q_path(layout.server_exit)} {_q_path(layout.launcher_exit)}",
        f'echo "$$" > {_q_path(layout.launcher_pid)}',
        f"trap {q(trap_body)} EXIT",
        "",
        "# Environment: the user's env files in order, then the rendered env file.",
    ]
    out += [f"source {_q_path(path)}" for path in env_files]
    out.append(f"source {_q_path(layout.env_file)}")
    if exports:
        out += ["", f"# {exports_comment}"]
        out += [f"export {name}={_q_path(value)}" for name, value in exports.items()]
    if setup:
        out += ["", *setup]
    out += [
        "",
        "# Start the server in the background so that its PID and exit status can be recorded.",
        " ".join(runtime.get(w) or q(w) for w in words) + ' >> "$LOG" 2>&1 < /dev/null &',
        "server_pid=$!",
        f'echo "$server_pid" > {_q_path(layout.server_pid)}',
        "set +e",
        'wait "$server_pid"',
        "status=$?",
        "set -e",
        f'echo "$status" > {_q_path(layout.server_exit + ".tmp")}',
        f"mv -f -- {_q_path(layout.server_exit + '.tmp')} {_q_path(layout.server_exit)}",
        'exit "$status"',
    ]
    return "\n".join(out) + "\n"


def _q_path(path: str) -> str:
    """Quote a path for bash, keeping a leading ``~/`` meaning the remote user's home directory."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


#: Finds the directory of SGLang's shipped block-GEMM JSONs (a constant: no user text goes in here).
_FIND_CONFIG_DIR = """\
import os, sys, sglang
root = os.path.dirname(sglang.__file__)
for d, _, files in os.walk(root):
    if os.path.basename(d) == "configs" and any(f.startswith("N=") and "dtype=fp8_w8a8" in f for f in files):
        print(d)
        sys.exit(0)
sys.exit("no SGLang FP8 block-GEMM config directory found")"""


def _kernel_config_install(kernel_dir: str, python: str) -> list[str]:
    """Copy tuned FP8 block-GEMM JSONs into the installed SGLang's config directory.

    SGLang only looks for ``N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[..].json`` next to
    its own kernel module, so tuned files must be placed there; the directory is found by the shipped
    files of the same naming scheme, which survives SGLang moving the module between releases.
    """
    return [
        "# Tuned FP8 block-GEMM kernel configs: SGLang reads them only from its own configs directory.",
        f"KERNEL_CONFIG_DIR={_q_path(kernel_dir)}",
        "umask 022  # the installed configs stay readable like the rest of SGLang's package",
        f"SGLANG_CONFIG_DIR=$({shlex.quote(python)} - <<'PY'",
        *_FIND_CONFIG_DIR.splitlines(),
        "PY",
        ') || { echo "dsv4lab: cannot find the installed SGLang FP8 config directory" >> "$LOG"; exit 1; }',
        'for f in "$KERNEL_CONFIG_DIR"/N=*.json; do',
        '  [ -e "$f" ] || { echo "dsv4lab: no N=*.json kernel configs in $KERNEL_CONFIG_DIR" >> "$LOG"; break; }',
        '  cp -f -- "$f" "$SGLANG_CONFIG_DIR"/',
        "done",
        "umask 077",
    ]
