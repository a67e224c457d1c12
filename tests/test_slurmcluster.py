"""The private Slurm test cluster (tests/slurmcluster.py) is real Slurm and behaves as the lab will see it.

Each test pins an exact behaviour of Slurm 22.05 that the Slurm placement relies on: GPUs from GRES, queue
reasons, refusals at submit and their messages, end states, and what is left after scancel. Without Slurm
these skip locally and fail under CI=true (``tools/slurm_install.sh`` installs it as root).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.slurmcluster import SlurmCluster, free_ports, require_slurm
from tests.sshd import SSHD

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

REFUSED_NODE_CONFIG = "sbatch: error: Batch job submission failed: Requested node configuration is not available"
REFUSED_PARTITION = (
    "sbatch: error: invalid partition specified: nosuch\n"
    "sbatch: error: Batch job submission failed: Invalid partition name specified"
)
REFUSED_TIME = (
    "sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)"
)


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One node ``localhost``, 8 GRES GPUs, 2 CPUs; partitions ``gpu`` (default) and ``short`` (1 min)."""
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm-one")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Two slurmd nodes n1, n2 on this machine, 8 GRES GPUs each."""
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm-two"), nodes=("n1", "n2")) as cluster:
        yield cluster


@pytest.fixture
def cluster(one_node: SlurmCluster) -> Iterator[SlurmCluster]:
    """The one-node cluster, idle at the start of the test and again after it."""
    with one_node.for_one_test():
        yield one_node


def unique_seconds() -> int:
    """A sleep length no other test (or a second run of this file beside it) uses: its process is found by it."""
    return 1_000_000 + secrets.randbelow(8_000_000)


def pids_with(text: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if p.info["status"] != psutil.STATUS_ZOMBIE and text in " ".join(p.info["cmdline"] or []):
                found.append(p.pid)
    return found


def wait_until(check: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.1)


def http_status(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as response:
            return int(response.status)
    except OSError:
        return None


# ---- the cluster itself --------------------------------------------------------------------------------


def test_node_is_idle_with_both_partitions(cluster: SlurmCluster) -> None:
    assert cluster.node_states() == {"localhost": "idle"}
    partitions = cluster.run(["sinfo", "-h", "-o", "%P %l %G"]).stdout.split("\n")
    assert partitions[:2] == ["gpu* infinite gpu:8", "short 1:00 gpu:8"]
    assert Path(cluster.env["SLURM_CONF"]).is_file()


def test_start_and_stop_by_pid_leave_nothing(tmp_path: Path) -> None:
    require_slurm()
    marker = unique_seconds()
    started = time.monotonic()
    cluster = SlurmCluster(tmp_path / "c").start()
    try:
        assert time.monotonic() - started < 10
        pids = cluster.pids()
        assert set(pids) == {"munged", "slurmctld", "slurmd-localhost"}
        job = cluster.sbatch("-o", "/dev/null", "--wrap", f"sleep {marker}")
        cluster.wait_state(job, ["RUNNING"])
        wait_until(lambda: pids_with(f"sleep {marker}"), "the job's sleep running")
    finally:
        cluster.stop()
    assert not [pid for pid in pids.values() if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not pids_with(f"sleep {marker}"), "stop() cancels the jobs"
    # A restart in the same folder starts clean: no job comes back from the last run.
    with SlurmCluster(tmp_path / "c") as again:
        assert again.squeue_json() == []


def test_two_clusters_side_by_side(cluster: SlurmCluster, tmp_path: Path) -> None:
    require_slurm()
    marker = unique_seconds()
    with SlurmCluster(tmp_path / "second") as second:
        assert second.ctld_port != cluster.ctld_port
        assert second.node_ports["localhost"] != cluster.node_ports["localhost"]
        mine = cluster.sbatch("--gres=gpu:8", "-o", "/dev/null", "--wrap", f"sleep {marker}")
        theirs = second.sbatch("--gres=gpu:8", "-o", "/dev/null", "--wrap", f"sleep {marker + 1}")
        assert mine != theirs, "job ids differ between clusters (their cgroups share one freezer tree)"
        cluster.wait_state(mine, ["RUNNING"])
        second.wait_state(theirs, ["RUNNING"])
        second.run(["scancel", theirs])
        second.wait_state(theirs, ["CANCELLED"])
        assert cluster.state(mine) == "RUNNING", "cancelling in one cluster leaves the other's job alone"
        assert pids_with(f"sleep {marker}")


# ---- GPUs, queueing and refusals -----------------------------------------------------------------------


def test_job_sees_eight_gpus(cluster: SlurmCluster) -> None:
    out = cluster.directory / "gpus.out"
    job = cluster.sbatch(
        "--gres=gpu:8", "-o", str(out), "--wrap", "echo $CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE $SLURMD_NODENAME"
    )
    fields = cluster.wait_state(job, ["COMPLETED", "FAILED"])
    assert (fields["JobState"], fields["ExitCode"], fields["NodeList"], fields["BatchHost"]) == (
        "COMPLETED",
        "0:0",
        "localhost",
        "localhost",
    )
    assert out.read_text().split() == ["0,1,2,3,4,5,6,7", "8", "localhost"]


def test_second_eight_gpu_job_pends_for_resources(cluster: SlurmCluster) -> None:
    first = cluster.sbatch("--gres=gpu:8", "-o", "/dev/null", "--wrap", "sleep 60")
    cluster.wait_state(first, ["RUNNING"])
    second = cluster.sbatch("--gres=gpu:8", "-o", "/dev/null", "--wrap", "sleep 60")
    # Priority first (not yet looked at by the scheduler), then Resources once it has been.
    wait_until(lambda: cluster.job(second).get("Reason") == "Resources", "second job PENDING Resources")
    fields = cluster.job(second)
    assert (fields["JobState"], fields["StartTime"], fields["NodeList"]) == ("PENDING", "Unknown", "")
    ended = time.monotonic()
    cluster.run(["scancel", first])
    cluster.wait_state(second, ["RUNNING"], timeout_s=15)
    assert time.monotonic() - ended < 10


def test_nine_gpus_refused_at_submit(cluster: SlurmCluster) -> None:
    refused = cluster.run(["sbatch", "--parsable", "--gres=gpu:9", "--wrap", "true"], check=False)
    assert (refused.returncode, refused.stdout, refused.stderr.strip()) == (1, "", REFUSED_NODE_CONFIG)
    assert cluster.active_jobs() == []
    # The refusal still leaves a finished record (FAILED BadConstraints) that squeue --json shows.
    failed = [j for j in cluster.squeue_json() if j["tres_per_node"] == "gres:gpu:9"]
    assert [(j["job_state"], j["state_reason"]) for j in failed][-1:] == [("FAILED", "BadConstraints")]
    test_only = cluster.run(["sbatch", "--test-only", "--gres=gpu:9", "--wrap", "true"], check=False)
    assert (test_only.returncode, test_only.stderr.strip()) == (
        1,
        "allocation failure: Requested node configuration is not available",
    )


def test_unknown_partition_refused_at_submit(cluster: SlurmCluster) -> None:
    refused = cluster.run(["sbatch", "-p", "nosuch", "--wrap", "true"], check=False)
    assert (refused.returncode, refused.stderr.strip()) == (1, REFUSED_PARTITION)
    assert cluster.active_jobs() == []


def test_time_over_partition_limit_pends_forever_by_default(cluster: SlurmCluster) -> None:
    """EnforcePartLimits=NO (Slurm's default): accepted, PENDING PartitionTimeLimit; --test-only says
    nothing about it. The lab must refuse such a job itself (scontrol show partition: MaxTime)."""
    test_only = cluster.run(["sbatch", "--test-only", "-p", "short", "-t", "5", "--wrap", "true"], check=False)
    assert test_only.returncode == 0
    assert test_only.stderr.startswith("sbatch: Job ") and " to start at " in test_only.stderr
    job = cluster.sbatch("-p", "short", "-t", "5", "-o", "/dev/null", "--wrap", "true")
    fields = cluster.wait_state(job, ["PENDING"])
    wait_until(lambda: cluster.job(job).get("Reason") == "PartitionTimeLimit", "PENDING PartitionTimeLimit")
    assert (fields["Partition"], fields["TimeLimit"]) == ("short", "00:05:00")
    partition = cluster.run(["scontrol", "show", "partition", "-o", "short"]).stdout
    assert " MaxTime=00:01:00 " in partition


def test_time_over_partition_limit_refused_with_enforce_all(tmp_path: Path) -> None:
    require_slurm()
    with SlurmCluster(tmp_path / "strict", enforce_part_limits="ALL") as strict:
        refused = strict.run(["sbatch", "-p", "short", "-t", "5", "--wrap", "true"], check=False)
        assert (refused.returncode, refused.stderr.strip()) == (1, REFUSED_TIME)
        test_only = strict.run(["sbatch", "--test-only", "-p", "short", "-t", "5", "--wrap", "true"], check=False)
        assert (test_only.returncode, test_only.stderr.strip()) == (
            1,
            "allocation failure: Requested time limit is invalid (missing or exceeds some limit)",
        )
        assert strict.squeue_json() == [], "nothing submitted, not even a FAILED record"


def test_held_job_reasons(cluster: SlurmCluster) -> None:
    held = cluster.sbatch("--hold", "-o", "/dev/null", "--wrap", "true")
    fields = cluster.job(held)
    assert (fields["JobState"], fields["Reason"], fields["Priority"]) == ("PENDING", "JobHeldUser", "0")
    cluster.run(["scontrol", "hold", held])
    assert cluster.job(held)["Reason"] == "JobHeldAdmin"
    cluster.run(["scontrol", "release", held])
    assert cluster.wait_state(held, ["COMPLETED"])["ExitCode"] == "0:0"


# ---- end states ----------------------------------------------------------------------------------------


def test_failed_job_exit_code(cluster: SlurmCluster) -> None:
    job = cluster.sbatch("-o", "/dev/null", "--wrap", "exit 3")
    fields = cluster.wait_state(job, ["FAILED", "COMPLETED"])
    assert (fields["JobState"], fields["Reason"], fields["ExitCode"]) == ("FAILED", "NonZeroExitCode", "3:0")
    record = next(j for j in cluster.squeue_json() if str(j["job_id"]) == job)
    # squeue --json's exit_code is the raw wait status: exit 3 is 3 << 8; a signal is its number (15, 9).
    assert (record["job_state"], record["state_reason"], record["exit_code"]) == ("FAILED", "NonZeroExitCode", 768)


def test_scancel_shows_cancelled(cluster: SlurmCluster) -> None:
    job = cluster.sbatch("-t", "10", "-o", str(cluster.directory / "cancel.out"), "--wrap", "sleep 300")
    cluster.wait_state(job, ["RUNNING"])
    cluster.run(["scancel", job])
    fields = cluster.wait_state(job, ["CANCELLED"], timeout_s=15)
    assert (fields["Reason"], fields["NodeList"], fields["TimeLimit"]) == ("None", "localhost", "00:10:00")
    # SIGTERM ends it (0:15); on a loaded machine the step may not be gone within KillWait and gets SIGKILL (0:9).
    assert fields["ExitCode"] in ("0:15", "0:9"), fields["ExitCode"]
    assert fields["EndTime"] != "Unknown"
    record = next(j for j in cluster.squeue_json() if str(j["job_id"]) == job)
    assert (record["job_state"], record["state_reason"], record["time_limit"]) == ("CANCELLED", "None", 10)  # minutes
    assert record["exit_code"] in (15, 9)
    assert isinstance(record["start_time"], int) and isinstance(record["end_time"], int)
    assert f"*** JOB {job} ON localhost CANCELLED AT " in (cluster.directory / "cancel.out").read_text()
    # Plain squeue forgets it at once; -t all still lists it until MinJobAge.
    assert job not in cluster.active_jobs()
    assert cluster.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"]).stdout.strip() == "CANCELLED"


# A job past its time limit (TIMEOUT, Reason=TimeLimit, "DUE TO TIME LIMIT" in its output, 60-90 s after its
# start) is tested through the lab: test_slurm_launch.py::test_a_job_past_its_time_limit_is_a_timeout_in_the_verdict.


# ---- what outlives a job -------------------------------------------------------------------------------

#: Which children survive scancel under each process tracking (the tracking the fixture picked is tested).
SURVIVORS = {"cgroup": set(), "pgid": {"setsid"}, "linuxproc": {"double-fork"}}


def test_nothing_outlives_a_cancelled_job(cluster: SlurmCluster) -> None:
    port = free_ports(1)[0]
    base = unique_seconds()
    names = {"background": base, "setsid": base + 1, "double-fork": base + 2, "nohup": base + 3}
    script = "\n".join(
        [
            "#!/bin/bash",
            f"sleep {names['background']} &",
            f"setsid sleep {names['setsid']} &",
            f"( sleep {names['double-fork']} & )",
            f"nohup sleep {names['nohup']} >/dev/null 2>&1 &",
            f"python3 -m http.server --bind 127.0.0.1 {port} >/dev/null 2>&1 &",
            "wait",
            "",
        ]
    )
    path = cluster.directory / "tree.sh"
    path.write_text(script)
    job = cluster.sbatch("-o", "/dev/null", str(path))
    cluster.wait_state(job, ["RUNNING"])
    wait_until(lambda: http_status(port) == 200, "the job's server answers from outside the job")
    wait_until(lambda: all(pids_with(f"sleep {n}") for n in names.values()), "every child started")
    cluster.run(["scancel", job])
    cluster.wait_state(job, ["CANCELLED"], timeout_s=15)
    time.sleep(1.0)
    survivors = {name for name, n in names.items() if pids_with(f"sleep {n}")}
    for n in names.values():
        for pid in pids_with(f"sleep {n}"):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    assert survivors == SURVIVORS[cluster.proctrack], cluster.proctrack
    assert http_status(port) is None, "the server ended with its job"
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        pytest.fail("the server's port still accepts connections")


def test_a_server_the_script_execs_ends_with_scancel(cluster: SlurmCluster) -> None:
    port = free_ports(1)[0]
    job = cluster.sbatch("-o", "/dev/null", "--wrap", f"exec python3 -m http.server --bind 127.0.0.1 {port}")
    cluster.wait_state(job, ["RUNNING"])
    wait_until(lambda: http_status(port) == 200, "the exec'd server answers")
    cluster.run(["scancel", job])
    assert cluster.wait_state(job, ["CANCELLED"], timeout_s=15)["ExitCode"] == "0:15"
    wait_until(lambda: not pids_with(f"127.0.0.1 {port}"), "the server gone", timeout_s=5)


def test_a_server_left_behind_by_a_finished_script(cluster: SlurmCluster) -> None:
    """The script exits 0 with its server still in the background: COMPLETED, and the server is ended with
    the job except under linuxproc (where it keeps running: the lab's script must wait for its server)."""
    port = free_ports(1)[0]
    job = cluster.sbatch(
        "-o", "/dev/null", "--wrap", f"python3 -m http.server --bind 127.0.0.1 {port} >/dev/null 2>&1 & sleep 2"
    )
    assert cluster.wait_state(job, ["COMPLETED", "FAILED"])["JobState"] == "COMPLETED"
    time.sleep(4.0)  # pgid ends it ~3 s after the script
    left = pids_with(f"127.0.0.1 {port}")
    for pid in left:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    assert bool(left) == (cluster.proctrack == "linuxproc"), cluster.proctrack


# ---- two nodes -----------------------------------------------------------------------------------------


def test_two_nodes_run_one_job_with_a_step_on_each(two_nodes: SlurmCluster) -> None:
    two_nodes.wait_idle()
    assert two_nodes.node_states() == {"n1": "idle", "n2": "idle"}
    out = two_nodes.directory / "two.out"
    job = two_nodes.sbatch(
        "-N",
        "2",
        "--gres=gpu:8",
        "-o",
        str(out),
        "--wrap",
        'echo "list=$SLURM_JOB_NODELIST"; srun -N 2 -l bash -c \'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\'',
    )
    fields = two_nodes.wait_state(job, ["COMPLETED", "FAILED"], timeout_s=30)
    assert (fields["JobState"], fields["NodeList"], fields["BatchHost"]) == ("COMPLETED", "n[1-2]", "n1")
    lines = sorted(out.read_text().split("\n"))
    assert [line for line in lines if line] == ["0: n1 0,1,2,3,4,5,6,7", "1: n2 0,1,2,3,4,5,6,7", "list=n[1-2]"]


# ---- reached through a login host ----------------------------------------------------------------------


def test_sbatch_over_the_loopback_sshd(cluster: SlurmCluster, sshd: SSHD) -> None:
    """The login host is the loopback sshd: SLURM_CONF in the remote command's environment."""
    host = sshd.connect()
    try:
        conf = cluster.env["SLURM_CONF"]
        out = cluster.directory / "ssh.out"
        submitted = host.run(
            f"SLURM_CONF={conf} sbatch --parsable -o {out} --gres=gpu:2 --wrap 'echo $CUDA_VISIBLE_DEVICES'",
            timeout_s=30,
        ).check()
        job = submitted.stdout.strip()
        assert job.isdigit()
        cluster.wait_state(job, ["COMPLETED"])
        shown = host.run(f"SLURM_CONF={conf} scontrol show job -o {job}", timeout_s=30).check()
        assert " JobState=COMPLETED " in shown.stdout
        assert out.read_text().strip() == "0,1"
    finally:
        host.close()
