"""An ``nvidia-smi`` stand-in that answers from a running twin's GPU state.

Memory-sampling code calls ``nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu
--format=csv,noheader,nounits -lms 500``; against the twin it should work unchanged, loop mode included. The
twin's processes leave small JSON files in a per-user state directory (main process: hardware, port and
utilisation; each scheduler rank: its GPU's used memory, updated after every allocation); this module reads
them. With no twin running it reports the idle GPUs of the chosen hardware profile.

Several twins may run on one machine (an A/B runs two side by side), so a sampler must be able to say which
one it means: ``DSV4LAB_TWIN_SMI_PORT`` (the twin's HTTP port) or ``DSV4LAB_TWIN_SMI_PID`` (its main PID)
select it; without either, the most recently updated twin answers.

**Time is the twin's.** Every ``timestamp`` the stand-in prints is the twin's modelled time, as its log's
are, so a memory timeline lines up with the log's phases on the modelled hardware's clock. In loop mode the
samples are taken at the modelled moments of a fixed schedule, from each GPU's recorded history of
allocations: a twin in virtual time starts in a fraction of a second, and a live poll would see none of its
startup, where a schedule on its own clock sees all of it, the same on every run.

A twin that exits keeps its memory for a short while, as a real GPU does while the driver tears a killed
process's contexts down (:data:`RELEASE_S` modelled seconds); that is also what lets a sampler see the
failing GPU's peak before the memory drops. The hold ends when its time is up *and* a stand-in has reported
it once (for at most :data:`UNSEEN_GRACE_S` more wall seconds). :func:`write_smi_shim` puts an executable
``nvidia-smi`` into a directory meant for a twin run's ``PATH`` — never anywhere global.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsv4lab.config.hardware import HardwareProfile, hardware_profile
from dsv4lab.errors import ConfigError
from dsv4lab.twin.settings import DEFAULT_HARDWARE, default_state_dir

__all__ = [
    "RELEASE_S",
    "SELECT_PID_ENV",
    "SELECT_PORT_ENV",
    "UNSEEN_GRACE_S",
    "GpuRow",
    "main",
    "read_gpus",
    "release_state",
    "write_gpu_state",
    "write_main_state",
    "write_smi_shim",
]

#: Environment variables that pick one twin among several running on the machine.
SELECT_PORT_ENV = "DSV4LAB_TWIN_SMI_PORT"
#: The twin's main PID, when its port is not known (see :data:`SELECT_PORT_ENV`).
SELECT_PID_ENV = "DSV4LAB_TWIN_SMI_PID"

#: Modelled seconds a dead twin's GPU memory stays in use while the driver releases it [E].
RELEASE_S = 1.0

#: Wall-clock seconds past its release time that a dead twin's memory still reads as in use while no stand-in
#: has reported it as held (the first one that does, sees it; then it is released). Bounded, so that a twin
#: nobody sampled does not answer a sampler started long after it died.
UNSEEN_GRACE_S = 10.0

#: Shortest loop interval the stand-in accepts (ms); nvidia-smi itself has no useful floor below this.
MIN_LOOP_MS = 5


def _atomic_write(path: Path, data: Mapping[str, object]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # the GPU view is best effort; serving must not fail because /tmp is full


def write_main_state(
    state_dir: Path,
    main_pid: int,
    hardware: str,
    utilization: Mapping[int, float],
    gpus: Sequence[int],
    *,
    port: int | None = None,
    clock: Mapping[str, object] | None = None,
) -> None:
    """A twin's own entry for the stand-in: its hardware, GPUs, port and utilization, so ``nvidia-smi`` on a
    machine running several twins can tell them apart, and its clock (:meth:`TwinClock.state
    <dsv4lab.twin.clock.TwinClock.state>`), so the stand-in tells time as the twin does."""
    _atomic_write(
        state_dir / f"twin-{main_pid}.json",
        {
            "pid": main_pid,
            "hardware": hardware,
            "port": port,
            "updated": time.time(),
            "gpus": list(gpus),
            "utilization": {str(k): v for k, v in utilization.items()},
            "clock": dict(clock or {}),
        },
    )


def release_state(state_dir: Path, main_pid: int, after_s: float, *, died_at: float | None = None) -> None:
    """The twin is exiting: its memory reads as in use for ``after_s`` more seconds, then as free.

    Called instead of removing the state files, so that a sampler sees the memory drop the way it does
    on a GPU — after the process is gone — and not before the crash it is trying to show.
    """
    path = state_dir / f"twin-{main_pid}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(data, dict):
        return
    data.update(released_at=time.time() + max(0.0, after_s), utilization={}, died_at=died_at, died_wall=time.time())
    _atomic_write(path, data)


def write_gpu_state(
    state_dir: Path,
    main_pid: int,
    gpu: int,
    used_mib: float,
    *,
    at: float | None = None,
    history: Sequence[tuple[float, float]] = (),
) -> None:
    """A rank's memory in use now (modelled time ``at``) and every change before it, for the stand-in to
    report; written whole, so a reader never sees half."""
    data = {"used_mib": used_mib, "updated": time.time(), "t": at, "history": [list(h) for h in history]}
    _atomic_write(state_dir / f"twin-{main_pid}.gpu{gpu}.json", data)


@dataclass(frozen=True)
class GpuRow:
    """One GPU as ``nvidia-smi --query-gpu`` reports it."""

    index: int
    name: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int

    @property
    def memory_free_mib(self) -> int:
        return self.memory_total_mib - self.memory_used_mib


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _selector(env: Mapping[str, str]) -> tuple[str, int] | None:
    for key, name in ((SELECT_PID_ENV, "pid"), (SELECT_PORT_ENV, "port")):
        raw = env.get(key, "").strip()
        if raw:
            try:
                return name, int(raw)
            except ValueError:
                raise ConfigError(key, raw, "an integer (a twin's main PID or HTTP port)") from None
    return None


def _seen_marker(state_dir: Path, pid: int) -> Path:
    """Present once a stand-in has reported the dead twin ``pid``'s memory as held (not ``*.json``: not a twin)."""
    return state_dir / f"twin-{pid}.held-seen"


def _forget(state_dir: Path, p: Path, pid: int) -> None:
    for stale in (p, *state_dir.glob(f"twin-{pid}.gpu*.json"), _seen_marker(state_dir, pid)):
        with contextlib.suppress(OSError):
            stale.unlink()


def _holding(state_dir: Path, pid: int, released_at: object, now: float) -> bool:
    """Whether a dead twin's memory still reads as in use: until its release time, and past it (for at most
    :data:`UNSEEN_GRACE_S`) while no stand-in has reported it held."""
    if not isinstance(released_at, (int, float)):
        return False
    if now < released_at:
        return True
    return now < released_at + UNSEEN_GRACE_S and not _seen_marker(state_dir, pid).exists()


def _running_twin(
    state_dir: Path, select: tuple[str, int] | None = None, *, reporting: bool = True, since: float | None = None
) -> dict[str, object] | None:
    """The twin to report: the selected one, else the most recently updated; alive, or still releasing.

    ``reporting``: the caller prints what it gets, so a releasing twin's held memory counts as seen. ``since``
    (wall clock): a loop started then ignores a twin that had died before it (a new sampler, started before a
    launch on a port an earlier twin held, must not sample that twin on that twin's clock)."""
    best: tuple[float, int, dict[str, object]] | None = None
    now = time.time()
    for p in state_dir.glob("twin-*.json"):
        if ".gpu" in p.name:
            continue
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            pid = int(data["pid"])
            released_at = data.get("released_at")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        releasing = _holding(state_dir, pid, released_at, now)
        if released_at is not None and not releasing:
            _forget(state_dir, p, pid)
            continue
        if not releasing and not _alive(pid):
            # A SIGKILLed twin cannot clean up after itself; its files would pile up and, once its PID
            # is reused, could pass for a live twin.
            _forget(state_dir, p, pid)
            continue
        if select is not None and data.get(select[0]) != select[1]:
            continue
        died_wall = data.get("died_wall")
        if since is not None and isinstance(died_wall, (int, float)) and died_wall < since:
            continue
        try:
            mtime = p.stat().st_mtime
        except OSError:
            continue
        if best is None or mtime > best[0]:
            best = (mtime, pid, data)
    if best is None:
        return None
    _, pid, twin = best
    if reporting and twin.get("released_at") is not None:
        with contextlib.suppress(OSError):
            _seen_marker(state_dir, pid).touch()
    return twin


def _idle_used_mib(hw: HardwareProfile, i: int) -> int:
    return max(1, round(hw.other_used_gib[i] * 1024)) if i < len(hw.other_used_gib) else 1


def _used_at(data: Mapping[str, object], at: float | None) -> float | None:
    """A GPU's memory in use at modelled time ``at`` (None: now) from its state; None before its first record."""
    history = data.get("history")
    if at is None or not isinstance(history, list) or not history:
        return float(data["used_mib"])  # type: ignore[arg-type]
    used: float | None = None
    for t, mib in history:
        if t > at:
            break
        used = float(mib)
    return used


def _released_by(twin: Mapping[str, object], at: float | None) -> bool:
    """A dead twin whose memory the driver has released by modelled time ``at``."""
    died = twin.get("died_at")
    return at is not None and isinstance(died, (int, float)) and at >= died + RELEASE_S


def read_gpus(
    env: Mapping[str, str] | None = None,
    *,
    reporting: bool = True,
    at: float | None = None,
    since: float | None = None,
) -> list[GpuRow]:
    """Every GPU of the host: from the running twin if there is one, else idle GPUs of the profile; at the
    twin's modelled time ``at`` (a date, seconds since 1970) from each GPU's history, or as they are now.

    ``reporting=False`` for a look that is not shown (a releasing twin's memory then does not count as seen)."""
    env = os.environ if env is None else env
    state_dir = default_state_dir(env)
    twin = _running_twin(state_dir, _selector(env), reporting=reporting, since=since)
    if twin is not None and _released_by(twin, at):
        twin = None
    hw_name = str(twin["hardware"]) if twin else (env.get("DSV4LAB_TWIN_HARDWARE", "").strip() or DEFAULT_HARDWARE)
    hw = hardware_profile(hw_name)
    util: Mapping[str, float] = {}
    if twin is not None:
        raw_util = twin.get("utilization")
        util = raw_util if isinstance(raw_util, dict) else {}
    rows = []
    for i in range(hw.count):
        used = _idle_used_mib(hw, i)
        if twin is not None:
            f = state_dir / f"twin-{twin['pid']}.gpu{i}.json"
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found = _used_at(json.loads(f.read_text(encoding="utf-8")), at)
                used = used if found is None else round(found)
        rows.append(GpuRow(i, hw.gpu.name, used, hw.gpu.total_mib, round(float(util.get(str(i), 0.0)))))
    return rows


_FIELDS = {
    "timestamp": ("timestamp", ""),
    "index": ("index", ""),
    "name": ("name", ""),
    "gpu_name": ("name", ""),
    "memory.used": ("memory.used", "MiB"),
    "memory.total": ("memory.total", "MiB"),
    "memory.free": ("memory.free", "MiB"),
    "utilization.gpu": ("utilization.gpu", "%"),
}


def twin_now(env: Mapping[str, str] | None = None, *, since: float | None = None) -> tuple[float, float | None] | None:
    """The selected twin's modelled time now (a date, seconds since 1970) and its pace (None: virtual);
    None when no twin with a clock runs."""
    env = os.environ if env is None else env
    state_dir = default_state_dir(env)
    twin = _running_twin(state_dir, _selector(env), reporting=False, since=since)
    clock = twin.get("clock") if twin is not None else None
    if twin is None or not isinstance(clock, dict) or not clock:
        return None
    wall = time.time()
    try:
        if clock.get("mode") == "paced":
            return float(clock["epoch"]) + (wall - float(clock["zero_wall"])) / float(clock["pace"]), float(
                clock["pace"]
            )
        died = twin.get("died_at")
        if isinstance(died, (int, float)):  # dead: its GPUs' time goes on at the wall's rate
            return float(died) + max(0.0, wall - float(twin["died_wall"])), None  # type: ignore[arg-type]
        now = float(clock["now"]) + (max(0.0, wall - float(clock["wall"])) if clock.get("idle") else 0.0)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    # Virtual time while the ranks start: the time every GPU has got to (each writes its own).
    reached = []
    for f in state_dir.glob(f"twin-{twin['pid']}.gpu*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            t = json.loads(f.read_text(encoding="utf-8")).get("t")
            if isinstance(t, (int, float)):
                reached.append(float(t))
    return (max(now, min(reached)) if reached else now), None


def _timestamp(now: float | None = None) -> str:
    """nvidia-smi's ``timestamp``: host local time, ``YYYY/MM/DD HH:MM:SS.mmm``."""
    t = _dt.datetime.fromtimestamp(time.time() if now is None else now)
    return t.strftime("%Y/%m/%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def _value(row: GpuRow, name: str, stamp: str = "") -> str:
    if name == "timestamp":
        return stamp or _timestamp()
    if name == "index":
        return str(row.index)
    if name in ("name", "gpu_name"):
        return row.name
    if name == "memory.used":
        return str(row.memory_used_mib)
    if name == "memory.total":
        return str(row.memory_total_mib)
    if name == "memory.free":
        return str(row.memory_free_mib)
    return str(row.utilization_pct)


def query(rows: Sequence[GpuRow], fields: Sequence[str], fmt: Sequence[str], *, now: float | None = None) -> str:
    """The CSV nvidia-smi prints for ``--query-gpu`` with ``--format=csv[,noheader][,nounits]``."""
    stamp = _timestamp(now) if "timestamp" in fields else ""
    lines = []
    units = "nounits" not in fmt
    if "noheader" not in fmt:
        lines.append(", ".join(f + (f" [{_FIELDS[f][1]}]" if _FIELDS[f][1] else "") for f in fields))
    for row in rows:
        cells = []
        for f in fields:
            v = _value(row, f, stamp)
            unit = _FIELDS[f][1]
            cells.append(f"{v} {unit}" if units and unit else v)
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"


def _table(rows: Sequence[GpuRow]) -> str:
    out = [time.strftime("%a %b %d %H:%M:%S %Y"), "dsv4lab twin nvidia-smi stand-in", ""]
    for r in rows:
        out.append(
            f"| {r.index:>3}  {r.name[:44]:<44} | {r.memory_used_mib:>6}MiB / {r.memory_total_mib:>6}MiB "
            f"| {r.utilization_pct:>3}% |"
        )
    return "\n".join(out) + "\n"


def _loop_ms(flag: str, value: str | None) -> int | None:
    """``-l``/``--loop`` take seconds, ``-lms``/``--loop-ms`` milliseconds (nvidia-smi's defaults: 5 s, 100 ms)."""
    ms_flag = flag in ("-lms", "--loop-ms")
    default = 100 if ms_flag else 5
    try:
        n = float(value) if value not in (None, "") else default
    except ValueError:
        raise ConfigError(flag, value, "a positive number") from None
    if not n > 0:
        raise ConfigError(flag, value, "a positive number")
    return max(MIN_LOOP_MS, round(n if ms_flag else n * 1000))


def _ids(value: str | None) -> set[int]:
    try:
        return {int(x) for x in (value or "").split(",") if x.strip()}
    except ValueError:
        raise ConfigError("--id", value, "comma-separated GPU indices") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``nvidia-smi``'s command line, the part dsv4lab's sampler and people use (``--query-gpu``, ``-lms``),
    answered from the running twins' state files."""
    args = list(sys.argv[1:] if argv is None else argv)
    fields: list[str] | None = None
    fmt: list[str] = ["csv"]
    listing = False
    loop_ms: int | None = None
    ids: set[int] | None = None
    takes_value = ("--query-gpu", "--format", "-q", "--id", "-i", "-l", "--loop", "-lms", "--loop-ms")
    try:
        i = 0
        while i < len(args):
            a = args[i]
            value: str | None = None
            if "=" in a:
                a, value = a.split("=", 1)
            elif a in takes_value and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value = args[i + 1]
                i += 1
            if a == "--query-gpu":
                fields = [f.strip() for f in (value or "").split(",") if f.strip()]
            elif a == "--format":
                fmt = [f.strip() for f in (value or "").split(",") if f.strip()]
            elif a in ("-L", "--list-gpus"):
                listing = True
            elif a in ("-l", "--loop", "-lms", "--loop-ms"):
                loop_ms = _loop_ms(a, value)
            elif a in ("-i", "--id"):
                ids = _ids(value)
            i += 1
        rows = read_gpus(reporting=False)  # for -L and the ids: no memory shown yet
    except ConfigError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    if listing:
        sys.stdout.write("".join(f"GPU {r.index}: {r.name} (UUID: GPU-dsv4lab-twin-{r.index:04d})\n" for r in rows))
        return 0
    for f in fields or ():
        if f not in _FIELDS:
            sys.stdout.write(f'Field "{f}" is not a valid field to query.\n\n')
            return 2
    if ids is not None:
        missing = sorted(ids - {r.index for r in rows})
        if missing:
            sys.stdout.write(f"No devices were found with index {missing[0]}\n")
            return 6

    started = time.time()

    def render(at: float | None = None) -> str:
        chosen = [r for r in read_gpus(at=at, since=started if loop_ms else None) if ids is None or r.index in ids]
        return _table(chosen) if fields is None else query(chosen, fields, fmt, now=at)

    if loop_ms is None:
        now = twin_now()
        sys.stdout.write(render(now[0] if now is not None else None))
        return 0
    return _loop(render, loop_ms / 1000, started)


#: How often (wall seconds) the loop looks whether the twin's clock has passed the next sample's moment.
_LOOK_S = 0.01


def _loop(render: Callable[[float], str], interval_s: float, started: float) -> int:
    """Print a sample at every moment of a fixed schedule on the twin's clock, flushing as they come, until
    killed. The schedule's step is ``interval_s`` of wall time: ``interval_s / pace`` modelled seconds on a
    paced twin, ``interval_s`` modelled seconds in virtual time (an idle twin's time follows the wall). With no
    twin (before it starts, after it is gone) time goes on at the wall's rate from the last reading."""
    tick: float | None = None
    last: tuple[float, float] | None = None  # (modelled, wall) of the last reading
    try:
        while True:
            wall = time.time()
            reading = twin_now(since=started)
            if reading is not None:
                now, pace = reading
            else:
                now, pace = (last[0] + (wall - last[1]) if last is not None else wall), None
            last = (now, wall)
            step = interval_s / pace if pace else interval_s
            tick = now if tick is None else tick
            try:
                while tick <= now:
                    sys.stdout.write(render(tick))
                    tick += step
            except ConfigError as exc:
                sys.stderr.write(f"{exc}\n")
                return 2
            sys.stdout.flush()
            time.sleep(min(_LOOK_S, interval_s))
    except (BrokenPipeError, KeyboardInterrupt):
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at interpreter exit
        return 0


def write_smi_shim(directory: str | Path, python: str | None = None) -> Path:
    """Write an executable ``nvidia-smi`` into ``directory`` that runs this stand-in; return its path.

    Put the directory first on a twin run's ``PATH``; nothing is installed globally.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "nvidia-smi"
    py = python or sys.executable
    path.write_text(
        "#!/bin/sh\n# nvidia-smi stand-in for the dsv4lab SGLang twin (answers from the twin's GPU state).\n"
        f'exec {shlex.quote(py)} -m dsv4lab.twin.smi "$@"\n',
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
