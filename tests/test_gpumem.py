"""The GPU memory sampler: one nvidia-smi loop per host over one channel, against the twin, locally and over
the real sshd: memory through the startup phases, the OOM spike, twins side by side, drops and errors."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest

from dsv4lab import plots
from dsv4lab.config.presets import config_b
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.hosts import Host, LocalHost, SSHHost
from dsv4lab.model.budget import oom_point, phases_from_log
from dsv4lab.model.memory import preflight
from dsv4lab.serving.gpumem import (
    COLUMNS,
    GpuSampler,
    GpuSamplerError,
    SmiCommand,
    read_samples_csv,
    sampler_for,
    smi_command_for,
    twin_interval_ms,
)
from dsv4lab.serving.launch import ServerHandle, launch
from dsv4lab.serving.watch import Verdict, wait_ready
from tests.sshd import SSHD, free_port

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

SCALE = 0.1  # a story startup takes about three seconds; phases last several samples at 50 ms


def _twin_env(tmp: Path, **extra: str) -> dict[str, str]:
    # Own state dir: other tests' twins on this machine must not show up in these samples.
    return {
        "DSV4LAB_TWIN_PACE": str(SCALE),
        "DSV4LAB_TWIN_STATE_DIR": str(tmp / "twin-state"),
        "SGLANG_LOG_MS": "1",
        **extra,
    }


def _stand_in(tmp: Path, *, port: int | None = None, pid: int | None = None) -> SmiCommand:
    return smi_command_for("twin", python=sys.executable, twin_env=_twin_env(tmp), port=port, pid=pid)


def _loops(tag: str, *, wrappers: bool = False) -> list[psutil.Process]:
    """Stand-in loop processes started with interval ``tag`` (a value no other test uses); with
    ``wrappers``, the stream's bash wrapper and its stdin watcher too."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if tag not in cmd or "dsv4lab.twin.smi" not in cmd:
            continue
        if wrappers or cmd[1:3] == ["-m", "dsv4lab.twin.smi"]:
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
    return found


def _wait_gone(tag: str, timeout_s: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while _loops(tag, wrappers=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _loops(tag, wrappers=True)


@pytest.fixture
def handles() -> Iterator[list[ServerHandle]]:
    started: list[ServerHandle] = []
    yield started
    for h in started:
        h.stop(grace_s=1.0)


def _sample_past_the_release(sampler: GpuSampler, log: Path, *, gpu: int, timeout_s: float = 20.0) -> None:
    """Keep sampling until a sample after the OOM shows ``gpu``'s memory back (the dead twin holds it a moment,
    as a driver does, and a busy machine can delay the stand-in's samples by a second or more)."""
    oom = oom_point(log, tz=sampler.host_tz)  # the watch saw the crash: the OOM is in the log already
    deadline = time.monotonic() + timeout_s
    while oom is not None and time.monotonic() < deadline:
        f = sampler.frame()
        f = f[f["gpu"] == gpu]
        if len(f) and f["time"].iloc[-1] > oom.time and f["used_mib"].iloc[-1] < 5 * 1024:
            return
        time.sleep(0.05)


def test_config_b_over_ssh_memory_rises_through_the_phases_and_the_spike_is_kept(
    sshd: SSHD, tmp_path: Path, handles: list[ServerHandle]
) -> None:
    host = sshd.connect()
    config = config_b().replace(port=free_port(), kernel_config_dir=None)
    command = _stand_in(tmp_path, port=config.port)
    csv_path = tmp_path / "gpu_memory.csv"
    sampler = GpuSampler(host, interval_ms=twin_interval_ms(SCALE), smi_command=command, csv_path=csv_path)
    with sampler:
        h = launch(
            host, config, str(tmp_path / "b"), target="twin", python=sys.executable, twin_env=_twin_env(tmp_path)
        )
        handles.append(h)
        r = wait_ready(h, 120, progress=False)
        _sample_past_the_release(sampler, Path(h.log_path), gpu=1)
    frame = sampler.frame()
    host.close()
    assert r.verdict is Verdict.CRASHED
    assert list(frame.columns)[: len(COLUMNS)] == list(COLUMNS)
    assert sorted(frame["gpu"].unique()) == list(range(8))
    assert frame["time"].dt.tz is not None
    assert frame.groupby("gpu")["t"].apply(lambda t: t.is_monotonic_increasing).all()

    log = Path(h.log_path)
    phases = {p.name: p for p in phases_from_log(log, tz=sampler.host_tz)}
    oom = oom_point(log, tz=sampler.host_tz)
    assert oom is not None and oom.gpu == 1 and oom.used_gib is not None
    gpu1 = frame[frame["gpu"] == 1].set_index("time")["used_mib"] / 1024

    def during(name: str) -> pd.Series:
        p = phases[name]
        part: pd.Series = gpu1[(gpu1.index >= p.start) & (gpu1.index <= p.end)]
        return part

    weights, kv, graphs = during("weights"), during("KV pool"), during("CUDA graph capture")
    assert len(weights) and len(graphs)
    # Weights arrive in shards, then the KV pool, then graph capture fills the card: memory only rises.
    assert weights.max() < 25 < graphs.max()
    assert weights.iloc[-1] > weights.iloc[0]
    if len(kv):
        assert kv.max() <= graphs.max()
    # The failing GPU's peak (what it held when the allocation failed) is in the frame...
    assert gpu1.max() >= oom.used_gib - 1.0
    # ...and the memory is released after the crash.
    assert gpu1.iloc[-1] < 5
    assert gpu1.idxmax() <= oom.time + pd.Timedelta(seconds=2)

    # The chart reads phases and the OOM from the log on the samples' clock, the static line from preflight.
    chart = plots.to_spec(
        plots.memory_timeline(frame, log=log, preflight=preflight(config, "rtx-pro-6000-x8"), config="Config B")
    )
    text = json.dumps(chart)
    assert oom.label() in text and "Config B: GPU 1 ran out of memory in CUDA graph capture" in text
    bands = [r for rows in chart["datasets"].values() for r in rows if "start_s" in r]
    assert [b["phase"] for b in bands][-2:] == ["CUDA graph capture", "crash"]
    assert all(float(frame["t"].min()) <= b["start_s"] <= float(frame["t"].max()) for b in bands)

    again = read_samples_csv(csv_path)
    assert list(again.columns) == list(COLUMNS)
    assert len(again) == len(frame)
    assert (again["used_mib"].to_numpy() == frame["used_mib"].to_numpy()).all()
    assert abs(float(again["t"].iloc[-1]) - float(frame["t"].iloc[-1])) < 0.01
    assert _wait_gone(str(twin_interval_ms(SCALE))) == []  # the remote loop ended with the sampler


def test_twins_side_by_side_each_sampler_sees_its_own(tmp_path: Path, handles: list[ServerHandle]) -> None:
    host = LocalHost()
    env = _twin_env(tmp_path, DSV4LAB_TWIN_HARDWARE="tiny")
    small = ServerConfig(model_path="dsv4lab/tiny-moe", tp=2, port=free_port(), mem_fraction_static=0.5)
    large = small.replace(port=free_port(), mem_fraction_static=0.85)
    for i, cfg in enumerate((small, large)):
        h = launch(host, cfg, str(tmp_path / f"t{i}"), target="twin", twin_env=env)
        handles.append(h)
    for h in handles:
        assert wait_ready(h, 120, progress=False).ready
    used = []
    for h in handles:
        with sampler_for(h, interval_ms=30) as s:
            assert s.smi_command.env["DSV4LAB_TWIN_SMI_PORT"] == str(h.port)
            time.sleep(0.3)
        f = s.frame()
        assert set(f["total_mib"]) == {24_576.0}  # the tiny profile, not the default host
        used.append(float(f["used_mib"].median()))
        assert (Path(h.run_dir) / "gpu_memory.csv").exists()
    assert used[1] > used[0] + 2048  # 0.85 holds a larger KV pool than 0.5


def test_missing_nvidia_smi_is_a_clear_error(any_host: Host) -> None:
    sampler = GpuSampler(any_host, smi_command=SmiCommand(("nvidia-smi-not-installed-here",)), start_timeout_s=15)
    with pytest.raises(GpuSamplerError, match="nvidia-smi is not available"):
        sampler.start()
    assert not sampler.running


def test_a_failing_nvidia_smi_is_an_error_not_an_empty_frame() -> None:
    # What nvidia-smi prints and does when the driver is gone (a real failure mode on GPU hosts).
    fail = (
        "import sys; "
        'sys.stdout.write("NVIDIA-SMI has failed because it couldn\'t communicate with the driver\\n"); '
        "sys.exit(9)"
    )
    sampler = GpuSampler(LocalHost(), smi_command=SmiCommand((sys.executable, "-c", fail)), start_timeout_s=15)
    with pytest.raises(GpuSamplerError, match="printed no samples and exited with status 9"):
        sampler.start()
    assert sampler.skipped_lines == 1


def test_a_dropped_connection_resumes_sampling_and_leaves_no_loop_behind(sshd: SSHD, tmp_path: Path) -> None:
    host: SSHHost = sshd.connect()
    interval = 41  # an interval no other test uses, to find this sampler's loop processes
    sampler = GpuSampler(host, interval_ms=interval, smi_command=_stand_in(tmp_path))
    with sampler:
        deadline = time.monotonic() + 10
        while len(sampler) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = len(sampler)
        first_loop = _loops(str(interval))
        assert len(first_loop) == 1
        sshd.drop_connections()
        deadline = time.monotonic() + 20
        while (sampler.reconnects == 0 or len(sampler) < before + 40) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sampler.reconnects >= 1
        assert len(sampler) >= before + 40, "sampling did not resume after the connection dropped"
        assert sampler.error is None
        # The loop of the dropped channel ended with it (its stdin closed); only the new one runs.
        time.sleep(0.5)
        assert first_loop[0] not in _loops(str(interval))
    frame = sampler.frame()
    assert (
        frame["t"].is_monotonic_increasing or frame.groupby("gpu")["t"].apply(lambda s: s.is_monotonic_increasing).all()
    )
    assert _wait_gone(str(interval)) == []
    host.close()


def test_stop_ends_the_loop_process_locally(tmp_path: Path) -> None:
    interval = 43
    sampler = GpuSampler(LocalHost(), interval_ms=interval, smi_command=_stand_in(tmp_path)).start()
    assert len(_loops(str(interval))) == 1
    frame = sampler.stop()
    assert len(frame) >= 8 and set(frame["gpu"]) == set(range(8))
    assert _wait_gone(str(interval)) == []
    assert not sampler.running


def test_smi_command_for_targets() -> None:
    real = smi_command_for("sglang")
    assert real.argv(500)[0] == "nvidia-smi" and real.argv(500)[-2:] == ["-lms", "500"]
    assert "--query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu" in real.argv(500)
    twin = smi_command_for("twin", python="/opt/py/bin/python", port=30000, twin_env={"DSV4LAB_TWIN_PACE": "1"})
    assert twin.executable == ("/opt/py/bin/python", "-m", "dsv4lab.twin.smi")
    assert twin.env == {"DSV4LAB_TWIN_SMI_PORT": "30000"}
    assert twin_interval_ms(0.05) == 25 and twin_interval_ms(1.0) == 500 and twin_interval_ms(0.001) == 20
