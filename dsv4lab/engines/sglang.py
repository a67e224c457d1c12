"""SGLang itself: ``python -m sglang.launch_server`` with the flags of one release."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dsv4lab.config.hardware import HardwareProfile
from dsv4lab.config.launch_script import render_argv, render_env_file, render_launch_script
from dsv4lab.config.presets import PRESETS
from dsv4lab.config.presets import preset as preset_config
from dsv4lab.config.server_config import ServerConfig, field_names, load
from dsv4lab.config.versions import RELEASES, resolve_release
from dsv4lab.engines.base import Engine, HostFacts
from dsv4lab.errors import ConfigError, UnknownNameError
from dsv4lab.logs import Diagnosis

if TYPE_CHECKING:
    from dsv4lab.model.memory import Preflight

__all__ = ["SGLangEngine", "as_server_config"]


class _NoFacts:
    """SGLang's model reads the hardware profile, never the host: a plan check has nothing to ask."""

    def memory(self) -> Any:
        raise AssertionError("SGLang's preflight does not read the host")

    def model_facts(self, model_path: str, env: Mapping[str, str]) -> Any:
        raise AssertionError("SGLang's preflight does not read the host")


_NO_FACTS = _NoFacts()


def as_server_config(config: Any, engine: str) -> ServerConfig:
    """``config`` when it is SGLang's (the twin and SGLang take the same flags); refused by name otherwise."""
    if not isinstance(config, ServerConfig):
        raise ConfigError("config", type(config).__name__, f"a ServerConfig (SGLang's flags) for the {engine} engine")
    return config


class SGLangEngine(Engine):
    """A real SGLang server: ServerConfig and presets, the flags of one SGLang release, ``nvidia-smi``."""

    name = "sglang"
    description = "a real SGLang server"
    module = "sglang"
    bench_backend = "sglang"

    def resolve_version(self, version: str | None) -> str:
        return resolve_release(version).version

    def known_versions(self) -> Sequence[str]:
        return tuple(r.version for r in RELEASES)

    def release_words(self, version: str) -> str:
        return f"SGLang {version} flags"

    def load_config(self, data: Mapping[str, Any]) -> ServerConfig:
        return ServerConfig.from_dict(data)

    def build_config(self, *, file: str | None, preset: str | None, overrides: Mapping[str, str]) -> ServerConfig:
        config = load(file) if file else preset_config(preset or "config_a")
        return config.with_overrides(overrides) if overrides else config

    def resolve_config(self, config: Any, overrides: Mapping[str, Any], *, arg: str = "config") -> ServerConfig:
        if isinstance(config, str):
            if config in PRESETS:
                cfg = preset_config(config)
            elif config.endswith((".toml", ".json")):
                cfg = load(config)
            else:
                raise UnknownNameError(
                    "preset", config, PRESETS, field=arg, also="a .toml/.json file, or a ServerConfig"
                )
        elif isinstance(config, ServerConfig):
            cfg = config
        else:
            raise ConfigError(arg, config, "a preset name, a .toml/.json file, or a ServerConfig")
        return cfg.with_values(overrides) if overrides else cfg

    def field_names(self) -> Sequence[str]:
        return field_names()

    def gpus_per_node(self, config: Any) -> int:
        # DP attention shares the tensor-parallel GPUs; plain DP runs tp GPUs per replica.
        shared = "--enable-dp-attention" in config.extra_args
        world = config.tp if shared else config.tp * config.dp
        return max(1, int(world) // max(1, int(config.nnodes)))

    def check_plan(self, config: Any, version: str, hardware: HardwareProfile) -> None:
        """SGLang's memory model refuses what cannot run on ``hardware`` at all (``tp=3`` on a 128-head
        model, more GPUs than it has), besides the flags the release lacks."""
        self.check(config, version, None)
        self.preflight(config, version, hardware=hardware, facts=_NO_FACTS)

    def preflight(self, config: Any, version: str, *, hardware: HardwareProfile, facts: HostFacts) -> Preflight:
        """SGLang's split of every GPU of the ``hardware`` profile (the host itself is not read)."""
        from dsv4lab.model.memory import preflight

        return preflight(as_server_config(config, self.name), hardware, sglang_version=version)

    def diagnose(self, log: Any, *, hardware: Any = None, version: str | None = None) -> Diagnosis:
        """The log reading plus the SGLang memory model's arithmetic for the OOMs it can model."""
        from dsv4lab.model.diagnosis import diagnose_with_model

        return diagnose_with_model(log, hardware=hardware, sglang_version=version)

    def check(self, config: Any, version: str, settings: Mapping[str, str] | None) -> None:
        cfg = as_server_config(config, self.name)
        render_env_file(cfg)  # a redacted secret is refused here
        render_argv(cfg, resolve_release(version, warn=False))  # and a flag the release lacks

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
        # The twin takes SGLang's launch line; what only it reads (its settings) is exported by the script.
        return render_launch_script(
            as_server_config(config, self.name),
            run_dir=run_dir,
            sglang_version=resolve_release(version, warn=False),
            python=python,
            target="twin" if self.rehearsal else "sglang",
            twin_env=settings if self.rehearsal else None,
            runtime_words=runtime_words,
        )
