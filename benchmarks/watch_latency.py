"""How fast the watcher notices, over real loopback SSH — next to what the story's poll loop would do.

Not a timed test: run by hand, figures go in docs/measured.md. For each of N runs it launches the twin through
a real sshd on 127.0.0.1 and measures, against a local observer that polls the run directory every
millisecond (the ground truth):

(a) crash: the moment the server's exit-status file appears -> the CRASHED verdict (Config B on the RTX
    PRO 6000 profile: the story's OOM in graph capture);
(b) ready: the moment the ready line lands in the log -> the READY verdict (Config A).

The story's loop read the last log line every 25 s for at most 16 rounds: a crash whose last line is
``kill_process_tree ...`` matches none of its patterns, so it waits the full 400 s; a ready line is seen
at the next poll, 12.5 s later on average (and only if no later line has buried it).

    .venv/bin/python benchmarks/watch_latency.py --runs 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsv4lab.config.presets import config_a, config_b  # noqa: E402
from dsv4lab.hosts import SSHHost  # noqa: E402
from dsv4lab.rundir import RunLayout  # noqa: E402
from dsv4lab.serving.launch import launch  # noqa: E402
from dsv4lab.serving.watch import Verdict, wait_ready  # noqa: E402
from tests.sshd import free_port, start_sshd  # noqa: E402

STORY_POLL_S = 25.0
STORY_ROUNDS = 16
READY_LINE = "The server is fired up and ready to roll!"


class Observer(threading.Thread):
    """Polls the run directory locally every millisecond: when did the truth happen?"""

    def __init__(self, run_dir: str) -> None:
        super().__init__(daemon=True)
        self.layout = RunLayout(run_dir)
        self.died_at: float | None = None
        self.ready_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        log = Path(self.layout.log)
        exit_file = Path(self.layout.server_exit)
        offset = 0
        while not self.stop.is_set():
            if self.died_at is None and exit_file.exists():
                self.died_at = time.time()
            if self.ready_at is None and log.exists():
                with log.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
                if READY_LINE.encode() in data:
                    self.ready_at = time.time()
                offset += max(0, len(data) - len(READY_LINE))
            time.sleep(0.001)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def one(host: SSHHost, kind: str, root: Path, i: int, scale: str) -> float:
    config = (config_b() if kind == "crash" else config_a()).replace(port=free_port())
    run_dir = str(root / f"{kind}-{i}")
    handle = launch(host, config, run_dir, target="twin", python=sys.executable, twin_env={"DSV4LAB_TWIN_PACE": scale})
    observer = Observer(run_dir)
    observer.start()
    try:
        result = wait_ready(handle, 120, progress=False)
        verdict_at = time.time()
    finally:
        observer.stop.set()
        handle.stop(grace_s=1.0)
    expected = Verdict.CRASHED if kind == "crash" else Verdict.READY
    if result.verdict is not expected:
        raise SystemExit(f"run {i}: expected {expected.value}, got {result.verdict.value}: {result.reason}")
    truth = observer.died_at if kind == "crash" else observer.ready_at
    if truth is None:
        raise SystemExit(f"run {i}: the observer missed the {kind}")
    return max(0.0, verdict_at - truth)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--pace",
        default="0.02",
        help="the twin's pace (startup about 1 s at 0.02): the watcher's latency is wall time",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dsv4lab-watch-bench-") as tmp:
        root = Path(tmp)
        sshd_iter = start_sshd(root / "sshd")
        sshd = next(sshd_iter)
        try:
            host = sshd.connect()
            figures: dict[str, list[float]] = {"crash": [], "ready": []}
            for kind in ("crash", "ready"):
                for i in range(args.runs):
                    figures[kind].append(one(host, kind, root, i, args.pace))
            host.close()
        finally:
            for _ in sshd_iter:  # runs the generator's cleanup
                pass
    story = {"crash": STORY_POLL_S * STORY_ROUNDS, "ready": STORY_POLL_S / 2}
    print(f"watcher over loopback SSH, {args.runs} runs each (twin paced at {args.pace})")
    print(f"{'event':<8}{'p50 s':>10}{'p95 s':>10}{'max s':>10}   story's loop (25 s last-line poll)")
    for kind, xs in figures.items():
        note = "400 s: gives up, never says CRASHED" if kind == "crash" else "12.5 s on average (0-25 s)"
        print(f"{kind:<8}{statistics.median(xs):>10.3f}{pct(xs, 0.95):>10.3f}{max(xs):>10.3f}   {note}")
        print(f"{'':<8}ratio to the story's loop at p95: {story[kind] / max(pct(xs, 0.95), 1e-3):,.0f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
