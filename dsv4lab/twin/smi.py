"""An ``nvidia-smi`` stand-in that answers from a running twin's GPU state.

Memory-sampling code calls ``nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu
--format=csv,noheader,nounits``; against the twin it should work unchanged. The twin's processes leave
small JSON files in a per-user state directory (main process: hardware and utilisation; each scheduler
rank: its GPU's used memory); this module reads them. With no twin running it reports the idle GPUs of the
chosen hardware profile. :func:`write_smi_shim` puts an executable ``nvidia-smi`` into a directory meant
for a twin run's ``PATH`` — never anywhere global.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsv4lab.errors import ConfigError
from dsv4lab.hardware import HardwareProfile, hardware_profile
from dsv4lab.twin.settings import DEFAULT_HARDWARE, default_state_dir

__all__ = ["GpuRow", "main", "read_gpus", "write_gpu_state", "write_main_state", "write_smi_shim"]


def _atomic_write(path: Path, data: Mapping[str, object]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # the GPU view is best effort; serving must not fail because /tmp is full


def write_main_state(
    state_dir: Path, main_pid: int, hardware: str, utilization: Mapping[int, float], gpus: Sequence[int]
) -> None:
    _atomic_write(
        state_dir / f"twin-{main_pid}.json",
        {
            "pid": main_pid,
            "hardware": hardware,
            "updated": time.time(),
            "gpus": list(gpus),
            "utilization": {str(k): v for k, v in utilization.items()},
        },
    )


def write_gpu_state(state_dir: Path, main_pid: int, gpu: int, used_mib: float) -> None:
    _atomic_write(state_dir / f"twin-{main_pid}.gpu{gpu}.json", {"used_mib": used_mib, "updated": time.time()})


def remove_state(state_dir: Path, main_pid: int) -> None:
    for p in state_dir.glob(f"twin-{main_pid}*.json"):
        with contextlib.suppress(OSError):
            p.unlink()


@dataclass(frozen=True)
class GpuRow:
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


def _running_twin(state_dir: Path) -> dict[str, object] | None:
    best: tuple[float, dict[str, object]] | None = None
    for p in state_dir.glob("twin-*.json"):
        if ".gpu" in p.name:
            continue
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            pid = int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(pid):
            # A SIGKILLed twin cannot clean up after itself; its files would pile up and, once its PID
            # is reused, could pass for a live twin.
            for stale in (p, *state_dir.glob(f"twin-{pid}.gpu*.json")):
                with contextlib.suppress(OSError):
                    stale.unlink()
            continue
        mtime = p.stat().st_mtime
        if best is None or mtime > best[0]:
            best = (mtime, data)
    return best[1] if best else None


def _idle_used_mib(hw: HardwareProfile, i: int) -> int:
    return max(1, round(hw.other_used_gib[i] * 1024)) if i < len(hw.other_used_gib) else 1


def read_gpus(env: Mapping[str, str] | None = None) -> list[GpuRow]:
    """Every GPU of the host: from the running twin if there is one, else idle GPUs of the profile."""
    env = os.environ if env is None else env
    state_dir = default_state_dir(env)
    twin = _running_twin(state_dir)
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
                used = round(float(json.loads(f.read_text(encoding="utf-8"))["used_mib"]))
        rows.append(GpuRow(i, hw.gpu.name, used, hw.gpu.total_mib, round(float(util.get(str(i), 0.0)))))
    return rows


_FIELDS = {
    "index": ("index", ""),
    "name": ("name", ""),
    "gpu_name": ("name", ""),
    "memory.used": ("memory.used", "MiB"),
    "memory.total": ("memory.total", "MiB"),
    "memory.free": ("memory.free", "MiB"),
    "utilization.gpu": ("utilization.gpu", "%"),
}


def _value(row: GpuRow, name: str) -> str:
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


def query(rows: Sequence[GpuRow], fields: Sequence[str], fmt: Sequence[str]) -> str:
    """The CSV nvidia-smi prints for ``--query-gpu`` with ``--format=csv[,noheader][,nounits]``."""
    lines = []
    units = "nounits" not in fmt
    if "noheader" not in fmt:
        lines.append(", ".join(f + (f" [{_FIELDS[f][1]}]" if _FIELDS[f][1] else "") for f in fields))
    for row in rows:
        cells = []
        for f in fields:
            v = _value(row, f)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    fields: list[str] | None = None
    fmt: list[str] = ["csv"]
    listing = False
    i = 0
    while i < len(args):
        a = args[i]
        value: str | None = None
        if "=" in a:
            a, value = a.split("=", 1)
        elif a in ("--query-gpu", "--format", "-q", "--id", "-i") and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        if a == "--query-gpu":
            fields = [f.strip() for f in (value or "").split(",") if f.strip()]
        elif a == "--format":
            fmt = [f.strip() for f in (value or "").split(",") if f.strip()]
        elif a in ("-L", "--list-gpus"):
            listing = True
        i += 1
    try:
        rows = read_gpus()
    except ConfigError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    if listing:
        sys.stdout.write("".join(f"GPU {r.index}: {r.name} (UUID: GPU-dsv4lab-twin-{r.index:04d})\n" for r in rows))
        return 0
    if fields is None:
        sys.stdout.write(_table(rows))
        return 0
    for f in fields:
        if f not in _FIELDS:
            sys.stdout.write(f'Field "{f}" is not a valid field to query.\n\n')
            return 2
    sys.stdout.write(query(rows, fields, fmt))
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
