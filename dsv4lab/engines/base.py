"""What an engine is to the lab: everything that differs between the twin, SGLang and vLLM, in one object.

The layers above (launch, watch, the sampler, ``Lab``, reports) ask the engine instead of comparing a
target's name, so that a new engine is one module here and not a branch in every file that launches,
samples or describes a server.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from dsv4lab.config.hardware import HardwareProfile
from dsv4lab.errors import ConfigError
from dsv4lab.logs import Diagnosis, diagnose
from dsv4lab.units import REAL, Clock

if TYPE_CHECKING:
    from dsv4lab.model.vllm_memory import HostMemory, ModelFacts

__all__ = ["Engine", "HostFacts", "SessionSettings", "SmiSpec"]


class HostFacts(Protocol):
    """What a launch check may read on the server host, each read only when asked
    (:class:`dsv4lab.serving.hostmem.HostProbe` over a host connection)."""

    def memory(self) -> HostMemory:
        """The host's memory as the engine's CPU backend sees it, and its GPUs."""

    def model_facts(self, model_path: str, env: Mapping[str, str]) -> ModelFacts | None:
        """The model's config.json facts and weight size on the host; None when it is not there."""


def check_pace(name: str, value: object) -> float | None:
    """A twin's pace as given (None, or a positive number of wall seconds per modelled second), checked."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(name, value, "None (virtual time) or a positive number of wall seconds per modelled second")
    return float(value)


@dataclass(frozen=True)
class SessionSettings:
    """What a lab session decides for every launch of an engine (the twin reads all of them; a real engine
    only those that mean something for it)."""

    hardware: str = "rtx-pro-6000-x8"
    #: The twin's pace (wall seconds per modelled second); None: virtual time.
    pace: float | None = None
    fault: str | None = None
    seed: int | None = None


@dataclass(frozen=True)
class SmiSpec:
    """How to run the GPU-memory sampler for a server: the executable words and their environment
    (``nvidia-smi`` on a real host, the twin's stand-in on the twin)."""

    executable: tuple[str, ...] = ("nvidia-smi",)
    env: Mapping[str, str] = field(default_factory=dict)


class Engine(ABC):
    """One serving engine: its config type, how it is launched and checked, its clock and its sampler."""

    #: The name ``target=`` / ``--engine`` takes and ``handle.json`` records.
    name: ClassVar[str]
    #: Who the server is, for reports and parameter tables ("a real SGLang server").
    description: ClassVar[str]
    #: The module the server host's interpreter must import for a launch to start.
    module: ClassVar[str]
    #: The bench client's default ``--backend`` for this engine's servers.
    bench_backend: ClassVar[str]
    #: Whether the twin's rehearsal knobs (faults, time scale, stand-in kernels) apply.
    rehearsal: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<engine {self.name}>"

    # -- versions and configs ----------------------------------------------------------------------------

    @abstractmethod
    def resolve_version(self, version: str | None) -> str:
        """The release whose flags are rendered (``None``: the newest dsv4lab knows); unknown ones raise."""

    @abstractmethod
    def check(self, config: Any, version: str, settings: Mapping[str, str] | None) -> None:
        """Raise for what would make the launch fail at once (a flag the release lacks, a redacted secret,
        the twin's refusals), before anything is written on the host."""

    def predict_on_host(self, config: Any, version: str, facts: HostFacts) -> Any | None:
        """The memory prediction a launch on this host is checked against (it has ``fits``, ``refusal()``
        and ``to_dict()``), read through ``facts``; None where the engine predicts nothing from the host
        itself (by default: then nothing is read, so an engine that predicts nothing costs no remote read)."""
        return None

    @abstractmethod
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
        """The bash launch script (see :func:`dsv4lab.config.launch_script.render_script`, which also says
        what ``runtime_words`` are)."""

    @abstractmethod
    def load_config(self, data: Mapping[str, Any]) -> Any:
        """The config a ``handle.json`` or ``config.toml`` recorded (its ``to_dict`` form)."""

    @abstractmethod
    def build_config(self, *, file: str | None, preset: str | None, overrides: Mapping[str, str]) -> Any:
        """The config a command line describes: a preset or a ``.toml``/``.json`` file, then ``--set``
        overrides (text values parsed as each field's type)."""

    @abstractmethod
    def resolve_config(self, config: Any, overrides: Mapping[str, Any], *, arg: str = "config") -> Any:
        """A preset name, a ``.toml``/``.json`` path or a config of this engine's type, with field
        overrides (values or their text): checked, nothing written. ``arg`` is the argument a bad value is
        reported under."""

    @abstractmethod
    def field_names(self) -> Sequence[str]:
        """Every settable name of this engine's config, nested ones dotted: what ``--set`` and a
        comparison's keyword changes may name."""

    def gpus_per_node(self, config: Any) -> int:
        """The GPUs the server uses on each node it runs on: what a Slurm job must ask for at least."""
        return 1

    def check_plan(self, config: Any, version: str, hardware: HardwareProfile) -> None:
        """Raise for a config that cannot run as planned on ``hardware`` (what a notebook runner refuses
        before a kernel starts): by default what :meth:`check` refuses."""
        self.check(config, version, None)

    @abstractmethod
    def preflight(self, config: Any, version: str, *, hardware: HardwareProfile, facts: HostFacts) -> Any:
        """The memory model's prediction for ``config``: an object that shows itself, with ``fits``,
        ``explain()`` and ``to_dict()``. ``facts`` reads the server host (its memory) only when the engine's
        model needs it."""

    def diagnose(self, log: Any, *, hardware: Any = None, version: str | None = None) -> Diagnosis:
        """What the server's log says went wrong (the log reading alone; an engine with a memory model adds
        its arithmetic)."""
        return diagnose(log)

    def default_python(self, local: bool) -> str:
        """The server host's interpreter when the user names none."""
        return "python3"

    # -- per session -------------------------------------------------------------------------------------

    def launch_env(self, session: SessionSettings) -> dict[str, str] | None:
        """Engine settings exported into every launch of a session (``None``: none)."""
        return None

    def session_clock(self, pace: float | None, hardware: str | None) -> Clock:
        """The clock of a session with these settings (reports read it from the notebook's parameters)."""
        return REAL

    def clock(self, settings: Mapping[str, str] | None) -> Clock:
        """The clock a server's figures are read on."""
        return REAL

    def smi(
        self,
        python: str,
        port: int | None,
        settings: Mapping[str, str] | None,
        *,
        pid: int | None = None,
        run_dir: str | None = None,
    ) -> SmiSpec:
        """How to sample this server's GPU memory (``port``, ``pid`` or ``run_dir`` picks one of several
        servers where the sampler cannot tell them apart otherwise)."""
        return SmiSpec()

    def sample_interval_ms(self, settings: Mapping[str, str] | None) -> int:
        return 500

    def release_words(self, version: str) -> str:
        """How a report names the flags' release ("SGLang 0.5.23 flags")."""
        return f"{self.name} {version} flags"

    def known_versions(self) -> Sequence[str]:
        return ()
