"""Fault matrix, the server side: a server that dies while starting (each twin fault), mid-benchmark or
mid-profile, one that hangs, and a port that is already taken. Each test checks what the user is shown
and what is kept in the run dir, and that nothing is left running (psutil)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4lab import Lab
from dsv4lab.cli.main import main
from dsv4lab.errors import ProfileError, StaleServerError
from tests.test_faults_support import (
    SCALE,
    alive,
    kill_tree_now,
    no_processes_left,
    tiny_config,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with Lab(run_root=tmp_path / "runs", hardware="tiny", pace=SCALE, progress=False) as session:
        yield session


def _readiness_file(folder: Path) -> dict[str, object]:
    data = json.loads((folder / "readiness.json").read_text())
    assert isinstance(data, dict)
    return data


#: Each twin fault at startup: the verdict, and words its reason must hold.
STARTUP_FAULTS = {
    "silent_death": ("CRASHED", "logged no error"),
    "nccl_error": ("CRASHED", "NCCL"),
    "port_in_use": ("CRASHED", "exited with status 1"),
    "capture_hang": ("STALLED", "wrote nothing"),
}


def test_a_server_that_fails_to_start_gets_its_verdict_and_leaves_its_evidence(lab: Lab) -> None:
    # All four at once (each on its own port and run dir), then each watched to its verdict.
    servers = {
        f: lab.launch(tiny_config(), name=f.replace("_", "-"), fault=f, sample_gpus=False) for f in STARTUP_FAULTS
    }
    for fault, s in servers.items():
        verdict, words = STARTUP_FAULTS[fault]
        s.wait(timeout_s=60, stall_after_s=2)
        # Seen: the verdict and why, in the server's card.
        assert s.state == verdict, (fault, s.readiness)
        r = s.readiness
        assert r is not None and words in r.reason, (fault, r)
        assert verdict in s._repr_html_()
        # Kept: the verdict on disk, the log it was read from, the record a runner needs to find the server.
        kept = {p.name for p in s.local_dir.iterdir()}
        assert {"readiness.json", "server.log", "server.json", "launch.sh", "config.toml"} <= kept, fault
        assert _readiness_file(s.local_dir)["verdict"] == verdict
        if verdict == "CRASHED":
            assert (s.local_dir / "server.exit").read_text().strip() in ("1", "137")
            no_processes_left(s.local_dir)
        else:  # a hung server stays up for inspection (py-spy, the log); the session stops it at its end
            assert r.last_phase == "graph_capture" and s.is_alive()
    lab.close()
    no_processes_left(lab.run_root)


def test_a_server_killed_mid_benchmark_is_crashed_now_not_ready_from_old_lines(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    s = lab.launch(tiny_config(), name="victim", sample_gpus=False).wait(timeout_s=60)
    assert s.state == "READY"
    log = s.local_dir / "server.log"

    def kill_when_decoding() -> None:
        wait_for(lambda: "Decode batch" in log.read_text(), "the benchmark reaching the server", 60)
        time.sleep(0.3)
        server_pid = s.handle.server_pid()
        assert server_pid is not None
        kill_tree_now(server_pid)  # SIGKILL from outside (the OOM killer): the server logs nothing

    killer = threading.Thread(target=kill_when_decoding)
    killer.start()
    started = time.monotonic()
    runs = s.bench(concurrency=[2], prompts=20, input_len=64, output_len=2000)
    killer.join()
    # Seen: a partial run, stopped within seconds, that says the server went away and how it ended.
    assert time.monotonic() - started < 30
    run = runs[-1]
    assert run.partial and not run.interrupted
    assert "accept connections" in str(run.abort_reason) or "refuses" in str(run.abort_reason)
    assert s.state == "CRASHED" and s.readiness is not None and s.readiness.exit_status == 137
    assert "SIGKILL" in s.readiness.reason
    # Kept: the partial run (in memory and in the store), the verdict on disk.
    assert s.runs[-1] is run and run.summary.completed + run.summary.incomplete >= 1
    stored = (s.local_dir / "bench" / "bench_results.jsonl").read_text().splitlines()
    assert len(stored) == 1 and json.loads(stored[0])["partial"] is True
    assert _readiness_file(s.local_dir)["verdict"] == "CRASHED"
    no_processes_left(s.local_dir)
    # Re-attaching (another terminal, a restarted kernel) reports the server now: gone, not READY.
    capsys.readouterr()
    assert main(["watch", str(s.local_dir), "--json", "--timeout", "20"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verdict"] == "CRASHED" and verdict["exit_status"] == 137
    assert main(["ps", "--root", str(s.local_dir.parent)]) == 0
    assert "exited 137" in capsys.readouterr().out


def test_a_server_that_crashes_while_profiled_says_so_and_keeps_the_load_run(lab: Lab) -> None:
    # crash_serving: scheduler rank 0 dies (a CUDA error, SGLang's SIGQUIT chain) 100 x 0.02 s after ready, in
    # the middle of a ~7 s load run.
    s = lab.launch(tiny_config(), name="profiled", fault="crash_serving:100", sample_gpus=False).wait(timeout_s=60)
    assert s.state == "READY"
    with pytest.raises(ProfileError) as err:
        s.profile(concurrency=2, prompts=80, input_len=64, output_len=2000)
    # Seen: that the server died and why (not "connection refused" on /stop_profile).
    message = str(err.value)
    assert "profiled died during profiling: CRASHED" in message and "CUDA error" in message
    assert s.state == "CRASHED"
    # Kept: the load run that ran under the profiler (partial), the verdict, the log.
    assert len(s.runs) == 1 and s.runs[0].partial
    assert (s.local_dir / "bench" / "bench_results.jsonl").is_file()
    assert _readiness_file(s.local_dir)["verdict"] == "CRASHED"
    assert "illegal memory access" in (s.local_dir / "server.log").read_text()
    no_processes_left(s.local_dir)


def test_a_port_taken_by_something_else_is_refused_or_skipped(lab: Lab) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            # A port below the ephemeral range (so the next one is not some client's local port meanwhile).
            "import random, socket, time\n"
            "s = socket.socket()\n"
            "while True:\n"
            "    try:\n"
            "        s.bind(('127.0.0.1', random.randrange(20000, 30000, 10))); break\n"
            "    except OSError:\n"
            "        pass\n"
            "s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        # An explicit port: refused before anything starts, naming the port and who holds it.
        with pytest.raises(StaleServerError) as err:
            lab.launch(tiny_config(), name="explicit", port=port)
        assert f"port {port}" in str(err.value) and str(holder.pid) in str(err.value)
        assert lab.servers == [] and not (lab.run_root / "explicit").exists()
        assert alive(holder.pid)  # the other program is left alone
        # A port picked by the session: the taken one is skipped.
        lab.base_port = port
        s = lab.launch(tiny_config(), name="picked", sample_gpus=False).wait(timeout_s=60)
        assert s.state == "READY" and s.port != port
        with socket.create_connection(("127.0.0.1", s.port), timeout=5):
            pass
    finally:
        holder.kill()
        holder.wait(timeout=10)
    lab.close()
    no_processes_left(lab.run_root / "picked")
