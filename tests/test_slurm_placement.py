"""Slurm placements and job records without a cluster: the options a job is submitted with, what a notebook
parameter reads as, and how ``scontrol``'s words become states, times and exit statuses."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dsv4lab.config.launch_script import render_launch_script
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.config.vllm_config import VllmConfig
from dsv4lab.engines import get_engine
from dsv4lab.errors import ConfigError, UnknownNameError
from dsv4lab.hosts import LocalHost
from dsv4lab.serving.launch import submit_job
from dsv4lab.serving.slurm import FIRST_NODE, SlurmJob, SlurmPlacement, node_dir, parse_fields, render_nodes_batch
from dsv4lab.serving.slurm import _minutes as minutes


def test_the_job_shape_becomes_sbatch_options_with_the_users_last() -> None:
    p = SlurmPlacement("gpu", 8, 10, account="lab", qos="high", sbatch_args=("--exclusive",))
    opts = p.sbatch_options("/runs/a", "dsv4lab-a")
    assert opts[:6] == [
        "--parsable",
        "--job-name=dsv4lab-a",
        "--chdir=/runs/a",
        "--output=/runs/a/slurm-%j.out",
        "--nodes=1",
        "--time=10",
    ]
    assert "--gres=gpu:8" in opts and "--partition=gpu" in opts and "--account=lab" in opts
    assert opts[-1] == "--exclusive"
    assert p.words() == "partition gpu: 1 node x 8 GPUs, 10 min"
    assert "--gres=gpu:0" not in SlurmPlacement("cpu", 0, 5).sbatch_options("/r", "j")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"gpus_per_node": -1}, "--slurm-gpus=-1 is not valid: a whole number >= 0"),
        ({"time_min": 0}, "--slurm-time=0 is not valid: a whole number >= 1"),
        ({"nodes": 0}, "--slurm-nodes=0 is not valid"),
        ({"partition": "gpu; rm -rf /"}, "--slurm-partition='gpu; rm -rf /' is not valid: a Slurm name"),
        ({"sbatch_args": ("exclusive",)}, "--sbatch-arg='exclusive' is not valid: an sbatch option"),
    ],
)
def test_a_bad_placement_is_refused_by_name(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        SlurmPlacement(**kwargs)  # type: ignore[arg-type]
    assert says in str(exc.value)


def test_a_notebook_parameter_reads_as_a_placement_and_back() -> None:
    assert SlurmPlacement.parse("") is None
    p = SlurmPlacement.parse("partition:gpu,time_min:30,sbatch_args=--exclusive --mem=8G")
    assert p == SlurmPlacement("gpu", 8, 30, sbatch_args=("--exclusive", "--mem=8G"))
    assert SlurmPlacement.parse(p.to_text()) == p
    with pytest.raises(UnknownNameError, match="did you mean 'partition'"):
        SlurmPlacement.parse("partiton=gpu")
    with pytest.raises(ConfigError, match="a whole number"):
        SlurmPlacement.parse("time_min=ten")


def test_scontrol_words_become_times_states_and_exit_statuses() -> None:
    line = (
        "JobId=12 JobName=dsv4lab-a UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
        "ExitCode=0:9 TimeLimit=00:01:00 SubmitTime=2026-12-02T04:00:00 StartTime=2026-12-02T04:00:03 "
        "Partition=short NodeList=localhost Command=/runs/a/launch.sh"
    )
    f = parse_fields(line)
    assert (f["JobState"], f["Reason"], f["ExitCode"], f["Command"]) == (
        "TIMEOUT",
        "TimeLimit",
        "0:9",
        "/runs/a/launch.sh",
    )
    assert [minutes(t) for t in ("00:01:00", "1-00:00:00", "00:00:05", "UNLIMITED")] == [1, 1440, 1, None]
    job = SlurmJob("12", "TIMEOUT", "TimeLimit", exit_code="0:9", submit_time=100.0, start_time=103.0, time_limit_min=1)
    assert not job.active and job.queued_s == 3.0 and job.exit_status() == 137
    assert job.end_words() == (
        "the Slurm job reached its time limit and Slurm ended it (1 min) "
        "(Slurm job 12: TIMEOUT, Reason=TimeLimit, ExitCode=0:9)"
    )
    assert SlurmJob("13", "FAILED", exit_code="3:0").exit_status() == 3
    pending = SlurmJob("14", "PENDING", "Resources", submit_time=100.0)
    assert pending.active and pending.pending and pending.queued_s is None
    assert pending.reason_words() == "Resources (waiting for GPUs or nodes to free up)"


def test_a_sweep_says_what_placement_it_held_in_words() -> None:
    from dsv4lab.notebook.sweeps import held_text

    placement = SlurmPlacement("gpu", 8, 10, slurm_conf="/etc/slurm/slurm.conf")
    assert held_text({"preset": "config_b", "slurm": placement.to_text()}) == (
        "preset=config_b, slurm=partition gpu: 1 node x 8 GPUs, 10 min"
    )


# -- a server spanning several nodes as one job -------------------------------------------------------------------


def test_a_server_on_two_nodes_is_one_srun_step_with_the_first_node_as_its_dist_init_host(tmp_path: Path) -> None:
    """The batch script starts every node's launch script in one step (so scancel and the time limit end them
    all, and one node's death ends the others), and each node's launch line reads the dist-init host on the node."""
    run_dir = str(tmp_path / "a run")
    batch = render_nodes_batch(run_dir, 2, version="test")
    assert subprocess.run(["bash", "-n"], input=batch, text=True, check=False).returncode == 0
    assert f"RUN_DIR={shlex.quote(run_dir)}" in batch
    assert "exec srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in batch
    assert '"$1/node$SLURM_NODEID/launch.sh"' in batch
    assert "--ntasks-per-node=1" in SlurmPlacement("gpu", 8, 10, nodes=2).sbatch_options("/r", "j")
    assert "--ntasks-per-node=1" not in SlurmPlacement("gpu", 8, 10).sbatch_options("/r", "j")

    config = ServerConfig(
        model_path="dsv4lab/tiny-moe", tp=2, nnodes=2, node_rank=1, dist_init_addr=f"{FIRST_NODE}:5000"
    )
    script = render_launch_script(
        config,
        run_dir=node_dir(run_dir, 1),
        runtime_words={f"{FIRST_NODE}:5000": '"$DSV4LAB_DIST_INIT_HOST":5000'},
    )
    assert '--nnodes 2 --node-rank 1 --dist-init-addr "$DSV4LAB_DIST_INIT_HOST":5000 >>' in script
    assert FIRST_NODE not in script
    assert node_dir(run_dir, 1) == f"{run_dir}/node1"


@pytest.mark.parametrize(
    ("engine", "config", "nodes", "says"),
    [
        (
            "vllm",
            VllmConfig("/models/tiny"),
            2,
            "--slurm-nodes=2 is not valid: 1 for vllm: a server spanning several nodes as one job is SGLang's",
        ),
        (
            "twin",
            ServerConfig(model_path="dsv4lab/tiny-moe", tp=2),
            2,
            "--slurm-nodes=2 is not valid: 1, the config's nnodes: a server on N nodes is one job of N nodes "
            "(set nnodes=2",
        ),
        (
            "twin",
            ServerConfig(model_path="dsv4lab/tiny-moe", tp=2, nnodes=2, dist_init_addr="head:5000"),
            1,
            "--slurm-nodes=1 is not valid: 2, the config's nnodes",
        ),
    ],
)
def test_a_job_whose_nodes_do_not_match_the_server_is_refused_before_slurm_is_asked(
    tmp_path: Path, engine: str, config: Any, nodes: int, says: str
) -> None:
    """Refused before any Slurm command runs (no Slurm is needed here) and before the run dir is made."""
    run_dir = tmp_path / "never"
    placement = SlurmPlacement("gpu", 8, 10, nodes=nodes, slurm_conf=str(tmp_path / "no-such-slurm.conf"))
    with pytest.raises(ConfigError) as info:
        submit_job(
            LocalHost(), config, str(run_dir), placement, engine=get_engine(engine), version="", python="python3"
        )
    assert says in str(info.value)
    assert not run_dir.exists()
