"""Faults a user can rehearse against the twin (``DSV4LAB_TWIN_FAULT=name[:value]``).

Each fault reproduces a way real launches go wrong that a watcher must tell apart: a server that
vanishes without a word, one that hangs mid-capture while alive, an NCCL init failure, a busy port,
a crash after it was serving, and a start that is merely slow.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4lab.errors import ConfigError, UnknownNameError

__all__ = ["FAULTS", "Fault", "parse_fault"]

#: name -> (meaning, default value)
FAULTS: dict[str, tuple[str, float]] = {
    "silent_death": ("the whole tree is SIGKILLed during weight loading; no message (exit 137)", 0.5),
    "capture_hang": ("CUDA graph capture starts and never progresses; every process stays alive", 0.0),
    "nccl_error": ("distributed init fails with an NCCL error on one rank; SIGQUIT chain, exit 137", 0.0),
    "port_in_use": ("the HTTP port cannot be bound once the schedulers are ready; exit 1", 0.0),
    "crash_serving": ("scheduler rank 0 dies VALUE seconds (scaled) after ready; SIGQUIT chain, exit 137", 5.0),
    "slow_start": ("every startup phase takes VALUE times longer", 4.0),
}


@dataclass(frozen=True)
class Fault:
    """A fault to inject and its parameter (seconds, fraction or factor, by fault)."""

    name: str
    value: float

    def __str__(self) -> str:
        return f"{self.name}:{self.value:g}"


def parse_fault(text: str | None) -> Fault | None:
    """``"crash_serving:2"`` -> Fault; empty/None/"none" -> None; unknown names raise ConfigError."""
    if text is None or not text.strip() or text.strip().lower() == "none":
        return None
    name, _, raw = text.strip().partition(":")
    name = name.strip().lower().replace("-", "_")
    if name not in FAULTS:
        raise UnknownNameError("twin fault", name, FAULTS, field="DSV4LAB_TWIN_FAULT", also="NAME:VALUE of one")
    if raw.strip():
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError("DSV4LAB_TWIN_FAULT", text, "NAME:VALUE with a number as VALUE") from None
    else:
        value = FAULTS[name][1]
    return Fault(name, value)
