"""GPU memory over time: ``nvidia-smi`` in its own loop mode on the server's host, streamed into a DataFrame.

A memory story (weights arrive, the KV pool is carved out, each CUDA graph takes its share, one GPU runs
out) plays out in seconds to minutes; polling ``nvidia-smi`` with one SSH exec per sample costs a round trip
and a process start each time and misses the peaks between polls. :class:`GpuSampler` instead starts one
``nvidia-smi --query-gpu=... -lms N`` on the host and reads its output over one channel for as long as the
server lives. A dropped connection reconnects and resumes (the remote loop dies with its channel, a new one
starts); a host without ``nvidia-smi`` is an error at :meth:`GpuSampler.start`, not an empty chart later.

Times are the host's: nvidia-smi prints host-local timestamps, and SGLang's log does too, so the sampler
reads the host's UTC offset when the stream starts and every sample becomes a tz-aware instant that lines
up with :func:`dsv4lab.model.budget.phases_from_log` no matter where the notebook runs.

On the twin, ``smi_command_for("twin", ...)`` runs the stand-in (:mod:`dsv4lab.twin.smi`) instead and
selects the twin by its port, so two twins side by side (an A/B) each get their own GPUs.
"""

from __future__ import annotations

import calendar
import contextlib
import csv
import datetime as _dt
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from dsv4lab.engines import Engine, get_engine, twin_interval_ms
from dsv4lab.errors import ConfigError, HostConnectionError, HostError
from dsv4lab.hosts import Host, LineStream

__all__ = [
    "COLUMNS",
    "QUERY_FIELDS",
    "GpuSampler",
    "GpuSamplerError",
    "SmiCommand",
    "read_samples_csv",
    "sampler_for",
    "smi_command_for",
    "twin_interval_ms",
]

#: What each sample asks nvidia-smi for, in this order.
QUERY_FIELDS = ("timestamp", "index", "memory.used", "memory.total", "utilization.gpu")
#: Columns of :meth:`GpuSampler.frame` and of the CSV file.
COLUMNS = ("time", "t", "gpu", "used_mib", "total_mib", "util_pct")

#: How long :meth:`GpuSampler.start` waits for the first sample (a cold ``python -m`` over SSH takes ~1 s).
DEFAULT_START_TIMEOUT_S = 30.0
#: A stop returns within about this long: the reader polls this often for the stop flag.
_POLL_S = 0.1
_RECONNECT_FIRST_S = 0.25
_RECONNECT_MAX_S = 4.0


class GpuSamplerError(HostError):
    """Sampling could not start or stopped for good (no nvidia-smi, a bad query, no output).

    A dropped SSH connection is not one of these: the sampler reconnects and resumes.
    """


@dataclass(frozen=True)
class SmiCommand:
    """How to run nvidia-smi on a host: the executable words and the environment they need."""

    executable: tuple[str, ...] = ("nvidia-smi",)
    env: Mapping[str, str] = field(default_factory=dict)

    def in_slurm_job(self, job_id: str, slurm_conf: str | None = None) -> SmiCommand:
        """The same command run on a Slurm job's node, inside its allocation (``srun --jobid --overlap``: it
        sees the job's GPUs), once the job runs; it waits while the job is queued."""
        env = {**self.env, **({"SLURM_CONF": slurm_conf} if slurm_conf else {})}
        return SmiCommand(("bash", "-c", _IN_SLURM_JOB, "dsv4lab-smi", job_id, *self.executable), env)

    def argv(self, interval_ms: int, gpus: Sequence[int] | None = None) -> list[str]:
        words = [*self.executable, f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]
        if gpus:
            words.append(f"--id={','.join(str(g) for g in gpus)}")
        return [*words, "-lms", str(interval_ms)]


# Wait while the job is queued, then run the sampler as an overlapping step of the job on its first node.
_IN_SLURM_JOB = r"""
job=$1; shift
while st=$(squeue -h -j "$job" -o %T 2>/dev/null) && { [ "$st" = PENDING ] || [ "$st" = CONFIGURING ]; }; do
  sleep 0.5
done
[ "$st" = RUNNING ] || { echo "Slurm job $job is ${st:-gone}: no GPUs to sample" >&2; exit 3; }
exec srun --jobid="$job" --overlap --nodes=1 --ntasks=1 --quiet "$@"
"""


def smi_command_for(
    target: str | Engine = "sglang",
    *,
    python: str = "python3",
    port: int | None = None,
    pid: int | None = None,
    twin_env: Mapping[str, str] | None = None,
    run_dir: str | None = None,
) -> SmiCommand:
    """The engine's GPU-memory command: nvidia-smi on a real host, or the twin's stand-in run by ``python``
    (which must have dsv4lab).

    For the twin, ``port`` (its HTTP port) or ``pid`` (its main PID) picks which twin to report when several
    run on the machine; ``twin_env`` is the launch's twin environment (its state dir and hardware profile).
    """
    spec = get_engine(target).smi(python, port, twin_env, pid=pid, run_dir=run_dir)
    return SmiCommand(spec.executable, dict(spec.env))


# -- parsing ----------------------------------------------------------------------------------------------------


class _Clock:
    """nvidia-smi's host-local ``YYYY/MM/DD HH:MM:SS.mmm`` -> epoch seconds, with the date part cached."""

    def __init__(self, utc_offset_s: int) -> None:
        self.utc_offset_s = utc_offset_s
        self._days: dict[str, int] = {}

    def epoch(self, stamp: str) -> float | None:
        s = stamp.strip()
        if len(s) < 19 or s[4] not in "/-" or s[13] != ":":
            return None
        day = self._days.get(s[:10])
        try:
            if day is None:
                day = calendar.timegm((int(s[0:4]), int(s[5:7]), int(s[8:10]), 0, 0, 0, 0, 0, 0))
                self._days[s[:10]] = day
            return day + int(s[11:13]) * 3600 + int(s[14:16]) * 60 + float(s[17:]) - self.utc_offset_s
        except ValueError:
            return None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan  # "[N/A]", "[Not Supported]"


def _tz(utc_offset_s: int) -> _dt.timezone:
    return _dt.timezone(_dt.timedelta(seconds=utc_offset_s))


def _frame(rows: Sequence[tuple[float, int, float, float, float]], t0: float, utc_offset_s: int) -> pd.DataFrame:
    epoch = pd.Series([r[0] for r in rows], dtype=float).round(3)  # nvidia-smi stamps milliseconds
    times = pd.to_datetime((epoch * 1000).round().astype("int64"), unit="ms", utc=True).dt.tz_convert(_tz(utc_offset_s))
    frame = pd.DataFrame(
        {
            "time": times,
            "t": (epoch - t0).round(3),
            "gpu": pd.Series([r[1] for r in rows], dtype="int64"),
            "used_mib": pd.Series([r[2] for r in rows], dtype=float),
            "total_mib": pd.Series([r[3] for r in rows], dtype=float),
            "util_pct": pd.Series([r[4] for r in rows], dtype=float),
        },
        columns=list(COLUMNS),
    )
    frame.attrs.update(t0_epoch_s=t0, utc_offset_s=utc_offset_s)
    out: pd.DataFrame = frame
    return out


# -- the sampler --------------------------------------------------------------------------------------------------


class GpuSampler:
    """Samples every GPU of ``host`` every ``interval_ms`` while it runs; :meth:`frame` has the samples.

    Use it as a context manager around a launch and a benchmark, or call :meth:`start` / :meth:`stop`.
    ``csv_path`` (a local file) receives every sample as it arrives, so a report can be rebuilt from the
    run directory with :func:`read_samples_csv` even if the notebook died. ``smi_command`` defaults to
    ``nvidia-smi``; see :func:`smi_command_for` for the twin.

    ``frame()`` columns: ``time`` (tz-aware, the host's UTC offset), ``t`` (seconds since the sampler
    started, host clock), ``gpu``, ``used_mib``, ``total_mib``, ``util_pct`` (NaN where nvidia-smi says N/A).
    """

    def __init__(
        self,
        host: Host,
        *,
        interval_ms: int = 500,
        csv_path: str | Path | None = None,
        smi_command: SmiCommand | Sequence[str] | None = None,
        gpus: Sequence[int] | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        reconnect: bool = True,
    ) -> None:
        if int(interval_ms) < 5:
            raise ConfigError("interval_ms", interval_ms, "at least 5 ms")
        self.host = host
        self.interval_ms = int(interval_ms)
        self.csv_path = Path(csv_path) if csv_path is not None else None
        if smi_command is None:
            smi_command = SmiCommand()
        elif not isinstance(smi_command, SmiCommand):
            smi_command = SmiCommand(tuple(smi_command))
        self.smi_command = smi_command
        self.gpus = tuple(gpus) if gpus else None
        self.start_timeout_s = start_timeout_s
        self.reconnect = reconnect
        #: Times the connection dropped and sampling resumed.
        self.reconnects = 0
        #: Lines that were not samples (ignored).
        self.skipped_lines = 0
        #: Why sampling stopped on its own (None while fine).
        self.error: GpuSamplerError | None = None
        self._rows: list[tuple[float, int, float, float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0: float | None = None
        self._utc_offset_s = 0
        self._clock = _Clock(0)
        self._csv: TextIO | None = None
        self._csv_writer: Any = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def argv(self) -> list[str]:
        return self.smi_command.argv(self.interval_ms, self.gpus)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def host_tz(self) -> _dt.timezone:
        """The host's UTC offset as a tzinfo (pass it to :func:`dsv4lab.model.budget.phases_from_log`)."""
        return _tz(self._utc_offset_s)

    def start(self, *, wait_first: bool = True) -> GpuSampler:
        """Start sampling; returns once the first sample is in, raises :class:`GpuSamplerError` if none comes.
        ``wait_first=False`` returns at once (a queued Slurm job's GPUs are sampled only once it runs;
        ``error`` then says why none came)."""
        if self.running:
            return self
        self._stop.clear()
        self._first.clear()
        self.error = None
        if self.csv_path is not None and self._csv is None:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            self._csv = self.csv_path.open("w", newline="", encoding="utf-8")
            self._csv_writer = csv.writer(self._csv)
            self._csv_writer.writerow(COLUMNS)
        self._thread = threading.Thread(target=self._run, name=f"gpu-sampler-{self.host.name}", daemon=True)
        self._thread.start()
        if not wait_first:
            return self
        deadline = time.monotonic() + self.start_timeout_s
        while not self._first.wait(0.05):
            if self.error is not None or not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise self.error or GpuSamplerError(
                    f"no GPU sample from {self.host.name} within {self.start_timeout_s:.0f} s (`{' '.join(self.argv)}`)"
                )
        return self

    def wait_first(self, timeout_s: float | None = None) -> bool:
        """Wait (up to ``timeout_s``, default the start timeout) for the first sample of a sampler started with
        ``wait_first=False``; whether one came."""
        deadline = time.monotonic() + (self.start_timeout_s if timeout_s is None else timeout_s)
        while not self._first.wait(0.05):
            if self.error is not None or not self.running or time.monotonic() > deadline:
                return self._first.is_set()
        return True

    def stop(self, timeout_s: float = 1.5) -> pd.DataFrame:
        """Stop sampling (the remote loop process ends with its channel); returns :meth:`frame`."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        self._thread = None
        if self._csv is not None:
            with contextlib.suppress(OSError):
                self._csv.close()
            self._csv = None
        return self.frame()

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results ------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def frame(self) -> pd.DataFrame:
        """Every sample so far (callable while sampling runs)."""
        with self._lock:
            rows = list(self._rows)
        out = _frame(rows, self._t0 if self._t0 is not None else 0.0, self._utc_offset_s)
        out.attrs.update(host=self.host.name, interval_ms=self.interval_ms, reconnects=self.reconnects)
        return out

    def latest(self) -> pd.DataFrame:
        """The newest sample of each GPU."""
        f = self.frame()
        if f.empty:
            return f
        latest: pd.DataFrame = f.sort_values("t").groupby("gpu", as_index=False).tail(1).reset_index(drop=True)
        return latest

    # -- the reader thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        delay = _RECONNECT_FIRST_S
        while not self._stop.is_set():
            stream: LineStream | None = None
            try:
                stream = self.host.stream(self.argv, env=self.smi_command.env)
                self._read(stream)
                return  # stopped, or the command ended (self.error says why)
            except HostConnectionError as exc:
                if not self.reconnect or not self._first.is_set():
                    self.error = GpuSamplerError(f"GPU sampling on {self.host.name} lost its connection: {exc}")
                    return
                self.reconnects += 1
            finally:
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.close(timeout_s=0.5)
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, _RECONNECT_MAX_S)
            with contextlib.suppress(HostConnectionError):
                connect = getattr(self.host, "connect", None)
                if callable(connect) and not getattr(self.host, "connected", True):
                    connect()

    def _read(self, stream: LineStream) -> None:
        received = False
        while not self._stop.is_set():
            lines = stream.poll(_POLL_S)
            if stream.start is not None and self._t0 is None:
                self._t0 = stream.start.epoch_s
                self._utc_offset_s = stream.start.utc_offset_s
                self._clock = _Clock(stream.start.utc_offset_s)
            if lines:
                received = self._add(lines) or received
                continue
            status = stream.exit_status
            if status is not None:
                self.error = self._ended(status, stream.stderr_tail, received)
                return

    def _ended(self, status: int, stderr: str, received: bool) -> GpuSamplerError:
        command = " ".join(self.argv)
        if status == 127 or "not found" in stderr:
            return GpuSamplerError(
                f"nvidia-smi is not available on {self.host.name} (`{command}` exited {status}: "
                f"{stderr or 'no output'}); on the twin, sample with smi_command_for('twin', ...)"
            )
        what = "stopped" if received else "printed no samples and exited"
        detail = f": {stderr}" if stderr else ""
        return GpuSamplerError(f"`{command}` on {self.host.name} {what} with status {status}{detail}")

    def _add(self, lines: Sequence[str]) -> bool:
        rows: list[tuple[float, int, float, float, float]] = []
        now = time.time()
        for line in lines:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) < 5 or not cells[1].isdigit():
                self.skipped_lines += 1
                continue
            epoch = self._clock.epoch(cells[0])
            rows.append(
                (
                    now if epoch is None else epoch,
                    int(cells[1]),
                    _number(cells[2]),
                    _number(cells[3]),
                    _number(cells[4]),
                )
            )
        if not rows:
            return False
        if self._t0 is None:
            self._t0 = rows[0][0]
        with self._lock:
            self._rows.extend(rows)
        if self._csv_writer is not None and self._csv is not None:
            tz = _tz(self._utc_offset_s)
            t0 = self._t0
            with contextlib.suppress(OSError, ValueError):
                for r in rows:
                    stamp = _dt.datetime.fromtimestamp(r[0], tz).isoformat(timespec="milliseconds")
                    self._csv_writer.writerow((stamp, f"{r[0] - t0:.3f}", r[1], r[2], r[3], r[4]))
                self._csv.flush()
        self._first.set()
        return True


def read_samples_csv(path: str | Path) -> pd.DataFrame:
    """A sampler's CSV file back as the frame :meth:`GpuSampler.frame` returned."""
    raw = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise GpuSamplerError(f"{path} is not a GPU sample file (missing columns {', '.join(missing)})")
    times = pd.to_datetime(raw["time"], format="ISO8601")
    offset = 0
    if len(times) and times.dt.tz is not None:
        delta = times.iloc[0].utcoffset()
        offset = int(delta.total_seconds()) if delta is not None else 0
    else:
        times = times.dt.tz_localize("UTC")
    epoch = (times.dt.tz_convert("UTC") - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    t0 = float(epoch.iloc[0] - raw["t"].iloc[0]) if len(raw) else 0.0
    rows = list(
        zip(
            epoch.tolist(),
            raw["gpu"].astype(int).tolist(),
            raw["used_mib"].astype(float).tolist(),
            raw["total_mib"].astype(float).tolist(),
            raw["util_pct"].astype(float).tolist(),
            strict=True,
        )
    )
    return _frame(rows, t0, offset)


def sampler_for(
    handle: Any,
    *,
    interval_ms: int | None = None,
    csv_path: str | Path | None = None,
    **options: Any,
) -> GpuSampler:
    """A sampler for a launched server (:class:`dsv4lab.serving.launch.ServerHandle`), not yet started.

    Twin servers get the stand-in, selected by the server's port, sampled at :func:`twin_interval_ms` of
    its time scale unless ``interval_ms`` says otherwise. ``csv_path`` defaults to ``gpu_memory.csv`` in
    the run directory when the host is this machine (over SSH the run directory is remote: pass a path).
    """
    from dsv4lab.hosts import LocalHost

    extra = getattr(handle, "extra", {}) or {}
    settings = dict(extra.get("twin_env") or {})
    engine = get_engine(getattr(handle, "target", "sglang"))
    python = str(extra.get("python") or "python3")
    command = smi_command_for(engine, python=python, port=handle.port, twin_env=settings, run_dir=handle.run_dir)
    if interval_ms is None:
        interval_ms = engine.sample_interval_ms(settings)
    if csv_path is None and isinstance(handle.host, LocalHost):
        csv_path = Path(handle.run_dir) / "gpu_memory.csv"
    return GpuSampler(handle.host, interval_ms=interval_ms or 500, csv_path=csv_path, smi_command=command, **options)
