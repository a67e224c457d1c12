"""The twin's modelled clock: one timeline for the scheduler, the ranks' startup, the log and the stand-ins.

Why the twin keeps its own time: a twin that paces modelled GPU time on the wall clock turns every stall of
its host (a busy core, a slow disk write, the garbage collector) into modelled seconds, magnified by the
time scale (a tenth of a second at 0.02 is five seconds of GPU time), and its figures then differ from run
to run. A discrete-event simulator of serving (Vidur, LLMServingSim; SGLang's own scheduler is step-driven)
advances a virtual clock from event to event instead, so what it reports depends on the workload and the
model only.

Two modes:

* **virtual** (the default, ``pace`` None): modelled time moves only by modelled durations (a startup phase,
  a prefill, a decode step), as fast as the host computes them. While the server has nothing to do it follows
  the wall clock at rate 1 (an idle GPU idles for as long as nobody asks it anything), so the log and the
  memory stand-in go on telling time.
* **paced** (``pace`` s, e.g. 0.02): wall time follows modelled time at that scale, for what needs real time
  on the wire (watching a crash happen, the Stop button, a live memory sampler). Modelled time is then
  ``(wall - start) / pace``.

The forked rank processes share one anonymous memory map with the main process: each rank writes how far
its own startup has got, and the main process's time during the launch is the furthest rank's. In virtual
time the ranks advance conservatively, like the processes of a parallel discrete-event simulation: a rank
goes past modelled time T only once every other rank has reached T (or finished its startup), so what each
logs and allocates lands in the same order on any machine. A rank that fails freezes the launch's timeline
at its moment: the others stop there, and the main process's teardown lines carry that time. Times are
seconds since :attr:`TwinClock.epoch`, a whole second of the wall clock taken at the start, so that a log
timestamp's millisecond digits depend on the modelled offset alone, not on when the twin happened to start.
"""

from __future__ import annotations

import math
import mmap
import struct
import time

__all__ = ["TwinClock"]

_D = struct.Struct("d")
#: Slots of the shared map: the main process's time, when it went idle (NaN: busy), when a rank failed (NaN:
#: none did), then each rank's time, then whether each rank is done with its startup.
_MAIN, _IDLE, _FROZEN, _RANKS = 0, 1, 2, 3
#: How often (wall seconds) a rank looks whether the others have caught up with it.
_POLL_S = 0.0005


class TwinClock:
    """Modelled seconds since :attr:`epoch` for every process of one twin (create it before forking)."""

    def __init__(self, pace: float | None, ranks: int = 0) -> None:
        if pace is not None and not (math.isfinite(pace) and pace > 0):
            raise ValueError(f"a twin's pace must be a positive number of wall seconds per modelled second, not {pace}")
        self.pace = pace
        #: The wall-clock second the modelled timeline starts at (log timestamps are ``epoch + now()``).
        self.epoch = float(int(time.time()))
        self._mono0 = time.monotonic()
        #: The wall-clock moment of modelled time 0 (paced: modelled time is wall time since it, over pace).
        self.zero_wall = time.time()
        self._n = max(ranks, 1)
        self._map = mmap.mmap(-1, _D.size * (_RANKS + 2 * self._n))
        self._put(_IDLE, math.nan)
        self._put(_FROZEN, math.nan)
        self._rank: int | None = None
        self._local = 0.0

    @property
    def mode(self) -> str:
        """``virtual`` or ``paced``: the ``clock`` the twin reports in ``/server_info``."""
        return "virtual" if self.pace is None else "paced"

    @property
    def virtual(self) -> bool:
        return self.pace is None

    # -- shared slots ---------------------------------------------------------------------------------

    def _get(self, slot: int) -> float:
        return float(_D.unpack_from(self._map, slot * _D.size)[0])

    def _put(self, slot: int, value: float) -> None:
        _D.pack_into(self._map, slot * _D.size, value)

    def _ranks_max(self) -> float:
        return max(self._get(_RANKS + i) for i in range(self._n))

    def _others_behind(self, t: float) -> bool:
        """Whether a rank other than this one, not done with its startup, is still before ``t``."""
        for i in range(self._n):
            if i != self._rank and not self._get(_RANKS + self._n + i) and self._get(_RANKS + i) < t:
                return True
        return False

    # -- reading --------------------------------------------------------------------------------------

    def now(self) -> float:
        """Modelled seconds since :attr:`epoch`, as this process knows them."""
        if self.pace is not None:
            return (time.monotonic() - self._mono0) / self.pace
        if self._rank is not None:
            return self._local
        frozen = self._get(_FROZEN)
        if not math.isnan(frozen):
            return frozen
        t = max(self._get(_MAIN), self._ranks_max())
        idle = self._get(_IDLE)
        return t if math.isnan(idle) else t + max(0.0, time.monotonic() - idle)

    def stamp(self) -> float:
        """The modelled moment as a wall-clock date (seconds since 1970), for log timestamps."""
        return self.epoch + self.now()

    def state(self) -> dict[str, object]:
        """What the ``nvidia-smi`` stand-in needs to tell the twin's modelled time from its state file."""
        idle = self.pace is None and self._rank is None and not math.isnan(self._get(_IDLE))
        return {
            "mode": self.mode,
            "pace": self.pace,
            "epoch": self.epoch,
            "zero_wall": self.zero_wall,
            "now": self.stamp(),
            "wall": time.time(),
            "idle": idle,
        }

    # -- moving it ------------------------------------------------------------------------------------

    def as_rank(self, rank: int) -> None:
        """In a forked rank process: keep this rank's own time from now on, starting where the main process
        was when it forked the ranks (not where a rank forked earlier has got to)."""
        self._local = self._get(_MAIN) if self.pace is None else self.now()
        self._rank = rank
        self._put(_RANKS + rank, self._local)

    def sleep(self, seconds: float) -> None:
        """A modelled duration passes: slept for ``pace`` x it when paced, counted at once when virtual."""
        if seconds <= 0:
            return
        if self.pace is not None:
            time.sleep(seconds * self.pace)
            return
        if self._rank is not None:
            self._local += seconds
            self._put(_RANKS + self._rank, self._local)
            self._wait_for_others()
        else:
            self.advance_to(self.now() + seconds)

    def _wait_for_others(self) -> None:
        """Block until every other rank has reached this one's time; for ever once a rank has failed (the
        main process then ends this one)."""
        while True:
            if not math.isnan(self._get(_FROZEN)):
                while True:
                    time.sleep(3600)
            if not self._others_behind(self._local):
                return
            time.sleep(_POLL_S)

    def rank_done(self, done: bool = True) -> None:
        """This rank's startup is over (or it waits at a collective, where the others must reach it): the
        others no longer wait for it."""
        if self._rank is not None:
            self._put(_RANKS + self._n + self._rank, 1.0 if done else 0.0)

    def freeze(self) -> None:
        """This rank failed: the launch's timeline ends at its time (the first failure's, if several)."""
        if self.pace is None and self._rank is not None and math.isnan(self._get(_FROZEN)):
            self._put(_FROZEN, self._local)

    def catch_up(self) -> None:
        """In a rank after a collective: every rank leaves it at the time of the latest to arrive."""
        if self.pace is None and self._rank is not None:
            self._local = max(self._local, self._ranks_max())
            self._put(_RANKS + self._rank, self._local)

    def advance_to(self, t: float) -> None:
        """The main process's time is ``t`` (never backwards), and it is busy."""
        if self.pace is None:
            self._put(_MAIN, max(t, self._get(_MAIN)))
            self._put(_IDLE, math.nan)

    def idle(self) -> None:
        """The server has nothing to do: virtual time follows the wall clock until :meth:`busy`."""
        if self.pace is None and math.isnan(self._get(_IDLE)):
            self._put(_MAIN, self.now())
            self._put(_IDLE, time.monotonic())

    def busy(self) -> float:
        """Work arrived: virtual time stops following the wall clock; the modelled time it starts at."""
        now = self.now()
        if self.pace is None:
            self._put(_MAIN, now)
            self._put(_IDLE, math.nan)
        return now
