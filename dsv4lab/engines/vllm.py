"""vLLM: ``python -m vllm.entrypoints.cli.main serve MODEL ...`` with the flags of one release.

The launch goes through the same script as SGLang's (:func:`~dsv4lab.config.launch_script.render_script`):
the API server runs in the script's process group, and so do the EngineCore and worker processes it
spawns. That matters: a SIGKILLed API server leaves them alive, re-parented to PID 1 and holding their
memory, so a stop or a crash cleans up the group, never one PID.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4lab.config.hardware import HardwareProfile
from dsv4lab.config.launch_script import render_env_file, render_script
from dsv4lab.config.vllm_config import VllmConfig, field_names
from dsv4lab.config.vllm_launch import render_vllm_argv, render_vllm_env, vllm_server_command
from dsv4lab.config.vllm_releases import VLLM_RELEASES, resolve_vllm_release
from dsv4lab.engines.base import Engine, HostFacts, SmiSpec
from dsv4lab.errors import ConfigError
from dsv4lab.resources import CONFIGS

if TYPE_CHECKING:
    from dsv4lab.model.vllm_memory import HostMemory, VllmPreflight

__all__ = ["HOST_MEMORY_SAMPLER", "VllmEngine"]

#: The GPU-memory sampler's stand-in on a host without ``nvidia-smi`` (vLLM's CPU build): the same CSV
#: columns, where "GPU 0" is the host's memory and "used" is what the run dir's server process group holds
#: (resident memory of the API server, EngineCore and workers), so the memory timeline shows the KV space
#: the engine took against the host's memory. Only dsv4lab's own text goes into it; the run dir and the
#: interval come as arguments. With ``nvidia-smi`` present it is ``nvidia-smi`` itself.
HOST_MEMORY_SAMPLER = r"""
run_dir=$1; shift
if command -v nvidia-smi >/dev/null 2>&1; then exec nvidia-smi "$@"; fi
interval=500
while [ $# -gt 0 ]; do
  case "$1" in -lms) interval=$2; shift 2 ;; *) shift ;; esac
done
sleep_s=$(awk -v ms="$interval" 'BEGIN { printf "%.3f", ms / 1000 }')
while :; do
  total=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 }' /proc/meminfo)
  used=0
  if [ -r "$run_dir/launcher.pid" ]; then
    pgid=$(cat -- "$run_dir/launcher.pid" 2>/dev/null)
    case "$pgid" in
      ''|*[!0-9]*) ;;
      *) used=$(ps -o rss= -g "$pgid" 2>/dev/null | awk '{ s += $1 } END { printf "%d", s / 1024 }') ;;
    esac
  fi
  printf '%s, 0, %s, %s, 0\n' "$(date '+%Y/%m/%d %H:%M:%S.%3N')" "${used:-0}" "${total:-0}" || exit 0
  sleep "$sleep_s"
done
"""


def _load(path: str) -> VllmConfig:
    """A VllmConfig from a ``.toml`` or ``.json`` file (its ``to_toml`` / ``to_json`` form); a bare name that
    is not a file here is one of the configs shipped with dsv4lab (``vllm-cpu.toml``)."""
    p = Path(path).expanduser()
    if p.suffix not in (".toml", ".json"):
        raise ConfigError("--file", path, "a file name ending in .toml or .json")
    if not p.exists() and p.name == path and (CONFIGS / path).is_file():
        p = CONFIGS / path
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        shipped = ", ".join(sorted(f.name for f in CONFIGS.glob("*.toml")))
        raise ConfigError(
            "--file", path, f"a readable UTF-8 .toml or .json file, or a shipped one ({shipped})", detail=str(exc)
        ) from exc
    return VllmConfig.from_toml(text) if p.suffix == ".toml" else VllmConfig.from_json(text)


def _vllm_config(config: Any) -> VllmConfig:
    if not isinstance(config, VllmConfig):
        raise ConfigError(
            "config",
            type(config).__name__,
            "a VllmConfig (vllm serve's flags) for the vllm engine; SGLang's ServerConfig is for sglang and twin",
        )
    return config


class VllmEngine(Engine):
    """A real vLLM server: VllmConfig, the flags of one vLLM release, and on a host without GPUs the memory
    preflight of its CPU build before the launch."""

    name = "vllm"
    description = "a real vLLM server"
    module = "vllm"
    bench_backend = "vllm"

    def resolve_version(self, version: str | None) -> str:
        return resolve_vllm_release(version).version

    def known_versions(self) -> Sequence[str]:
        return tuple(r.version for r in VLLM_RELEASES)

    def release_words(self, version: str) -> str:
        return f"vLLM {version} flags"

    def load_config(self, data: Mapping[str, Any]) -> VllmConfig:
        return VllmConfig.from_dict(data)

    def build_config(self, *, file: str | None, preset: str | None, overrides: Mapping[str, str]) -> VllmConfig:
        if preset is not None:
            raise ConfigError(
                "--preset", preset, "no preset for vLLM: --set model_path=DIR (and more --set), or --file CONFIG"
            )
        if file:
            config = _load(file)
            return config.with_overrides(overrides) if overrides else config
        rest = dict(overrides)
        model = rest.pop("model_path", None)
        if not model:
            raise ConfigError(
                "model_path", None, "--set model_path=DIR (a model folder or Hugging Face id on the server host)"
            )
        config = VllmConfig(model_path=model)
        return config.with_overrides(rest) if rest else config

    def resolve_config(self, config: Any, overrides: Mapping[str, Any], *, arg: str = "config") -> VllmConfig:
        if isinstance(config, str) and config.endswith((".toml", ".json")):
            cfg = _load(config)
        elif isinstance(config, VllmConfig):
            cfg = config
        else:
            raise ConfigError(
                arg,
                config,
                "a VllmConfig (e.g. VllmConfig(model_path=...)) or a .toml/.json file of one; SGLang's presets "
                "and ServerConfig are for target='sglang' or 'twin'",
            )
        return cfg.with_values(overrides) if overrides else cfg

    def check(self, config: Any, version: str, settings: Mapping[str, str] | None) -> None:
        cfg = _vllm_config(config)
        render_vllm_env(cfg)  # a redacted secret is refused here
        render_vllm_argv(cfg, version)  # and a flag or value the release lacks

    def gpus_per_node(self, config: Any) -> int:
        return int(config.tensor_parallel_size) * int(config.pipeline_parallel_size)

    def field_names(self) -> Sequence[str]:
        return field_names()

    def preflight(self, config: Any, version: str, *, hardware: HardwareProfile, facts: HostFacts) -> VllmPreflight:
        """On a host without GPUs (vLLM's CPU build), from that host's memory node and the model's
        config.json there; on a GPU host, the split of the ``hardware`` profile."""
        from dsv4lab.model.vllm_memory import vllm_preflight

        cfg = _vllm_config(config)
        memory = facts.memory()
        if memory.gpus:
            return vllm_preflight(cfg, hardware=hardware, vllm_version=version)
        return self._cpu_preflight(cfg, version, memory, facts)

    def predict_on_host(self, config: Any, version: str, facts: HostFacts) -> VllmPreflight | None:
        """On a host without GPUs (vLLM's CPU build), the preflight a launch is refused on: a KV space the
        host's memory node cannot hold, or one that cannot hold a ``max_model_len`` request, would otherwise
        be found after a minute of startup. On a GPU host the split depends on figures vLLM measures
        (activation, graph pools), so there is no prediction to refuse on (None); ``dsv4lab preflight
        --engine vllm --hardware PROFILE`` shows the estimates."""
        cfg = _vllm_config(config)
        memory = facts.memory()
        if memory.gpus:
            return None
        return self._cpu_preflight(cfg, version, memory, facts)

    @staticmethod
    def _cpu_preflight(cfg: VllmConfig, version: str, memory: HostMemory, facts: HostFacts) -> VllmPreflight:
        from dsv4lab.model.vllm_memory import vllm_preflight

        model = facts.model_facts(cfg.model_path, cfg.env)
        return vllm_preflight(cfg, memory, model=model, vllm_version=version, model_from_path=False)

    def launch_script(
        self,
        config: Any,
        *,
        run_dir: str,
        version: str,
        python: str,
        settings: Mapping[str, str] | None,
        runtime_words: Mapping[str, str] | None = None,
    ) -> str:
        cfg = _vllm_config(config)
        render_env_file(cfg)
        return render_script(
            run_dir=run_dir,
            words=[*vllm_server_command(version, python=python), *render_vllm_argv(cfg, version)],
            what=f"vLLM {resolve_vllm_release(version).version} (target: vllm)",
            runtime_words=runtime_words,
        )

    def smi(
        self,
        python: str,
        port: int | None,
        settings: Mapping[str, str] | None,
        *,
        pid: int | None = None,
        run_dir: str | None = None,
    ) -> SmiSpec:
        if not run_dir:
            return SmiSpec()
        return SmiSpec(("bash", "-c", HOST_MEMORY_SAMPLER, "dsv4lab-hostmem", run_dir))
