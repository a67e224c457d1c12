"""Clocks and units: the one rule every figure a person reads goes through.

The twin keeps its own modelled time (:mod:`dsv4lab.twin.clock`): every chunk it streams, every log line and
every profile says when it happened on the modelled hardware's timeline, and the lab reads its figures from
those stamps. So a twin's figures are already the modelled hardware's, whether the twin ran in virtual time
(``twin-virtual``: as fast as the host computes, the default) or paced on the wall clock at some pace
(``twin-paced``); a real server's are what the client measured on the wall clock (``wall``). The rule:

- every figure a person reads (progress lines, cards, tables, chart axes, narrative, the CLI, the
  headline keys of ``results.json``) is on the :attr:`Clock.reading` clock, and a page says once which;
- the lab's own reaction times (how long after a fatal line the watcher said CRASHED) and the host's lag
  behind a twin are wall-clock seconds on this machine, and are labelled as such;
- every number carries its unit (the ``fmt_*`` helpers below).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "REAL",
    "WALL_CLOCK",
    "Clock",
    "ClockKind",
    "fmt_gib",
    "fmt_ms",
    "fmt_pct",
    "fmt_s",
    "fmt_tok_s",
]

#: How the lab's own reaction times are labelled.
WALL_CLOCK = "wall clock"
#: Which clock a server's figures are on.
ClockKind = Literal["twin-virtual", "twin-paced", "wall"]


@dataclass(frozen=True)
class Clock:
    """Which clock a server's figures are on: the twin's modelled time (virtual or paced at ``pace`` wall
    seconds per modelled second) or the wall clock of a real server. ``hardware`` names the modelled
    hardware profile in labels."""

    kind: ClockKind = "wall"
    pace: float | None = None
    hardware: str | None = None

    @classmethod
    def twin(cls, pace: float | None, hardware: str | None = None) -> Clock:
        if pace is None:
            return cls("twin-virtual", None, hardware)
        if not (pace > 0 and math.isfinite(pace)):
            raise ValueError(f"a twin's pace must be a positive number, not {pace!r}")
        return cls("twin-paced", float(pace), hardware)

    @classmethod
    def from_twin_env(cls, env: Mapping[str, str] | None) -> Clock:
        """The clock of a launch from its twin settings (``DSV4LAB_TWIN_PACE``, ``..._HARDWARE``); REAL when
        there are none (a real server)."""
        if env is None:
            return REAL
        raw = (env.get("DSV4LAB_TWIN_PACE") or env.get("DSV4LAB_TWIN_TIME_SCALE") or "").strip()
        try:
            pace: float | None = float(raw) if raw else None
        except ValueError:
            pace = None
        pace = pace if pace is not None and pace > 0 and math.isfinite(pace) else None
        return cls.twin(pace, env.get("DSV4LAB_TWIN_HARDWARE") or None)

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any] | None) -> Clock:
        """The clock of a server from its ``/server_info`` (the twin says it is one, and on which clock)."""
        twin = (info or {}).get("twin")
        if not isinstance(twin, Mapping):
            return REAL
        hardware = str(twin["hardware"]) if twin.get("hardware") else None
        pace = twin.get("pace")
        if twin.get("clock") == "paced" and isinstance(pace, (int, float)) and not isinstance(pace, bool) and pace > 0:
            return cls.twin(float(pace), hardware)
        return cls.twin(None, hardware)

    # -- what it is -----------------------------------------------------------------------------------

    @property
    def is_twin(self) -> bool:
        return self.kind != "wall"

    @property
    def reading(self) -> str:
        """The clock figures are read on, in words: ``modelled hardware`` or ``measured``."""
        return "modelled hardware" if self.is_twin else "measured"

    @property
    def tag(self) -> str:
        """A short suffix for a label that must say its clock on its own (a progress line, a CLI line)."""
        return " (modelled)" if self.is_twin else ""

    @property
    def how(self) -> str:
        """How a twin ran, in a few words: ``in virtual time`` or ``paced at 0.02``."""
        return "in virtual time" if self.pace is None else f"paced at {self.pace:g}"

    @property
    def caption(self) -> str:
        """A chart subtitle's words for a twin's clock (empty for a real server)."""
        if not self.is_twin:
            return ""
        return f"twin run ({self.how}): times and rates on the modelled hardware's clock"

    def note(self) -> str:
        """The sentence a page carries once: which clock its figures are on."""
        if not self.is_twin:
            return "Figures as measured on the server."
        on = f" ({self.hardware})" if self.hardware else ""
        how = (
            "in virtual time, as fast as this machine could compute it"
            if self.pace is None
            else f"paced at {self.pace:g} wall seconds per modelled second"
        )
        return (
            f"Twin run: every time and rate is the modelled hardware's{on}, read from the twin's own stamps; the "
            f"twin ran {how}, so the figures do not depend on this machine. Reaction times of the lab itself "
            f"are {WALL_CLOCK} seconds."
        )

    def to_dict(self) -> dict[str, Any]:
        return {"reading": self.reading, "clock": self.kind, "pace": self.pace, "hardware": self.hardware}


#: A real server's clock: figures as measured.
REAL = Clock()


# -- units ---------------------------------------------------------------------------------------------


def _num(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_tok_s(value: float | None, digits: int = 1) -> str:
    """``"20.7 tok/s"``; ``"–"`` when unmeasured."""
    return "–" if _missing(value) else f"{_num(float(value), digits)} tok/s"  # type: ignore[arg-type]


def fmt_ms(value: float | None) -> str:
    """Milliseconds with a precision that suits their size: ``"0.42 ms"``, ``"38.1 ms"``, ``"1,905 ms"``."""
    if _missing(value):
        return "–"
    v = float(value)  # type: ignore[arg-type]
    digits = 2 if abs(v) < 10 else 1 if abs(v) < 1000 else 0
    return f"{_num(v, digits)} ms"


def fmt_s(value: float | None) -> str:
    """Seconds: ``"0.06 s"``, ``"2.9 s"``, ``"145 s"``."""
    if _missing(value):
        return "–"
    v = float(value)  # type: ignore[arg-type]
    digits = 2 if abs(v) < 1 else 1 if abs(v) < 100 else 0
    return f"{_num(v, digits)} s"


def fmt_gib(value: float | None, digits: int = 1) -> str:
    """A memory figure with its unit: ``20.04`` -> ``"20.0 GiB"``, ``–`` when not measured."""
    return "–" if _missing(value) else f"{_num(float(value), digits)} GiB"  # type: ignore[arg-type]


def fmt_pct(value: float | None, digits: int = 0, *, signed: bool = False) -> str:
    """A fraction as a percentage: ``0.634`` -> ``"63%"`` (``signed``: ``"+4.9%"``)."""
    if _missing(value):
        return "–"
    sign = "+" if signed else ""
    return f"{float(value):{sign}.{digits}%}"  # type: ignore[arg-type]
