"""Each rehearsable fault (``DSV4LAB_TWIN_FAULT``) looks from outside the way the real failure does."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.test_twin_support import check_log, descendants, free_port, running_twin, twin_env, wait_for, wait_healthy

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

TINY = ["--model-path", "dsv4lab/tiny-moe", "--tp-size", "2"]
EXIT_TIMEOUT_S = 30.0


def _start(tmp: Path, fault: str, port: int) -> tuple[list[str], dict[str, str], Path]:
    return [*TINY, "--port", str(port)], twin_env(tmp, DSV4LAB_TWIN_FAULT=fault), tmp / "server.log"


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def test_silent_death(tmp_path: Path) -> None:
    argv, env, log = _start(tmp_path, "silent_death", free_port())
    with running_twin(argv, env, log) as proc:
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == -9
        text = log.read_text()
    assert "Load weight begin" in text
    for word in ("Traceback", "exception", "kill_process_tree", "Error"):
        assert word not in text
    assert check_log(text) == []


def test_capture_hang(tmp_path: Path) -> None:
    port = free_port()
    argv, env, log = _start(tmp_path, "capture_hang", port)
    with running_twin(argv, env, log) as proc:
        # Both ranks reach the capture (one may lag the other on a loaded machine), then nothing more.
        wait_for(lambda: log.read_text().count("CUDA graph begin") >= 2, EXIT_TIMEOUT_S, "capture to begin")
        sizes = [log.stat().st_size]

        def settled() -> bool:
            time.sleep(0.5)
            sizes.append(log.stat().st_size)
            return sizes[-1] == sizes[-2]

        wait_for(settled, EXIT_TIMEOUT_S, "the log to stop growing")
        size = log.stat().st_size
        time.sleep(1.0)
        assert proc.poll() is None and len(descendants(proc.pid)) == 3  # detokenizer + 2 ranks, all alive
        assert log.stat().st_size == size  # no progress
        assert _refused(port)  # the port never listens before the schedulers are ready
        assert "max_total_num_tokens" not in log.read_text()


def test_nccl_error(tmp_path: Path) -> None:
    argv, env, log = _start(tmp_path, "nccl_error", free_port())
    with running_twin(argv, env, log) as proc:
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == -9
        text = log.read_text()
    assert re.search(r" TP1\] Scheduler hit an exception: Traceback", text)
    assert "NCCL error in:" in text and "unhandled system error" in text
    assert "kill_process_tree called:" in text
    assert check_log(text) == []


def test_port_in_use(tmp_path: Path) -> None:
    port = free_port()
    argv, env, log = _start(tmp_path, "port_in_use", port)
    with running_twin(argv, env, log) as proc:
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == 1
        text = log.read_text()
    assert f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port})" in text
    assert "include_parent=False" in text and "ready to roll" not in text


def test_real_busy_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        log = tmp_path / "server.log"
        with running_twin([*TINY, "--port", str(port)], twin_env(tmp_path), log) as proc:
            assert proc.wait(timeout=EXIT_TIMEOUT_S) == 1
    assert "error while attempting to bind on address" in log.read_text()


def test_crash_while_serving(tmp_path: Path) -> None:
    port = free_port()
    argv, env, log = _start(tmp_path, "crash_serving:20", port)
    with running_twin(argv, env, log) as proc:
        wait_healthy(port, proc)
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == -9
        text = log.read_text()
    assert text.index("ready to roll") < text.index("Scheduler hit an exception")
    assert "SIGQUIT received. signum=3, frame=None. It usually means one child failed." in text
    assert "illegal memory access" in text
    assert check_log(text) == []


def test_slow_start(tmp_path: Path) -> None:
    port = free_port()
    argv, env, log = _start(tmp_path, "slow_start:5", port)
    with running_twin(argv, env, log) as proc:
        wait_healthy(port, proc)
        text = log.read_text()
    elapsed = [float(x) for x in re.findall(r"Init parallel ends\. elapsed=([\d.]+) s", text)]
    assert elapsed and min(elapsed) >= 5 * 2.0 * 0.02 * 0.9


def test_unknown_fault_is_refused(tmp_path: Path) -> None:
    argv, env, log = _start(tmp_path, "meteor_strike", free_port())
    with running_twin(argv, env, log) as proc:
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == 2
    assert "DSV4LAB_TWIN_FAULT" in log.read_text()


@pytest.mark.parametrize("fault", ["silent_death", "nccl_error"])
def test_no_orphans(tmp_path: Path, fault: str) -> None:
    argv, env, log = _start(tmp_path, fault, free_port())
    with running_twin(argv, env, log) as proc:
        pid = proc.pid
        kids = []
        wait_for(lambda: len(descendants(pid)) == 3 or proc.poll() is not None, EXIT_TIMEOUT_S, "children")
        kids = [p.pid for p in descendants(pid)]
        proc.wait(timeout=EXIT_TIMEOUT_S)
    import psutil

    wait_for(
        lambda: not any(psutil.pid_exists(k) and psutil.Process(k).status() != "zombie" for k in kids),
        10,
        "children to die with the parent",
    )
    assert subprocess.run(["true"], check=True).returncode == 0


def test_a_starved_rank_holds_the_others_at_the_collectives(tmp_path: Path) -> None:
    # On a loaded machine one rank's process can stall for a second. SGLang's ranks meet in the all-reduce
    # that sizes the KV pool, so no GPU fills its pool before rank 0 has logged its weights; the memory
    # a GPU shows then lines up with the phases rank 0's log draws.
    port = free_port()
    argv = [*TINY, "--port", str(port)]
    env = twin_env(tmp_path, SGLANG_LOG_MS="1")
    log = tmp_path / "server.log"
    with running_twin(argv, env, log) as proc:
        wait_for(lambda: len(descendants(proc.pid)) >= 3, EXIT_TIMEOUT_S, "the detokenizer and both ranks")
        rank0 = sorted(p.pid for p in descendants(proc.pid))[1]  # forked after the detokenizer, before rank 1
        os.kill(rank0, signal.SIGSTOP)
        try:
            wait_for(lambda: "TP1] Load weight end" in log.read_text(), EXIT_TIMEOUT_S, "rank 1's weights")
            time.sleep(1.0)
            assert "TP1] KV Cache" not in log.read_text()  # rank 1 waits for rank 0
        finally:
            os.kill(rank0, signal.SIGCONT)
        wait_healthy(port, proc)
        text = log.read_text()
    assert check_log(text) == []

    def stamp(marker: str) -> datetime:
        line = next(line for line in text.splitlines() if marker in line)
        return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S.%f")

    assert stamp("TP1] KV Cache") >= stamp("TP0] Load weight end") >= stamp("TP1] Load weight end")
