"""The SGLang twin: SGLang's flags and log, on modelled hardware, with no GPU.

It is started as ``python -m dsv4lab.twin`` with the same flags SGLang would get; what only the twin
reads (its hardware profile, pace, fault, seed) is exported by the launch script, so that the
launch line stays SGLang's and a notebook moves to a real host by changing one parameter.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from dsv4lab.engines.base import SessionSettings, SmiSpec
from dsv4lab.engines.sglang import SGLangEngine, as_server_config
from dsv4lab.units import Clock

__all__ = ["TwinEngine", "twin_interval_ms"]

#: Twin settings the GPU stand-in needs to see the same state as the twin it reports on.
_SMI_ENV_KEYS = ("DSV4LAB_TWIN_STATE_DIR", "DSV4LAB_TWIN_HARDWARE")


def twin_interval_ms(pace: float | None, real_interval_ms: int = 500) -> int:
    """The sampling interval that sees on the twin what ``real_interval_ms`` sees on real hardware.

    A paced twin runs every phase ``pace`` times as long, so the interval shrinks with it (20 ms floor); in
    virtual time an idle twin's clock follows the wall clock, and the interval is the hardware's.
    """
    if pace is None:
        return real_interval_ms
    return max(20, min(real_interval_ms, round(real_interval_ms * pace)))


class TwinEngine(SGLangEngine):
    """SGLang's flags and log on modelled hardware: the twin's settings travel in the launch environment and
    its memory model refuses at launch what would make the twin exit."""

    name = "twin"
    description = "the SGLang twin (no GPU; modelled hardware)"
    module = "dsv4lab"
    rehearsal = True

    def default_python(self, local: bool) -> str:
        # The twin is this package: on this machine, the interpreter running the lab has it.
        return sys.executable if local else "python3"

    def check(self, config: Any, version: str, settings: Mapping[str, str] | None) -> None:
        """Also what would make the twin exit at start: its settings (hardware, time scale, fault) and the
        memory model's refusals (an unknown model, more GPUs than the hardware has). Found before the
        launch, they are bad input, not a crash to diagnose."""
        from dsv4lab.model.memory import preflight
        from dsv4lab.twin.settings import TwinSettings

        super().check(config, version, settings)
        twin = TwinSettings.from_env({**(settings or {}), "DSV4LAB_TWIN_SGLANG_VERSION": version})
        preflight(as_server_config(config, self.name), twin.hardware, sglang_version=twin.release)

    def launch_env(self, session: SessionSettings) -> dict[str, str]:
        env = {
            "DSV4LAB_TWIN_HARDWARE": session.hardware,
            "DSV4LAB_TWIN_PACE": "" if session.pace is None else repr(float(session.pace)),
            # Millisecond log timestamps (SGLang's own switch): a scaled startup lasts seconds, and the
            # memory timeline's phase bands need finer than a second to line up with the samples.
            "SGLANG_LOG_MS": "1",
        }
        if session.fault:
            env["DSV4LAB_TWIN_FAULT"] = session.fault
        if session.seed is not None:
            env["DSV4LAB_TWIN_SEED"] = str(session.seed)
        return env

    def session_clock(self, pace: float | None, hardware: str | None) -> Clock:
        return Clock.twin(pace, hardware)

    def clock(self, settings: Mapping[str, str] | None) -> Clock:
        return Clock.from_twin_env({"DSV4LAB_TWIN_HARDWARE": "", **dict(settings or {})})

    def smi(
        self,
        python: str,
        port: int | None,
        settings: Mapping[str, str] | None,
        *,
        pid: int | None = None,
        run_dir: str | None = None,
    ) -> SmiSpec:
        env = {k: v for k, v in (settings or {}).items() if k in _SMI_ENV_KEYS}
        if port is not None:
            env["DSV4LAB_TWIN_SMI_PORT"] = str(int(port))
        if pid is not None:
            env["DSV4LAB_TWIN_SMI_PID"] = str(int(pid))
        return SmiSpec((python, "-m", "dsv4lab.twin.smi"), env)

    def sample_interval_ms(self, settings: Mapping[str, str] | None) -> int:
        return twin_interval_ms(Clock.from_twin_env(settings).pace)
