"""The GPU memory sampler over real loopback SSH: samples per second it sustains, the CPU it costs, and how
long a stop takes — next to the obvious alternative, one SSH exec of nvidia-smi per sample.

Not a timed test: run by hand, figures go in docs/measured.md. Both modes run the twin's nvidia-smi stand-in
(``python -m dsv4lab.twin.smi``) through a real sshd on 127.0.0.1, reading the state files a running
8-GPU twin would leave, so the per-sample work on the "host" is the same; only the transport differs:

* stream: :class:`dsv4lab.serving.gpumem.GpuSampler`, one ``-lms N`` loop on one channel, at several intervals;
* exec:   ``host.run(nvidia-smi --query-gpu=...)`` in a loop, as fast as it goes (one channel, one process
  start and one Python start per sample).

CPU is counted per side, so that other work on this shared machine does not leak in: the client is this
process (``time.process_time``: the sampler thread, paramiko); the host side is the sshd server's whole
process tree (per-connection sshd, the wrapper, the stand-in), living processes' own time plus what exited
children left in their parents' accounts. Reported as cores busy while sampling and CPU ms per sample. The
stand-in is a Python process: a real ``nvidia-smi`` costs its own, different, amount per sample on the host
(NVML queries), which this does not measure.

    .venv/bin/python benchmarks/gpumem_sampler.py --seconds 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsv4lab.hosts import SSHHost  # noqa: E402
from dsv4lab.serving.gpumem import QUERY_FIELDS, GpuSampler, smi_command_for  # noqa: E402
from dsv4lab.twin.smi import write_gpu_state, write_main_state  # noqa: E402
from tests.sshd import start_sshd  # noqa: E402

GPUS = 8


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a process tree: each living process's own time and its reaped children's."""
    total = 0.0
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class Meter:
    """Client and host CPU seconds since the last reading."""

    def __init__(self, sshd_pid: int) -> None:
        self.sshd_pid = sshd_pid
        self.client, self.host = time.process_time(), tree_cpu_s(sshd_pid)

    def read(self) -> tuple[float, float]:
        client, host = time.process_time(), tree_cpu_s(self.sshd_pid)
        out = (client - self.client, host - self.host)
        self.client, self.host = client, host
        return out


def fake_twin(state: Path) -> None:
    """The files a running 8-GPU twin leaves (this process stands for its main PID, so they stay valid)."""
    write_main_state(state, os.getpid(), "rtx-pro-6000-x8", dict.fromkeys(range(GPUS), 40.0), list(range(GPUS)), port=1)
    for gpu in range(GPUS):
        write_gpu_state(state, os.getpid(), gpu, 88_000.0 + gpu)


def stream_mode(
    host: SSHHost, sshd_pid: int, env: dict[str, str], interval_ms: int, seconds: float
) -> dict[str, float]:
    command = smi_command_for("twin", python=sys.executable, twin_env=env)
    sampler = GpuSampler(host, interval_ms=interval_ms, smi_command=command)
    sampler.start()
    time.sleep(1.0)  # past the stand-in's start
    meter = Meter(sshd_pid)
    n0, t0 = len(sampler), time.monotonic()
    time.sleep(seconds)
    n1, t1 = len(sampler), time.monotonic()
    client, remote = meter.read()
    s0 = time.monotonic()
    sampler.stop()
    stop_s = time.monotonic() - s0
    ticks = (n1 - n0) / GPUS
    wall = t1 - t0
    return {
        "samples_per_s": ticks / wall,
        "rows_per_s": (n1 - n0) / wall,
        "asked_per_s": 1000 / interval_ms,
        "client_cores": client / wall,
        "host_cores": remote / wall,
        "cpu_ms_per_sample": 1000 * (client + remote) / max(ticks, 1),
        "stop_s": stop_s,
    }


def exec_mode(host: SSHHost, sshd_pid: int, env: dict[str, str], seconds: float) -> dict[str, float]:
    words = [
        "env",
        *(f"{k}={v}" for k, v in env.items()),
        sys.executable,
        "-m",
        "dsv4lab.twin.smi",
        f"--query-gpu={','.join(QUERY_FIELDS)}",
        "--format=csv,noheader,nounits",
    ]
    host.run(words, timeout_s=30).check()
    meter = Meter(sshd_pid)
    n, t0 = 0, time.monotonic()
    latencies = []
    while time.monotonic() - t0 < seconds:
        s = time.monotonic()
        out = host.run(words, timeout_s=30).check()
        latencies.append(time.monotonic() - s)
        n += len(out.stdout.splitlines()) == GPUS
    wall = time.monotonic() - t0
    client, remote = meter.read()
    return {
        "samples_per_s": n / wall,
        "client_cores": client / wall,
        "host_cores": remote / wall,
        "cpu_ms_per_sample": 1000 * (client + remote) / max(n, 1),
        "latency_ms": 1000 * statistics.median(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring time per mode")
    parser.add_argument("--intervals", default="500,100,20,10,5", help="stream intervals to try (ms)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dsv4lab-bench-smi-") as tmp:
        state = Path(tmp) / "state"
        fake_twin(state)
        env = {"DSV4LAB_TWIN_STATE_DIR": str(state)}
        gen = start_sshd(Path(tmp) / "sshd")
        sshd = next(gen)
        host = sshd.connect()
        try:
            pid = sshd.proc.pid
            print(f"{psutil.cpu_count()} cores; {GPUS} GPUs per sample; {args.seconds:g} s per mode")
            print("\nstream (one nvidia-smi -lms loop over one SSH channel):")
            head = f"{'interval':>9} {'asked/s':>8} {'got/s':>8} {'rows/s':>8} {'client':>7} {'host':>7}"
            print(head + f" {'CPU ms/sample':>14} {'stop s':>7}")
            stream_rows = {}
            for interval in (int(x) for x in args.intervals.split(",")):
                r = stream_mode(host, pid, env, interval, args.seconds)
                stream_rows[interval] = r
                print(
                    f"{interval:>7}ms {r['asked_per_s']:>8.1f} {r['samples_per_s']:>8.1f} {r['rows_per_s']:>8.0f} "
                    f"{r['client_cores']:>7.3f} {r['host_cores']:>7.3f} {r['cpu_ms_per_sample']:>14.2f} "
                    f"{r['stop_s']:>7.3f}"
                )
            print("\nexec (one SSH exec of nvidia-smi per sample, back to back):")
            e = exec_mode(host, pid, env, args.seconds)
            print(
                f"  {e['samples_per_s']:.1f} samples/s, client {e['client_cores']:.3f} + host "
                f"{e['host_cores']:.3f} cores, {e['cpu_ms_per_sample']:.1f} CPU ms/sample, median round trip "
                f"{e['latency_ms']:.0f} ms"
            )
            fastest = max(stream_rows.values(), key=lambda r: r["samples_per_s"])
            at_2hz = stream_rows.get(500)
            speed = fastest["samples_per_s"] / e["samples_per_s"]
            thrift = e["cpu_ms_per_sample"] / fastest["cpu_ms_per_sample"]
            print(
                f"\nstream sustains {fastest['samples_per_s']:.0f} samples/s = {speed:.1f}x exec's best; "
                f"CPU per sample {thrift:.0f}x less"
            )
            if at_2hz:
                print(
                    f"at 2 Hz the stream costs {at_2hz['client_cores'] * 100:.2f}% of a core on the client and "
                    f"{at_2hz['host_cores'] * 100:.2f}% on the host"
                )
        finally:
            host.close()
            for _ in gen:
                pass


if __name__ == "__main__":
    main()
