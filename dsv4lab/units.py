"""Clocks and units: the one rule every figure a person reads goes through.

The twin runs every duration ``time_scale`` times as long as the hardware it models (0.02: fifty times
faster), so what a client measures on it — tok/s, TTFT, a startup's length, a profile's kernel time — is
on the *twin clock*. A reader wants the modelled hardware's figure: a twin that decodes 1,034 tok/s on its
clock stands for 20.7 tok/s on eight RTX PRO 6000s. Mixing the two on one page made one config read 20.7
and 1,034 tok/s a few lines apart, so the rule is:

- every figure a person reads (progress lines, cards, tables, chart axes, narrative, the CLI, the
  headline keys of ``results.json``) is on the :attr:`Clock.reading` clock: the modelled hardware on the
  twin, the server's own clock on a real one;
- a twin-clock value appears only in a column or key whose name says so (:data:`TWIN_CLOCK`);
- the lab's own reaction times (how long after a fatal line the watcher said CRASHED) are wall-clock
  seconds on this machine, the same on the twin and on hardware, and are labelled as such;
- every number carries its unit (the ``fmt_*`` helpers below).

Results keep what was measured (a benchmark's ``summary``, a watch's ``elapsed_s``) because that is the
record; :class:`Clock` converts it for reading (``seconds``, ``rate``; a benchmark summary through
:meth:`dsv4lab.bench.metrics.Summary.on_clock`, built on them), and nothing else converts anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "REAL",
    "TWIN_CLOCK",
    "WALL_CLOCK",
    "Clock",
    "fmt_gib",
    "fmt_ms",
    "fmt_pct",
    "fmt_s",
    "fmt_tok_s",
]

#: The words that name a twin-clock column or key (``"output tok/s (twin clock)"``, ``..._twin_clock``).
TWIN_CLOCK = "twin clock"
#: How the lab's own reaction times are labelled.
WALL_CLOCK = "wall clock"


@dataclass(frozen=True)
class Clock:
    """How figures measured on a server map to the figures a person reads.

    ``time_scale`` is the twin's (durations there are ``time_scale`` x the modelled hardware's); ``None``
    for a real server, whose figures are read as measured. ``hardware`` names the modelled hardware
    profile in labels.
    """

    time_scale: float | None = None
    hardware: str | None = None

    @classmethod
    def twin(cls, time_scale: float, hardware: str | None = None) -> Clock:
        if not (time_scale > 0 and math.isfinite(time_scale)):
            raise ValueError(f"a twin's time scale must be a positive number, not {time_scale!r}")
        return cls(float(time_scale), hardware)

    @classmethod
    def from_twin_env(cls, env: Mapping[str, str] | None) -> Clock:
        """The clock of a launch from its twin settings (``DSV4LAB_TWIN_TIME_SCALE``, ``..._HARDWARE``);
        REAL when there are none (a real server)."""
        if not env:
            return REAL
        try:
            scale = float(env.get("DSV4LAB_TWIN_TIME_SCALE", "1") or 1)
        except ValueError:
            scale = 1.0
        return cls.twin(scale if scale > 0 else 1.0, env.get("DSV4LAB_TWIN_HARDWARE") or None)

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any] | None) -> Clock:
        """The clock of a server from its ``/server_info`` (the twin says it is one, with its scale)."""
        twin = (info or {}).get("twin")
        if isinstance(twin, Mapping):
            value = twin.get("time_scale")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                hardware = twin.get("hardware")
                return cls.twin(float(value), str(hardware) if hardware else None)
        return REAL

    # -- what it is -----------------------------------------------------------------------------------

    @property
    def is_twin(self) -> bool:
        return self.time_scale is not None

    @property
    def reading(self) -> str:
        """The clock figures are read on, in words: ``modelled hardware`` or ``measured``."""
        return "modelled hardware" if self.is_twin else "measured"

    @property
    def tag(self) -> str:
        """A short suffix for a label that must say its clock on its own (a progress line, a CLI line)."""
        return " (modelled)" if self.is_twin else ""

    def note(self) -> str:
        """The sentence a page carries once: which clock its figures are on."""
        if self.time_scale is None:
            return "Figures as measured on the server."
        on = f" ({self.hardware})" if self.hardware else ""
        speed = 1 / self.time_scale
        pace = f"{speed:,.0f}x faster than" if speed >= 1 else f"{1 / speed:,.0f}x slower than"
        return (
            f"Twin run: every time and rate is shown for the modelled hardware{on}; the twin ran {pace} it "
            f"(time scale {self.time_scale:g}). Columns marked '{TWIN_CLOCK}' hold the twin's own measurements; "
            f"reaction times of the lab itself are {WALL_CLOCK} seconds."
        )

    def to_dict(self) -> dict[str, Any]:
        return {"reading": self.reading, "time_scale": self.time_scale, "hardware": self.hardware}

    # -- conversions ----------------------------------------------------------------------------------

    def seconds(self, measured_s: float) -> float:
        """A duration measured on the server as the reader's seconds."""
        return measured_s if self.time_scale is None else measured_s / self.time_scale

    def rate(self, measured_per_s: float) -> float:
        """A rate measured on the server (tok/s, req/s) as the reader's."""
        return measured_per_s if self.time_scale is None else measured_per_s * self.time_scale


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
