"""The twin's nvidia-smi stand-in: loop mode, the timestamp field, GPU selection, picking one twin among
several, and memory that stays in use for a moment after a twin exits (as a driver releases it)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4lab.hosts import LocalHost
from dsv4lab.twin.smi import (
    SELECT_PID_ENV,
    SELECT_PORT_ENV,
    UNSEEN_GRACE_S,
    query,
    read_gpus,
    release_state,
    write_gpu_state,
    write_main_state,
)

PY = sys.executable


def _env(state: Path, **extra: str) -> dict[str, str]:
    return {"DSV4LAB_TWIN_STATE_DIR": str(state), **extra}


def _dead_pid() -> int:
    proc = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(proc.stdout)


def _twin_state(state: Path, pid: int, port: int, used_mib: float) -> None:
    write_main_state(state, pid, "tiny", {0: 50.0, 1: 50.0}, [0, 1], port=port)
    for gpu in (0, 1):
        write_gpu_state(state, pid, gpu, used_mib + gpu)


def test_loop_mode_streams_timestamped_samples(tmp_path: Path) -> None:
    argv = [
        PY,
        "-m",
        "dsv4lab.twin.smi",
        "--query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu",
        "--format=csv,noheader,nounits",
        "-lms",
        "30",
    ]
    stream = LocalHost().stream(argv, env=_env(tmp_path, DSV4LAB_TWIN_HARDWARE="tiny"))
    lines: list[str] = []
    deadline = time.monotonic() + 15
    while len(lines) < 20 and time.monotonic() < deadline:
        lines += stream.poll(0.5)
    stream.close()
    assert len(lines) >= 20
    assert stream.exit_status is not None  # the loop ended with the stream
    rows = [line.split(", ") for line in lines]
    assert {r[1] for r in rows} == {"0", "1"} and {r[3] for r in rows} == {"24576"}
    stamps = [dt.datetime.strptime(r[0], "%Y/%m/%d %H:%M:%S.%f") for r in rows[::2]]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    assert all(g > 0 for g in gaps)
    assert 0.02 < sorted(gaps)[len(gaps) // 2] < 0.2  # about every 30 ms, on a fixed schedule
    assert stream.start is not None and abs(stream.start.epoch_s - time.time()) < 60


def test_one_twin_among_several_is_selected_by_port_or_pid(tmp_path: Path) -> None:
    me = os.getpid()
    other = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        _twin_state(tmp_path, me, 31001, 10_000)
        _twin_state(tmp_path, other.pid, 31002, 20_000)
        by_port = read_gpus(_env(tmp_path, **{SELECT_PORT_ENV: "31001"}))
        assert [r.memory_used_mib for r in by_port] == [10_000, 10_001]
        by_pid = read_gpus(_env(tmp_path, **{SELECT_PID_ENV: str(other.pid)}))
        assert [r.memory_used_mib for r in by_pid] == [20_000, 20_001]
        nobody = read_gpus(_env(tmp_path, DSV4LAB_TWIN_HARDWARE="tiny", **{SELECT_PORT_ENV: "39999"}))
        assert [r.memory_used_mib for r in nobody] == [1, 102]  # the tiny profile's idle GPUs
        assert all(r.utilization_pct == 0 for r in nobody)
    finally:
        other.kill()
        other.wait()


def test_a_bad_selector_is_refused(tmp_path: Path) -> None:
    out = subprocess.run(
        [PY, "-m", "dsv4lab.twin.smi", "--query-gpu=index", "--format=csv"],
        env={**os.environ, **_env(tmp_path, **{SELECT_PORT_ENV: "thirty"})},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "DSV4LAB_TWIN_SMI_PORT" in out.stderr


def test_memory_stays_in_use_until_released_then_the_files_go(tmp_path: Path) -> None:
    pid = _dead_pid()  # the twin has exited (SIGKILLed its own tree)
    _twin_state(tmp_path, pid, 31003, 90_000)
    release_state(tmp_path, pid, after_s=0.6)
    held = read_gpus(_env(tmp_path, **{SELECT_PORT_ENV: "31003"}))
    assert [r.memory_used_mib for r in held] == [90_000, 90_001]
    time.sleep(0.8)
    freed = read_gpus(_env(tmp_path, DSV4LAB_TWIN_HARDWARE="tiny", **{SELECT_PORT_ENV: "31003"}))
    assert [r.memory_used_mib for r in freed] == [1, 102]
    assert list(tmp_path.glob(f"twin-{pid}*")) == []


def test_a_hold_nobody_reported_is_reported_once_late_then_released(tmp_path: Path) -> None:
    # A stand-in loop starved past the (scaled) hold still sees the dead twin's memory once, then the release;
    # a look that shows no memory (-L, the ids check) does not count as seeing it.
    pid = _dead_pid()
    _twin_state(tmp_path, pid, 31005, 90_000)
    release_state(tmp_path, pid, after_s=0.05)
    time.sleep(0.2)
    env = _env(tmp_path, DSV4LAB_TWIN_HARDWARE="tiny", **{SELECT_PORT_ENV: "31005"})
    unseen = read_gpus(env, reporting=False)
    late = read_gpus(env)
    freed = read_gpus(env)
    assert [r.memory_used_mib for r in unseen] == [r.memory_used_mib for r in late] == [90_000, 90_001]
    assert [r.memory_used_mib for r in freed] == [1, 102]
    assert list(tmp_path.glob(f"twin-{pid}*")) == []


def test_an_unseen_hold_long_past_is_forgotten(tmp_path: Path) -> None:
    pid = _dead_pid()
    _twin_state(tmp_path, pid, 31006, 90_000)
    release_state(tmp_path, pid, after_s=0.0)
    main = tmp_path / f"twin-{pid}.json"
    data = json.loads(main.read_text())
    main.write_text(json.dumps({**data, "released_at": time.time() - UNSEEN_GRACE_S - 1}))
    rows = read_gpus(_env(tmp_path, DSV4LAB_TWIN_HARDWARE="tiny", **{SELECT_PORT_ENV: "31006"}))
    assert [r.memory_used_mib for r in rows] == [1, 102]
    assert list(tmp_path.glob(f"twin-{pid}*")) == []


def test_a_killed_twin_without_release_is_forgotten_at_once(tmp_path: Path) -> None:
    pid = _dead_pid()
    _twin_state(tmp_path, pid, 31004, 50_000)
    rows = read_gpus(_env(tmp_path, DSV4LAB_TWIN_HARDWARE="tiny"))
    assert [r.memory_used_mib for r in rows] == [1, 102]
    assert list(tmp_path.glob(f"twin-{pid}*")) == []


def test_gpu_ids_and_unknown_devices(tmp_path: Path) -> None:
    base = [PY, "-m", "dsv4lab.twin.smi", "--query-gpu=index,memory.total", "--format=csv,noheader"]
    env = {**os.environ, **_env(tmp_path)}
    one = subprocess.run([*base, "-i", "3"], env=env, capture_output=True, text=True, timeout=30, check=True)
    assert one.stdout == "3, 97887 MiB\n"
    missing = subprocess.run([*base, "--id=12"], env=env, capture_output=True, text=True, timeout=30)
    assert missing.returncode == 6 and "No devices were found" in missing.stdout


@pytest.mark.parametrize(("fmt", "expected"), [(["csv", "noheader", "nounits"], "2026/05/04 10:00:00.250, 0\n")])
def test_timestamp_field_format(fmt: list[str], expected: str) -> None:
    from dsv4lab.twin.smi import GpuRow

    when = dt.datetime(2026, 5, 4, 10, 0, 0, 250_000).timestamp()
    rows = [GpuRow(0, "x", 1, 2, 0)]
    assert query(rows, ["timestamp", "index"], fmt, now=when) == expected
