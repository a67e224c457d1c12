"""Twin-only settings from the environment, so that the launch line stays exactly SGLang's.

The launch script exports these for ``target="twin"``; tests and notebooks set them directly.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dsv4lab.config.hardware import HardwareProfile, hardware_profile
from dsv4lab.config.versions import SGLangRelease, resolve_release
from dsv4lab.errors import ConfigError
from dsv4lab.twin.faults import Fault, parse_fault

__all__ = ["DEFAULT_HARDWARE", "TwinSettings", "default_state_dir"]

#: The hardware a twin models when ``DSV4LAB_TWIN_HARDWARE`` is unset: the story's host.
DEFAULT_HARDWARE = "rtx-pro-6000-x8"


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where a running twin leaves its GPU state for the nvidia-smi stand-in (per user)."""
    env = os.environ if env is None else env
    given = env.get("DSV4LAB_TWIN_STATE_DIR", "").strip()
    if given:
        return Path(given).expanduser()
    return Path(tempfile.gettempdir()) / f"dsv4lab-twin-{os.getuid()}"


def _allocated(hw: HardwareProfile, env: Mapping[str, str]) -> HardwareProfile:
    """Inside a Slurm job the twin has the GPUs the job was given (``CUDA_VISIBLE_DEVICES``, as Slurm sets it
    for ``--gres=gpu:N``), as a real server would see, not the whole host of its profile."""
    if not env.get("SLURM_JOB_ID") or "CUDA_VISIBLE_DEVICES" not in env:
        return hw
    visible = [d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    return dataclasses.replace(hw, count=len(visible)) if len(visible) < hw.count else hw


@dataclass(frozen=True)
class TwinSettings:
    """What the twin emulates besides SGLang's flags."""

    hardware: HardwareProfile
    #: Wall seconds per modelled second when paced (1.0 = real time); None: virtual time, as fast as the host
    #: computes (see :mod:`dsv4lab.twin.clock`).
    pace: float | None
    fault: Fault | None
    seed: int
    release: SGLangRelease
    #: Where tuned FP8 block-GEMM JSONs are looked up (None: nowhere, so SGLang's defaults are used).
    kernel_config_dir: Path | None
    state_dir: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TwinSettings:
        env = os.environ if env is None else env
        hw = _allocated(hardware_profile(env.get("DSV4LAB_TWIN_HARDWARE", "").strip() or DEFAULT_HARDWARE), env)
        pace = _pace(env)
        raw_seed = env.get("DSV4LAB_TWIN_SEED", "").strip() or "0"
        try:
            seed = int(raw_seed)
        except ValueError:
            raise ConfigError("DSV4LAB_TWIN_SEED", raw_seed, "an integer") from None
        version = env.get("DSV4LAB_TWIN_SGLANG_VERSION", "").strip() or None
        release = resolve_release(version, warn=False)
        kdir = env.get("DSV4LAB_TWIN_KERNEL_CONFIG_DIR", "").strip()
        return cls(
            hardware=hw,
            pace=pace,
            fault=_fault(env.get("DSV4LAB_TWIN_FAULT")),
            seed=seed,
            release=release,
            kernel_config_dir=Path(kdir).expanduser() if kdir else None,
            state_dir=default_state_dir(env),
        )

    def fault_named(self, name: str) -> Fault | None:
        return self.fault if self.fault is not None and self.fault.name == name else None


def _pace(env: Mapping[str, str]) -> float | None:
    """``DSV4LAB_TWIN_PACE`` (or its old name ``DSV4LAB_TWIN_TIME_SCALE``): a positive number paces the twin;
    empty or absent is virtual time."""
    for name in ("DSV4LAB_TWIN_PACE", "DSV4LAB_TWIN_TIME_SCALE"):
        raw = env.get(name, "").strip()
        if not raw:
            continue
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(name, raw, "a positive number of wall seconds per modelled second, or empty") from None
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(name, raw, "a positive number of wall seconds per modelled second, or empty")
        return value
    return None


def _fault(text: str | None) -> Fault | None:
    """The twin's fault from its environment; a bad one is refused naming the variable it came from."""
    try:
        return parse_fault(text)
    except ConfigError as exc:
        raise exc.within("DSV4LAB_TWIN_FAULT: ", field="DSV4LAB_TWIN_FAULT") from None
