"""Slurm as a placement, against a real private Slurm cluster (tests/slurmcluster.py) and the twin.

The CLI contract (``launch --slurm-*``, ``watch``, ``ps``, ``stop``) end to end: a job QUEUED for Resources
behind another 8-GPU job, READY with its queue time apart, a benchmark through the node's port, ``stop`` as
scancel that returns when the job is gone and leaves no process behind (psutil), a cancel from outside and a
time limit as the verdict's evidence, the login host over the loopback sshd, and bad input refused before
anything is submitted. Without Slurm these skip locally and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dsv4lab.config.server_config import ServerConfig
from dsv4lab.hosts import LocalHost
from dsv4lab.serving.launch import attach
from dsv4lab.serving.launch import launch as launch_server
from dsv4lab.serving.slurm import FIRST_NODE, SlurmPlacement
from dsv4lab.serving.slurm_handle import SlurmServerHandle
from dsv4lab.serving.watch import Verdict, wait_ready
from tests.slurmcluster import SlurmCluster, free_ports, require_slurm
from tests.sshd import SSHD, consecutive_free_ports

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ALIAS = "login"

#: The twin, fast: READY in a few seconds of wall time; no tuned kernel folder on this machine.
TWIN = ["--preset", "config_a", "--twin", "--pace", "0.05", "--set", "kernel_config_dir="]


@pytest.fixture(scope="module", autouse=True)
def private_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Port reservations of this module's launches in a state dir of their own (the CLI and the Lab read it)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DSV4LAB_STATE_DIR", str(tmp_path_factory.mktemp("slurm-state")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm-launch"), kill_wait_s=2) as c:
        yield c


@pytest.fixture(scope="module", autouse=True)
def past_its_limit(
    private_state: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SlurmCluster, Path]]:
    """A twin that hangs in graph capture, in a 1-minute job on a cluster of its own, launched before this
    module's first test: Slurm ends it (slurmctld checks limits every 30 s: 60-90 s later) while the other
    tests run, instead of a test waiting out the minute. The last test reads its verdict."""
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm-limit"), kill_wait_s=2, min_job_age_s=1800) as c:
        run_dir = tmp_path_factory.mktemp("limit") / "t"
        (port,) = free_ports(1)
        out = cli(
            c,
            "launch",
            *TWIN,
            "--fault",
            "capture_hang",
            "--set",
            f"port={port}",
            "--slurm-partition",
            "short",
            "--slurm-gpus",
            "8",
            "--slurm-time",
            "1",
            "--run-dir",
            str(run_dir),
        )
        assert out.returncode == 0, out.stderr
        yield c, run_dir


@pytest.fixture
def idle(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    with cluster.for_one_test():
        yield cluster


def cli(cluster: SlurmCluster, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> Any:
    base = {**os.environ, **cluster.env, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dsv4lab", *args], env=base, capture_output=True, text=True, timeout=timeout
    )


def launch(cluster: SlurmCluster, run_dir: Path, port: int, *extra: str, env: dict[str, str] | None = None) -> str:
    out = cli(
        cluster,
        "launch",
        *TWIN,
        "--set",
        f"port={port}",
        "--slurm-partition",
        "gpu",
        "--slurm-gpus",
        "8",
        "--slurm-time",
        "10",
        *extra,
        "--run-dir",
        str(run_dir),
        "--json",
        env=env,
    )
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    job = str(record["slurm"]["job_id"])
    assert job.isdigit() and record["slurm"]["placement"]["gpus_per_node"] == 8
    return job


def watch(cluster: SlurmCluster, run_dir: Path, *extra: str, timeout: float = 120) -> dict[str, Any]:
    out = cli(cluster, "watch", str(run_dir), "--json", "--timeout", str(timeout), *extra, timeout=timeout + 60)
    assert out.stdout.strip(), out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def processes_of(run_dir: Path) -> list[psutil.Process]:
    """Live processes started for ``run_dir`` (the launch script and the twin's tree run there)."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if str(run_dir) in " ".join(p.info["cmdline"] or []) or (p.info["cwd"] or "") == str(run_dir):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_queued_ready_bench_stop_and_a_cancel_from_outside(idle: SlurmCluster, tmp_path: Path) -> None:
    cluster = idle
    port_a, port_b = free_ports(2)
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    job_a = launch(cluster, run_a, port_a)
    job_b = launch(cluster, run_b, port_b)

    # B waits behind A's 8 GPUs: QUEUED with Slurm's reason, and the watch gives it back, not TIMEOUT.
    cluster.wait_state(job_b, ["PENDING"])
    queued = watch(cluster, run_b, timeout=3)
    assert queued["verdict"] == "QUEUED", queued
    assert queued["slurm"]["state"] == "PENDING" and queued["slurm"]["reason"] in ("Resources", "Priority")
    assert f"Slurm job {job_b}" in queued["reason"] and queued["queued_s"] is None

    ps = cli(cluster, "ps", "--root", str(tmp_path))
    assert ps.returncode == 0, ps.stderr
    assert f"slurm job {job_a}" in ps.stdout and f"slurm job {job_b}" in ps.stdout
    assert "PENDING" in ps.stdout

    ready = watch(cluster, run_a)
    assert ready["verdict"] == "READY", ready
    assert ready["slurm"]["state"] == "RUNNING" and ready["slurm"]["nodes"] == ["localhost"]
    assert ready["queued_s"] is not None and ready["queued_s"] <= 5

    bench = cli(
        cluster,
        "bench",
        "--run-dir",
        str(run_a),
        "--num-prompts",
        "4",
        "--concurrency",
        "2",
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--json",
    )
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout.splitlines()[-1])["completed"] == 4

    assert processes_of(run_a), "the job's launch script and twin run in its run dir"
    stopped = cli(cluster, "stop", str(run_a))
    assert stopped.returncode == 0, stopped.stderr
    assert f"Slurm job {job_a}: cancelled (RUNNING → CANCELLED" in stopped.stdout
    # stop returns when the job is gone: nothing of it runs on.
    assert cluster.state(job_a) == "CANCELLED"
    assert processes_of(run_a) == []
    after = watch(cluster, run_a, timeout=10)
    assert after["verdict"] == "STOPPED", after

    # B starts once A's GPUs are free; its startup counts from its own start, the queue apart.
    ready_b = watch(cluster, run_b)
    assert ready_b["verdict"] == "READY", ready_b
    assert ready_b["queued_s"] is not None and ready_b["queued_s"] >= 1.0

    # scancel by someone else: the verdict says so, from Slurm's own record and the job's output.
    cluster.run(["scancel", job_b])
    cluster.wait_state(job_b, ["CANCELLED"])
    verdict = watch(cluster, run_b, timeout=20)
    assert verdict["verdict"] == "CRASHED", verdict
    assert "the Slurm job was cancelled" in verdict["reason"] and verdict["slurm"]["state"] == "CANCELLED"
    assert any(f"Slurm job {job_b}: CANCELLED" in line for line in verdict["evidence"]), verdict["evidence"]
    assert any(f"*** JOB {job_b} ON localhost CANCELLED AT" in line for line in verdict["evidence"])
    assert processes_of(run_b) == []


@pytest.mark.parametrize(
    ("args", "env", "says", "code"),
    [
        (["--slurm-partition", "nosuch"], {}, "unknown Slurm partition 'nosuch' (allowed: gpu, short)", 2),
        (["--slurm-gpus", "9"], {}, "--slurm-gpus=9 is not valid: at most 8: partition gpu's nodes have", 2),
        (
            ["--slurm-partition", "short", "--slurm-time", "10"],
            {},
            "--slurm-time=10 is not valid: at most 1 min: partition short's MaxTime",
            2,
        ),
        (
            ["--slurm-gpus", "4", "--set", "tp=8"],
            {},
            "--slurm-gpus=4 is not valid: at least 8: the server needs 8 GPUs per node",
            2,
        ),
        (["--slurm-time", "0"], {}, "--slurm-time=0 is not valid: a whole number >= 1", 2),
        (["--slurm-gpus", "8"], {"PATH": "no-slurm"}, "scontrol was not found on localhost", 6),
    ],
    ids=["unknown-partition", "nine-gpus", "time-over-partition", "config-needs-more-gpus", "zero-time", "no-slurm"],
)
def test_bad_input_is_one_line_and_nothing_is_submitted(
    idle: SlurmCluster, tmp_path: Path, args: list[str], env: dict[str, str], says: str, code: int
) -> None:
    run_dir = tmp_path / "bad"
    argv = ["launch", *TWIN, *args, "--run-dir", str(run_dir)]
    if env.get("PATH") == "no-slurm":  # a PATH with the shell's tools and no Slurm commands
        bare = tmp_path / "bin"
        bare.mkdir()
        for tool in ("env", "bash", "sh"):
            (bare / tool).symlink_to(f"/usr/bin/{tool}" if Path(f"/usr/bin/{tool}").exists() else f"/bin/{tool}")
        env = {"PATH": str(bare)}
    out = cli(idle, *argv, env=env)
    assert out.returncode == code, (out.stdout, out.stderr)
    assert says in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr  # one line
    assert idle.active_jobs() == []
    assert not run_dir.exists()


def test_a_controller_that_is_not_there(idle: SlurmCluster, tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    moved = f"SlurmctldPort={free_ports(1)[0]}"
    conf.write_text(idle.conf.read_text().replace(f"SlurmctldPort={idle.ctld_port}", moved))
    argv = ["launch", *TWIN, "--slurm-partition", "gpu", "--run-dir", str(tmp_path / "r")]
    out = cli(idle, *argv, env={"SLURM_CONF": str(conf)}, timeout=120)
    assert out.returncode == 6, (out.stdout, out.stderr)
    assert "the Slurm controller cannot be reached from localhost (SLURM_CONF=" in out.stderr, out.stderr
    assert idle.active_jobs() == [] and not (tmp_path / "r").exists()


def test_the_login_host_over_the_loopback_sshd(idle: SlurmCluster, sshd: SSHD, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host {ALIAS}\n  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.key_path}\n  IdentitiesOnly yes\n"
    )
    env = {"HOME": str(home), "SSH_AUTH_SOCK": ""}
    ssh = ["--host", ALIAS, "--known-hosts", sshd.known_hosts]
    run_dir = tmp_path / "ssh-run"
    (port,) = free_ports(1)
    job = launch(idle, run_dir, port, *ssh, "--python", sys.executable, env=env)
    ready = json.loads(
        cli(idle, "watch", str(run_dir), *ssh, "--json", "--timeout", "120", env=env, timeout=180).stdout
    )
    assert ready["verdict"] == "READY" and ready["slurm"]["job_id"] == job, ready
    ps = cli(idle, "ps", *ssh, "--root", str(tmp_path), env=env)
    assert f"slurm job {job}" in ps.stdout and "RUNNING" in ps.stdout, (ps.stdout, ps.stderr)
    # The login host keeps the job's port reservation in the SSH user's own state (the session's env does not
    # travel): held while the job runs, gone with the stop.
    ports = Path(pwd.getpwnam(sshd.user).pw_dir) / ".cache" / "dsv4lab" / "ports"
    assert str(run_dir) in reservations(ports).get(port, "")
    stopped = cli(idle, "stop", str(run_dir), *ssh, env=env)
    assert stopped.returncode == 0 and "CANCELLED" in stopped.stdout, (stopped.stdout, stopped.stderr)
    assert idle.state(job) == "CANCELLED" and processes_of(run_dir) == []
    assert str(run_dir) not in reservations(ports).get(port, "")


def reservations(folder: Path) -> dict[int, str]:
    """The port reservations in a dsv4lab state dir's ``ports`` folder: port -> the file's lines."""
    if not folder.is_dir():
        return {}
    return {int(f.name): f.read_text() for f in folder.iterdir() if f.name.isdigit()}


def test_a_port_is_held_while_its_job_is_queued_or_running_and_a_stopped_cluster_costs_one_squeue(
    idle: SlurmCluster, tmp_path: Path
) -> None:
    """Reservations name their job (``slurm:ID``) and cluster; a pick asks each cluster once about all of its
    jobs. A cluster that has stopped leaves its config behind in tests and on disks: asking it costs one
    timeout, not one per reservation (five here)."""
    ended = idle.sbatch("--partition", "gpu", "--wrap", "true")
    idle.wait_state(ended, ["COMPLETED"])  # and still listed: MinJobAge is 300 s on this cluster
    running = idle.sbatch("--partition", "gpu", "--gres", "gpu:8", "--wrap", "sleep 120")
    queued = idle.sbatch("--partition", "gpu", "--gres", "gpu:8", "--wrap", "sleep 120")
    idle.wait_state(running, ["RUNNING"])
    idle.wait_state(queued, ["PENDING"])
    dead = tmp_path / "stopped-cluster.conf"
    dead.write_text(
        idle.conf.read_text().replace(f"SlurmctldPort={idle.ctld_port}", f"SlurmctldPort={free_ports(1)[0]}")
    )
    state = Path(os.environ["DSV4LAB_STATE_DIR"]) / "ports"
    state.mkdir(parents=True, exist_ok=True)
    base = unbound_run(8)
    jobs = [(running, idle.conf), (queued, idle.conf), (ended, idle.conf)] + [(str(90 + i), dead) for i in range(5)]
    for offset, (job, conf) in enumerate(jobs):
        (state / str(base + offset)).write_text(f"/runs/r{offset}\nslurm:{job}\n{conf}\n")
    # Every squeue this pick runs is counted by a wrapper in front of the real one.
    calls = tmp_path / "squeue-calls"
    wrapper = tmp_path / "bin" / "squeue"
    wrapper.parent.mkdir()
    real = shutil.which("squeue")
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, **idle.env, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"}
    code = "import sys; from dsv4lab.hosts import LocalHost as H; from dsv4lab.serving.ports import pick_port as p; "
    code += f"print(p(H(), {base}))"
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout) == base + 2  # the running and the queued job's ports are held; the ended one's is not
        asked = [set(line.split()[2].split(",")) for line in calls.read_text().splitlines()]
        for cluster_jobs in ({running, queued, ended}, {str(90 + i) for i in range(5)}):  # one squeue per cluster
            assert [ids >= cluster_jobs for ids in asked if ids & cluster_jobs] == [True], asked
    finally:
        for offset in range(len(jobs)):
            (state / str(base + offset)).unlink()


def unbound_run(count: int) -> int:
    """The first of ``count`` consecutive ports from 41000 (in steps of 16) that nothing listens on."""
    for base in range(41000, 42000, 16):
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise AssertionError("no free run of ports from 41000")


def test_a_lab_on_slurm_queues_and_reads_its_queue_time(idle: SlurmCluster, tmp_path: Path, monkeypatch: Any) -> None:
    """``Lab(slurm=...)``: each server a job; the second waits QUEUED for the first's GPUs, with Slurm's
    reason in its readiness, and starts once the first is stopped."""
    from dsv4lab import Lab
    from dsv4lab.serving.watch import Verdict

    for key, value in idle.env.items():
        monkeypatch.setenv(key, value)
    placement = {"partition": "gpu", "gpus_per_node": 8, "time_min": 10, "slurm_conf": idle.env["SLURM_CONF"]}
    with Lab(run_root=tmp_path / "runs", slurm=placement, progress=False) as lab:
        a = lab.launch("config_a").wait(120)
        b = lab.launch("config_a")
        idle.wait_state(b.handle.job_id, ["PENDING"])  # type: ignore[attr-defined]
        assert b.state.startswith("QUEUED ("), b.state  # what the panel and lab.ps() show while it waits
        assert a.readiness is not None and a.readiness.verdict is Verdict.READY, a.readiness
        b.wait(3)
        assert b.readiness is not None and b.readiness.verdict is Verdict.QUEUED, b.readiness
        assert "Resources" in b.readiness.reason or "Priority" in b.readiness.reason
        rows = lab.ps().to_frame()
        assert list(rows["slurm job"].str.split().str[1]) == ["RUNNING", "PENDING"]
        assert "QUEUED" in b._repr_html_() or "PENDING" in b._repr_html_()
        a.stop()
        b.wait(120)
        assert b.readiness is not None and b.readiness.verdict.value == "READY", b.readiness
        assert b.readiness.queued_s is not None and b.readiness.queued_s >= 1.0
    assert idle.active_jobs() == []
    assert processes_of(tmp_path / "runs") == []


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm-two"), nodes=("n1", "n2"), kill_wait_s=2) as c:
        yield c


def test_a_sweep_fans_out_over_two_nodes_with_its_queue_in_the_index(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """Four points, three submitted at a time, 8-GPU jobs on two 8-GPU nodes: Slurm runs two at once and queues
    the third; the index has each point's queue time (wall clock) and startup (modelled) apart."""
    two_nodes.wait_idle()
    args = ["sweep", "04_config_b_fixed", "--reports", str(tmp_path), "--max-parallel", "3"]
    args += ["-p", "cuda_graph_max_bs", "4,8,12,16", "-p", "mem_fraction_static", "0.9", "-p", "concurrency", "[1]"]
    args += ["-p", "input_len", "1000", "-p", "output_len", "16", "-p", "pace", "0.02"]
    args += ["--slurm-partition", "gpu", "--slurm-gpus", "8", "--slurm-time", "10"]
    out = cli(two_nodes, *args, timeout=900)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    index = Path(out.stdout.strip().splitlines()[-1])
    sweep = json.loads((index.parent / "sweep.json").read_text())
    points = sweep["points"]
    assert [p["status"] for p in points] == ["ok"] * 4, points
    assert all(p["verdict"] == "READY" for p in points), points
    assert all(p["queued_s"] is not None and p["startup_s"] is not None for p in points), points
    assert max(p["queued_s"] for p in points) >= 1.0, "the third job waited for a node"
    # Which node ran each point, and how many ran at once: never more than the two nodes.
    spans, nodes = [], set()
    for path in sorted(index.parent.glob("*/*/readiness.json")):
        record = json.loads(path.read_text())
        nodes.update(record["slurm"]["nodes"])
        job = two_nodes.job(record["slurm"]["job_id"])  # Slurm's own record of when the job ran
        spans.append((job["StartTime"], job["EndTime"]))
    assert len(spans) == 4
    assert nodes == {"n1", "n2"}
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most == 2, spans
    html = index.read_text()
    assert "queued (s, wall clock)" in html and "startup (s, modelled hardware)" in html
    assert "queued (s, wall clock)" in out.stdout and " n1 " in out.stdout and " n2 " in out.stdout
    assert "slurm=partition gpu: 1 node x 8 GPUs, 10 min" in html
    assert two_nodes.active_jobs() == []


SIDE_BY_SIDE = """
[campaign]
name = "side-by-side"
title = "Two configs side by side, then one that takes its fix from the first"

[parameters]
pace = 0.02
concurrency = [1]
input_len = 1000
output_len = 16
overrides = "mem_fraction_static=0.9"

[[step]]
id = "a"
notebook = "04_config_b_fixed"
parameters = { fix = "cuda_graph_max_bs=4" }

[[step]]
id = "b"
notebook = "04_config_b_fixed"
parameters = { fix = "cuda_graph_max_bs=8" }

[[step]]
id = "c"
notebook = "04_config_b_fixed"
inputs = { fix = "a.fix" }
"""


def test_a_campaign_runs_independent_steps_side_by_side_and_a_dependent_one_after(
    two_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """Steps a and b need nothing from each other: their servers' jobs run at once, one on each node. Step c
    takes a's fix, so its job starts only after a's has ended. The index lists the steps in the file's order."""
    two_nodes.wait_idle()
    campaign = tmp_path / "side-by-side.toml"
    campaign.write_text(SIDE_BY_SIDE)
    args = ["campaign", str(campaign), "--reports", str(tmp_path / "reports"), "--max-parallel", "3"]
    args += ["--slurm-partition", "gpu", "--slurm-gpus", "8", "--slurm-time", "10"]
    out = cli(two_nodes, *args, timeout=900)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    index = Path(out.stdout.strip().splitlines()[-1])
    state = json.loads((index.parent / "campaign.json").read_text())
    assert state["shown"] == ["a", "b", "c"]
    assert [state["steps"][s]["status"] for s in "abc"] == ["ok"] * 3, state
    spans, nodes = {}, {}
    for step in "abc":
        (readiness,) = Path(state["steps"][step]["run_dir"]).glob("*/readiness.json")
        record = json.loads(readiness.read_text())
        assert record["verdict"] == "READY", record
        job = two_nodes.job(record["slurm"]["job_id"])  # Slurm's own record of when the job ran
        spans[step] = (job["StartTime"], job["EndTime"])
        nodes[step] = tuple(record["slurm"]["nodes"])
    assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1], f"a and b did not overlap: {spans}"
    assert {*nodes["a"], *nodes["b"]} == {"n1", "n2"}, nodes
    assert spans["c"][0] >= spans["a"][1], f"c started before a ended: {spans}"
    c_params = json.loads((Path(state["steps"]["c"]["run_dir"]) / "params.json").read_text())
    assert c_params["fix"] == "cuda_graph_max_bs=4"
    html = index.read_text()
    assert html.index(">a<") < html.index(">b<") < html.index(">c<")
    assert two_nodes.active_jobs() == []


def test_tune_runs_its_trials_two_at_a_time_as_jobs(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """``--max-parallel 2``: the sampler is asked for two trials at a time, their servers are two jobs Slurm runs
    at once (one on each node), and the four trials are ordinary run dirs with their jobs in their records."""
    two_nodes.wait_idle()
    # 400 output tokens make each trial's job last 5-15 s: Slurm stamps start and end to the second, and 1-s trials
    # on a slow host ended in the second their peer started, which cannot be told from "one after the other".
    args = ["tune", "--preset", "config_b_fixed", "--twin", "--space", "mem_fraction_static=0.80,0.92"]
    args += ["--space", "cuda_graph_max_bs=8,16", "--concurrency", "16", "--input-len", "1000", "--output-len", "400"]
    args += ["--pace", "0.02", "--budget", "4", "--max-parallel", "2", "--reports", str(tmp_path), "--json"]
    args += ["--slurm-partition", "gpu", "--slurm-gpus", "8", "--slurm-time", "10"]
    out = cli(two_nodes, *args, timeout=600)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    result = json.loads(out.stdout.strip().splitlines()[-2])
    assert result["launches"] == 4 and all(t["status"] == "ok" for t in result["trials"]), result["trials"]
    spans = []
    for trial in result["trials"]:
        record = json.loads((Path(trial["run_dir"]) / "readiness.json").read_text())
        job = two_nodes.job(record["slurm"]["job_id"])
        spans.append((job["StartTime"], job["EndTime"], job["NodeList"]))
    for first, second in (spans[0:2], spans[2:4]):  # each batch's two jobs ran at once, on the two nodes
        assert first[0] < second[1] and second[0] < first[1], spans
        assert {first[2], second[2]} == {"n1", "n2"}, spans
    assert spans[2][0] >= max(spans[0][1], spans[1][1]), "the second batch waited for the first one's results"
    assert two_nodes.active_jobs() == []


def test_the_twin_has_the_gpus_its_job_was_given(idle: SlurmCluster, tmp_path: Path) -> None:
    """An ``--sbatch-arg`` comes last and wins: ``--gres=gpu:4`` gives the job 4 GPUs, and the twin (as a real
    server would) sees only those: a tp=8 config cannot start, and the verdict says why."""
    run_dir = tmp_path / "four"
    (port,) = free_ports(1)
    launch(idle, run_dir, port, "--sbatch-arg=--gres=gpu:4")
    result = watch(idle, run_dir, timeout=60)
    assert result["verdict"] == "CRASHED", result
    assert any("at most 4 GPUs per node" in line for line in result["evidence"]), result["evidence"]
    assert result["slurm"]["state"] == "FAILED"


def _processes_under(run_dir: Path) -> list[psutil.Process]:
    """Live processes started for ``run_dir`` or any folder in it (a multi-node job's nodeK)."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cwd = p.info["cwd"] or ""
            if (
                str(run_dir) in " ".join(p.info["cmdline"] or [])
                or cwd == str(run_dir)
                or cwd.startswith(f"{run_dir}/")
            ):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _launch_on_two_nodes(two_nodes: SlurmCluster, run_dir: Path) -> tuple[SlurmServerHandle, int]:
    """The tiny twin as SGLang's 2-node server, one job on the two-node cluster; (its handle, dist-init port)."""
    two_nodes.wait_idle()
    port, dist = consecutive_free_ports(2), free_ports(1)[0]  # node 1 serves on port + 1
    config = ServerConfig(
        model_path="dsv4lab/tiny-moe", tp=2, port=port, mem_fraction_static=0.8, nnodes=2, dist_init_addr=f"head:{dist}"
    )
    # The two Slurm nodes are this one machine: node 1's port is shifted by one (port_step), as in a rehearsal.
    placement = SlurmPlacement("gpu", 8, 10, nodes=2, slurm_conf=two_nodes.env["SLURM_CONF"], port_step=1)
    settings = {"DSV4LAB_TWIN_PACE": "0.05", "DSV4LAB_TWIN_HARDWARE": "tiny"}
    handle = launch_server(LocalHost(), config, str(run_dir), target="twin", twin_env=settings, placement=placement)
    assert isinstance(handle, SlurmServerHandle)
    return handle, dist


def test_a_server_on_two_nodes_is_one_job_and_stop_ends_both(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """SGLang's multi-node launch as one 2-node job: an srun task per node runs that node's launch script
    (node_rank from the job, the first node's address as the dist-init host), READY from node 0, which serves the
    API; stop is scancel and leaves no process of either node (psutil)."""
    run_dir = tmp_path / "two"
    handle, dist = _launch_on_two_nodes(two_nodes, run_dir)
    try:
        result = wait_ready(handle, 120, progress=False)
        assert result.verdict is Verdict.READY, result
        job = two_nodes.job(handle.job_id)
        assert job["NodeList"] == "n[1-2]" and job["NumNodes"] == "2", job
        for rank in (0, 1):
            pid = int((run_dir / f"node{rank}" / "server.pid").read_text())
            assert psutil.pid_exists(pid), f"node {rank}'s server is not running"
            log = (run_dir / f"node{rank}" / "server.log").read_text()
            assert f"127.0.0.1:{dist}" in log and FIRST_NODE not in log, log[-2000:]
        assert "'node_rank': 1" in (run_dir / "node1" / "server.log").read_text()
        # What `dsv4lab watch D` reads back: the same job, node 0's files.
        again = attach(LocalHost(), str(run_dir))
        assert again.log_path == str(run_dir / "node0" / "server.log")
        assert wait_ready(again, 10, progress=False).verdict is Verdict.READY
    finally:
        handle.stop(grace_s=5)
    assert two_nodes.state(handle.job_id) == "CANCELLED"
    assert _processes_under(run_dir) == []
    assert two_nodes.active_jobs() == []


def test_one_dead_node_of_a_two_node_server_ends_the_job(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """A multi-node server is whole or gone: node 1's server SIGKILLed, srun ends node 0's (--kill-on-bad-exit),
    the watch on node 0 says CRASHED with the job's end state in its evidence, and nothing is left."""
    run_dir = tmp_path / "two"
    handle, _ = _launch_on_two_nodes(two_nodes, run_dir)
    try:
        assert wait_ready(handle, 120, progress=False).verdict is Verdict.READY
        os.kill(int((run_dir / "node1" / "server.pid").read_text()), 9)
        deadline = time.monotonic() + 60
        while handle.exit_status() is None and time.monotonic() < deadline:  # node 0's script, or its job, ended
            time.sleep(0.2)
        assert handle.exit_status() is not None, "node 0's server outlived node 1's"
        result = wait_ready(handle, 60, progress=False)
        assert result.verdict is Verdict.CRASHED, result
        assert any("Slurm job" in line for line in result.evidence), result.evidence
        assert two_nodes.state(handle.job_id) in ("FAILED", "CANCELLED"), two_nodes.job(handle.job_id)
    finally:
        handle.stop(grace_s=5)
    assert _processes_under(run_dir) == []
    assert two_nodes.active_jobs() == []


def test_a_point_cancelled_by_slurm_is_recorded_and_a_resumed_sweep_runs_only_it(
    idle: SlurmCluster, tmp_path: Path
) -> None:
    """Two 8-GPU points on one 8-GPU node: the second waits QUEUED and is cancelled from outside. The sweep
    records that outcome; ``--resume`` keeps the finished point as it was and runs the cancelled one again."""
    args = ["sweep", "04_config_b_fixed", "--reports", str(tmp_path), "--max-parallel", "2"]
    args += ["-p", "cuda_graph_max_bs", "8,16", "-p", "mem_fraction_static", "0.9", "-p", "concurrency", "[1]"]
    args += ["-p", "input_len", "1000", "-p", "output_len", "16", "-p", "pace", "0.02"]
    args += ["--slurm-partition", "gpu", "--slurm-gpus", "8", "--slurm-time", "10"]
    env = {**os.environ, **idle.env, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsv4lab", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        pending: list[str] = []
        while not pending and time.monotonic() < deadline and proc.poll() is None:
            pending = [j for j in idle.active_jobs() if idle.state(j) == "PENDING"]
            time.sleep(0.2)
        assert pending, "the second point's job never waited in the queue"
        idle.run(["scancel", pending[0]])
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 1), err[-3000:]
    index = Path(out.strip().splitlines()[-1])
    first = json.loads((index.parent / "sweep.json").read_text())
    runs = first["runs"]
    cancelled = [r for r in runs if r["job_state"] == "CANCELLED" or r["status"] == "failed"]
    kept = [r for r in runs if r not in cancelled]
    assert len(cancelled) == 1 and len(kept) == 1, runs
    assert kept[0]["status"] == "ok" and kept[0]["job_state"] == "", kept

    again = cli(idle, *args, "--resume", str(index.parent), timeout=600)
    assert again.returncode == 0, (again.stdout[-3000:], again.stderr[-3000:])
    assert Path(again.stdout.strip().splitlines()[-1]) == index
    resumed = json.loads((index.parent / "sweep.json").read_text())["runs"]
    by_value = {r["parameters"]["cuda_graph_max_bs"]: r for r in resumed}
    assert by_value[kept[0]["parameters"]["cuda_graph_max_bs"]] == kept[0]  # kept as it was: not run again
    rerun = by_value[cancelled[0]["parameters"]["cuda_graph_max_bs"]]
    assert rerun["status"] == "ok" and rerun["job_state"] == "" and rerun["run_dir"] != cancelled[0]["run_dir"]
    assert Path(cancelled[0]["run_dir"]).is_dir()  # the cancelled run's evidence stays
    assert idle.active_jobs() == []
    # A folder of another sweep, or other fixed parameters: refused before anything runs.
    other = cli(idle, *[a if a != "0.9" else "0.85" for a in args], "--resume", str(index.parent))
    assert other.returncode == 2 and "same fixed parameters (differing: mem_fraction_static)" in other.stderr


def test_a_job_past_its_time_limit_is_a_timeout_in_the_verdict(past_its_limit: tuple[SlurmCluster, Path]) -> None:
    """The job launched before this module's first test (:func:`past_its_limit`): Slurm ended it at its time
    limit, and the verdict names the limit."""
    cluster, run_dir = past_its_limit
    result = watch(cluster, run_dir, "--stall-after", "600", timeout=150)
    assert result["verdict"] == "CRASHED", result
    assert "the Slurm job reached its time limit and Slurm ended it (1 min)" in result["reason"]
    assert result["slurm"]["state"] == "TIMEOUT" and result["slurm"]["reason"] == "TimeLimit"
    assert any("DUE TO TIME LIMIT" in line for line in result["evidence"]), result["evidence"]
    assert processes_of(run_dir) == []
