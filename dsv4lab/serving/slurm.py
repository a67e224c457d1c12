"""Slurm as a placement: a launch submitted as a batch job through a login host, and the job's state read back.

Slurm does the placement, queueing, GPU allocation and time limits; dsv4lab only asks it. Everything goes
through the Slurm commands on the login host (``sbatch``, ``scontrol``, ``scancel``, ``sinfo``), because those
are the interface every cluster has: PyPI's ``pyslurm`` is tied to one Slurm release and ``submitit`` cannot
read job states without ``sacct`` (which needs slurmdbd, often absent on small clusters). Job states come from
``scontrol show job``, which holds a finished job for ``MinJobAge`` seconds; after that a job reads as gone.

A job that can never run is refused before ``sbatch``: by default Slurm accepts a job over a partition's
time limit and leaves it pending forever (``Reason=PartitionTimeLimit``), which a user would only learn
from a queue that never moves.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError, SchedulerError, UnknownNameError
from dsv4lab.hosts import Host

__all__ = [
    "ACTIVE_STATES",
    "PENDING_STATES",
    "Slurm",
    "SlurmJob",
    "SlurmPlacement",
    "node_dir",
    "parse_fields",
    "render_nodes_batch",
]

#: Job states before the job runs: it waits in the queue (or for its nodes to boot).
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"})
#: Job states in which the job still holds (or waits for) its allocation: queued, running or ending.
ACTIVE_STATES = PENDING_STATES | {"RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}

#: What each end state says about the server, for the verdict (Slurm's words are kept beside them).
END_WORDS: Mapping[str, str] = {
    "COMPLETED": "the Slurm job completed (its batch script exited 0)",
    "FAILED": "the Slurm job failed",
    "CANCELLED": "the Slurm job was cancelled",
    "TIMEOUT": "the Slurm job reached its time limit and Slurm ended it",
    "NODE_FAIL": "the node running the Slurm job failed",
    "PREEMPTED": "the Slurm job was preempted by a higher-priority job",
    "OUT_OF_MEMORY": "the Slurm job ran out of the memory it was allocated",
    "BOOT_FAIL": "the Slurm job's node failed to boot",
    "DEADLINE": "the Slurm job reached its deadline before it could run",
}

#: What a pending job's reason means, for the progress line and the QUEUED verdict.
REASON_WORDS: Mapping[str, str] = {
    "Resources": "waiting for GPUs or nodes to free up",
    "Priority": "other jobs come first",
    "JobHeldUser": "held by its user (scontrol release JOBID)",
    "JobHeldAdmin": "held by an administrator",
    "PartitionTimeLimit": "its time limit is over the partition's: it will never start",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows: it will never start",
    "PartitionDown": "the partition is down",
    "ReqNodeNotAvail": "a node it needs is not available",
    "QOSMaxJobsPerUserLimit": "the QoS allows no more running jobs for this user",
    "BeginTime": "its start time has not come",
    "Dependency": "waiting for a job it depends on",
    "None": "being scheduled",
}

#: ``Key=value`` in ``scontrol show ... -o`` (a value runs to the next `` Key=``).
_FIELD = re.compile(r"(\S+?)=(.*?)(?= \S+?=|$)")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_GRES_GPU = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


def parse_fields(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` record as a dict (the first of a repeated key wins)."""
    out: dict[str, str] = {}
    for key, value in _FIELD.findall(line.strip()):
        out.setdefault(key, value)
    return out


def _epoch(text: str | None) -> float | None:
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _minutes(text: str) -> int | None:
    """Slurm's ``[days-]hours:minutes:seconds`` (or ``UNLIMITED``/``INFINITE``) as whole minutes; None = no limit."""
    if text in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        days = int(d)
    parts = [int(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts[-3:]
    return days * 1440 + h * 60 + m + (1 if s else 0)


def _optional_name(flag: str, value: str | None) -> None:
    if value is not None and not _NAME.match(value):
        raise ConfigError(flag, value, "a Slurm name: letters, digits, '_', '.' or '-'")


@dataclass(frozen=True)
class SlurmPlacement:
    """Where and how a launch runs on a Slurm cluster: the job's shape, as ``sbatch`` options.

    ``time_min`` is whole minutes (Slurm rounds any shorter limit up to one). ``sbatch_args`` are passed
    as given, after dsv4lab's own options (so they can override them); ``slurm_conf`` is exported as
    ``SLURM_CONF`` to the Slurm commands on the login host (a private cluster's config). With ``nodes`` above
    1 the server spans that many nodes as one job (SGLang's ``nnodes``); ``port_step`` shifts node K's HTTP
    port by K x step, which only matters where several Slurm nodes are one machine (a rehearsal).
    """

    partition: str | None = None
    gpus_per_node: int = 8
    time_min: int = 60
    nodes: int = 1
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    sbatch_args: tuple[str, ...] = ()
    slurm_conf: str | None = None
    port_step: int = 0

    def __post_init__(self) -> None:
        for flag, value, least in (
            ("--slurm-gpus", self.gpus_per_node, 0),
            ("--slurm-time", self.time_min, 1),
            ("--slurm-nodes", self.nodes, 1),
            ("slurm port_step", self.port_step, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(flag, value, f"a whole number >= {least}")
        _optional_name("--slurm-partition", self.partition)
        _optional_name("--slurm-account", self.account)
        _optional_name("--slurm-qos", self.qos)
        object.__setattr__(self, "sbatch_args", tuple(str(a) for a in self.sbatch_args))
        for arg in self.sbatch_args:
            if not arg.startswith("-"):
                raise ConfigError("--sbatch-arg", arg, "an sbatch option such as --mem=64G or --exclusive")

    def sbatch_options(self, run_dir: str, job_name: str) -> list[str]:
        """The ``sbatch`` options of this placement for a launch into ``run_dir`` (the job's output there)."""
        opts = [
            "--parsable",
            f"--job-name={job_name}",
            f"--chdir={run_dir}",
            f"--output={run_dir}/slurm-%j.out",
            f"--nodes={self.nodes}",
            f"--time={self.time_min}",
        ]
        if self.nodes > 1:  # one srun task per node runs that node's launch script
            opts.append("--ntasks-per-node=1")
        if self.gpus_per_node:
            opts.append(f"--gres=gpu:{self.gpus_per_node}")
        for flag, value in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--constraint", self.constraint),
        ):
            if value:
                opts.append(f"{flag}={value}")
        return [*opts, *self.sbatch_args]

    def words(self) -> str:
        """``partition gpu: 1 node x 8 GPUs, 10 min``."""
        where = f"partition {self.partition}" if self.partition else "the default partition"
        return (
            f"{where}: {plural(self.nodes, 'node')} x {plural(self.gpus_per_node, 'GPU')}, "
            f"{plural(self.time_min, 'min', 'min')}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "gpus_per_node": self.gpus_per_node,
            "time_min": self.time_min,
            "nodes": self.nodes,
            "account": self.account,
            "qos": self.qos,
            "constraint": self.constraint,
            "sbatch_args": list(self.sbatch_args),
            "slurm_conf": self.slurm_conf,
            "port_step": self.port_step,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlurmPlacement:
        unknown = [k for k in data if k not in cls.__dataclass_fields__]
        if unknown:
            raise UnknownNameError("Slurm placement field", unknown[0], list(cls.__dataclass_fields__))
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["sbatch_args"] = tuple(known.get("sbatch_args") or ())
        return cls(**known)

    @classmethod
    def parse(cls, text: str) -> SlurmPlacement | None:
        """A placement from a notebook parameter: ``partition=gpu,gpus_per_node=8,time_min=30`` (``:`` for ``=``
        too; ``sbatch_args`` separated by spaces), or its JSON object; empty text is None (no Slurm)."""
        import json

        text = text.strip()
        if not text:
            return None
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise ConfigError("slurm", text, f"key=value pairs or a JSON object ({exc})") from None
            if not isinstance(data, dict):
                raise ConfigError("slurm", text, "key=value pairs or a JSON object")
            return cls.from_dict(data)
        values: dict[str, Any] = {}
        for item in (part.strip() for part in text.split(",")):
            key, eq, value = item.partition("=" if "=" in item else ":")
            if not eq or not key.strip():
                raise ConfigError("slurm", text, "key=value pairs, e.g. partition=gpu,gpus_per_node=8,time_min=30")
            key = key.strip()
            if key in ("gpus_per_node", "time_min", "nodes", "port_step"):
                if not value.strip().isdigit():
                    raise ConfigError(f"slurm {key}", value, "a whole number")
                values[key] = int(value)
            elif key == "sbatch_args":
                values[key] = tuple(value.split())
            else:
                values[key] = value.strip() or None
        return cls.from_dict(values)

    def to_text(self) -> str:
        """The form :meth:`parse` reads (what a sweep passes its notebooks)."""
        import json

        return json.dumps({k: v for k, v in self.to_dict().items() if v not in (None, [])}, sort_keys=True)


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``scontrol show job`` tells it now (``state`` ``GONE`` once Slurm has forgotten it)."""

    job_id: str
    state: str
    reason: str = "None"
    node_list: str = ""
    nodes: tuple[str, ...] = ()
    exit_code: str = ""
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    time_limit_min: int | None = None
    partition: str = ""
    fields: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def queued_s(self) -> float | None:
        """Seconds from submission to start (by the controller's clock); None before the start."""
        if self.submit_time is None or self.start_time is None or self.pending:
            return None
        return max(0.0, self.start_time - self.submit_time)

    def exit_status(self) -> int | None:
        """The batch script's status as a shell tells it: ``ExitCode=a:s`` is 128+s when a signal ended it."""
        code, _, sig = self.exit_code.partition(":")
        if not code.isdigit():
            return None
        return 128 + int(sig) if sig.isdigit() and int(sig) else int(code)

    def reason_words(self) -> str:
        """``Resources (waiting for GPUs or nodes to free up)``."""
        meaning = REASON_WORDS.get(self.reason)
        return f"{self.reason} ({meaning})" if meaning else self.reason

    def end_words(self) -> str:
        """How the job ended, in Slurm's words and ours: ``the Slurm job reached its time limit ... (Slurm job
        12: TIMEOUT, Reason=TimeLimit, ExitCode=0:9)``."""
        said = END_WORDS.get(self.state, f"the Slurm job ended {self.state}")
        if self.state == "TIMEOUT" and self.time_limit_min:
            said += f" ({plural(self.time_limit_min, 'min', 'min')})"
        return f"{said} (Slurm job {self.job_id}: {self.evidence()})"

    def evidence(self) -> str:
        return f"{self.state}, Reason={self.reason}, ExitCode={self.exit_code or '?'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "nodes": list(self.nodes),
            "exit_code": self.exit_code,
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "queued_s": self.queued_s,
            "time_limit_min": self.time_limit_min,
            "partition": self.partition,
        }


@dataclass(frozen=True)
class _Partition:
    name: str
    state: str
    max_time_min: int | None
    max_nodes: int | None
    nodes: tuple[str, ...]
    default: bool


class Slurm:
    """The Slurm commands on one login host (``SLURM_CONF`` exported to them when the placement names one)."""

    def __init__(self, host: Host, *, slurm_conf: str | None = None, timeout_s: float = 30.0) -> None:
        self.host = host
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return ["env", f"SLURM_CONF={self.slurm_conf}", *argv] if self.slurm_conf else list(argv)

    def run(self, argv: Sequence[str], *, check: bool = True) -> str:
        """A Slurm command's output; a missing command or an unreachable controller is a :class:`SchedulerError`."""
        result = self.host.run(self._argv(argv), timeout_s=self.timeout_s)
        if result.exit_status == 127:
            raise SchedulerError(
                f"{argv[0]} was not found on {self.host.name}: Slurm's client commands are not installed there "
                "(a Slurm placement needs a login host where sbatch, scontrol and scancel run)"
            )
        text = (result.stderr or "").strip()
        if "Unable to contact slurm controller" in text or "Zero Bytes were transmitted" in text:
            conf = f" (SLURM_CONF={self.slurm_conf})" if self.slurm_conf else ""
            raise SchedulerError(
                f"the Slurm controller cannot be reached from {self.host.name}{conf}: {text.splitlines()[-1]}"
            )
        if check:
            result.check()
        return result.stdout

    # -- before submit -------------------------------------------------------------------------------------

    def _partitions(self) -> list[_Partition]:
        out = self.run(["scontrol", "show", "partition", "-o"])
        parts = []
        for line in out.splitlines():
            f = parse_fields(line)
            if "PartitionName" not in f:
                continue
            max_nodes = f.get("MaxNodes", "UNLIMITED")
            parts.append(
                _Partition(
                    f["PartitionName"],
                    f.get("State", "UP"),
                    _minutes(f.get("MaxTime", "UNLIMITED")),
                    int(max_nodes) if max_nodes.isdigit() else None,
                    tuple(self.hostnames(f.get("Nodes", ""))),
                    f.get("Default") == "YES",
                )
            )
        return parts

    def hostnames(self, node_list: str) -> list[str]:
        """``n[1-2]`` as ``["n1", "n2"]`` (Slurm's own expansion)."""
        if not node_list or node_list in ("(null)", "None"):
            return []
        if node_list == "ALL":
            out = self.run(["sinfo", "-h", "-N", "-o", "%N"])
            return sorted(set(out.split()))
        return self.run(["scontrol", "show", "hostnames", node_list]).split()

    def node_gpus(self) -> dict[str, int]:
        """GPUs per node, from each node's ``Gres`` (0 where it has none)."""
        out = self.run(["scontrol", "show", "node", "-o"])
        gpus: dict[str, int] = {}
        for line in out.splitlines():
            f = parse_fields(line)
            if "NodeName" in f:
                gpus[f["NodeName"]] = sum(int(n) for n in _GRES_GPU.findall(f.get("Gres", "")))
        return gpus

    def check(self, placement: SlurmPlacement, *, gpus_needed: int | None = None) -> str:
        """Refuse, before ``sbatch``, a job that could never run; returns the partition the job goes to.

        Checked against what the cluster says now: the partition exists and is up, the time limit is within
        its ``MaxTime``, it has the nodes, and each of them the GPUs asked for; and the server needs no more
        GPUs per node than the job asks for.
        """
        parts = self._partitions()
        if not parts:
            raise SchedulerError(f"the Slurm cluster seen from {self.host.name} has no partitions")
        if placement.partition is None:
            default = next((p for p in parts if p.default), None)
            if default is None:
                raise ConfigError(
                    "--slurm-partition", None, "a partition name: this cluster has no default partition", detail=""
                )
            part = default
        else:
            found = next((p for p in parts if p.name == placement.partition), None)
            if found is None:
                raise UnknownNameError(
                    "Slurm partition", placement.partition, [p.name for p in parts], field="--slurm-partition"
                )
            part = found
        if part.state != "UP":
            raise SchedulerError(f"Slurm partition {part.name} is {part.state}, not UP: no job starts there now")
        if part.max_time_min is not None and placement.time_min > part.max_time_min:
            raise ConfigError(
                "--slurm-time",
                placement.time_min,
                f"at most {part.max_time_min} min: partition {part.name}'s MaxTime "
                f"(a longer job would pend forever with Reason=PartitionTimeLimit)",
            )
        available = len(part.nodes)
        if part.max_nodes is not None:
            available = min(available, part.max_nodes)
        if placement.nodes > available:
            raise ConfigError(
                "--slurm-nodes", placement.nodes, f"at most {available}: partition {part.name} has {available}"
            )
        gpus = self.node_gpus()
        in_part = sorted((gpus.get(n, 0) for n in part.nodes), reverse=True)
        enough = [g for g in in_part if g >= placement.gpus_per_node]
        if len(enough) < placement.nodes:
            most = in_part[placement.nodes - 1] if len(in_part) >= placement.nodes else 0
            raise ConfigError(
                "--slurm-gpus",
                placement.gpus_per_node,
                f"at most {most}: partition {part.name}'s nodes have "
                + ", ".join(f"{n} gpu:{gpus.get(n, 0)}" for n in part.nodes),
            )
        if gpus_needed is not None and gpus_needed > placement.gpus_per_node:
            raise ConfigError(
                "--slurm-gpus",
                placement.gpus_per_node,
                f"at least {gpus_needed}: the server needs {plural(gpus_needed, 'GPU')} per node "
                "(its tensor- and data-parallel sizes), and a job sees only the GPUs it asks for",
            )
        return part.name

    # -- the job -------------------------------------------------------------------------------------------

    def submit(self, script: str, run_dir: str, placement: SlurmPlacement, *, job_name: str) -> str:
        """Submit ``script`` (a path on the login host) as a batch job; its job id."""
        argv = ["sbatch", *placement.sbatch_options(run_dir, job_name), script]
        result = self.host.run(self._argv(argv), timeout_s=self.timeout_s)
        if result.exit_status == 127:
            self.run(["sbatch", "--version"])  # raises the not-installed error
        if not result.ok:
            said = (result.stderr or result.stdout).strip().splitlines()
            raise SchedulerError(
                f"sbatch refused the job ({placement.words()}): {said[-1] if said else 'no reason given'}; "
                "nothing was submitted"
            )
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SchedulerError(f"sbatch printed {result.stdout.strip()!r}, not a job id")
        return job_id

    def job(self, job_id: str) -> SlurmJob:
        """The job now; state ``GONE`` once the controller no longer knows it (``MinJobAge`` after its end)."""
        result = self.host.run(self._argv(["scontrol", "show", "job", "-o", job_id]), timeout_s=self.timeout_s)
        text = (result.stderr or "") + result.stdout
        if not result.ok or "JobState=" not in result.stdout:
            if "Invalid job id" in text:
                return SlurmJob(job_id, "GONE", reason="the controller no longer lists it")
            self.run(["scontrol", "show", "job", "-o", job_id])  # raises the reachable / installed errors
            raise SchedulerError(f"scontrol show job {job_id} on {self.host.name}: {text.strip()}")
        f = parse_fields(result.stdout.splitlines()[0])
        node_list = f.get("NodeList", "")
        state = f.get("JobState", "UNKNOWN")
        return SlurmJob(
            job_id,
            state,
            f.get("Reason", "None"),
            node_list if node_list != "(null)" else "",
            tuple(self.hostnames(node_list)) if state not in PENDING_STATES else (),
            f.get("ExitCode", ""),
            _epoch(f.get("SubmitTime")),
            _epoch(f.get("StartTime")) if state not in PENDING_STATES else None,
            _epoch(f.get("EndTime")) if state not in ACTIVE_STATES else None,
            _minutes(f.get("TimeLimit", "UNLIMITED")),
            f.get("Partition", ""),
            f,
        )

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def wait_gone(self, job_id: str, *, timeout_s: float) -> SlurmJob:
        """Poll until the job has left every active state (its processes ended); the last state seen."""
        deadline = time.monotonic() + timeout_s
        job = self.job(job_id)
        while job.active and time.monotonic() < deadline:
            time.sleep(0.2)
            job = self.job(job_id)
        return job

    def node_address(self, node: str) -> str:
        """Where the login host reaches ``node`` (its ``NodeAddr``)."""
        out = self.run(["scontrol", "show", "node", "-o", node])
        f = parse_fields(out.splitlines()[0]) if out.strip() else {}
        return f.get("NodeAddr") or f.get("NodeHostName") or node


#: The host part of a multi-node server's dist-init address until the job runs: the batch script puts its first
#: node's address in its place (``DSV4LAB_DIST_INIT_HOST``).
FIRST_NODE = "dsv4lab-slurm-first-node"


def node_dir(run_dir: str, rank: int) -> str:
    """Where node ``rank`` of a multi-node job keeps its launch script, log and exit files."""
    return f"{run_dir.rstrip('/')}/node{rank}"


def render_nodes_batch(run_dir: str, nodes: int, *, version: str) -> str:
    """The batch script of a server spanning ``nodes`` nodes as one job: an ``srun`` step with one task per
    node, each running its own node's launch script (``nodeK/launch.sh``, K the node's index in the job), with
    the job's first node as the dist-init address.

    One step holds every node's server, so ``scancel`` (and the time limit) ends all of them, and
    ``--kill-on-bad-exit`` ends the others when one node's server dies: a multi-node server is whole or gone.
    """
    q = shlex.quote
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# Batch script generated by dsv4lab {version} for a server on {nodes} nodes: one srun task per node",
            "# runs that node's launch script (nodeK/launch.sh); node 0's address is the dist-init address.",
            "set -euo pipefail",
            "umask 077",
            f"RUN_DIR={q(run_dir.rstrip('/'))}",
            'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
            "addr=$(scontrol show node -o \"$first\" 2>/dev/null | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p' \\",
            "  | sed -n 1p) || addr=",
            'export DSV4LAB_DIST_INIT_HOST="${addr:-$first}"',
            f"exec srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
            '  bash -c \'exec bash "$1/node$SLURM_NODEID/launch.sh"\' dsv4lab-node "$RUN_DIR"',
            "",
        ]
    )
