"""A real, private Slurm cluster on this machine for tests: munged, slurmctld and one slurmd per node.

Debian's Slurm 22.05 (``tools/slurm_install.sh``). Everything lives under one folder: the munge key, the
controller's state, the spool, logs, fake GPU device files and the config (munged's socket alone sits in a
short folder of its own under /tmp, see ``munge_socket``). The daemons run in the foreground as children of
this process on private ports chosen free at start, so two clusters can run side by side (two test
workers), and ``stop()`` ends them by PID. Nothing here talks to anything but 127.0.0.1.

Shapes:

- ``SlurmCluster(folder)``: one node ``localhost`` with 8 GRES GPUs and 2 CPUs; partitions ``gpu``
  (default, no time limit) and ``short`` (``MaxTime=1``, the time a partition refuses).
- ``SlurmCluster(folder, nodes=("n1", "n2"))``: two slurmd "nodes" on this machine
  (``NodeHostname=localhost``, a port each, ``%n`` in their paths), 8 GRES GPUs each.

Clients need ``cluster.env`` (``SLURM_CONF``) in their environment; ``cluster.run([...])`` adds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

#: The daemons and client commands a cluster needs (Debian: slurmctld slurmd slurm-client munge).
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")

#: Process tracking choices: ``cgroup`` (cgroup v1 freezer) ends every process of a job, ``setsid`` and
#: double-forked children too; ``pgid`` misses a ``setsid`` child; ``linuxproc`` misses double forks.
PROCTRACKS = ("cgroup", "pgid", "linuxproc")

#: ``Key=value`` in ``scontrol show ... -o`` (a value runs to the next `` Key=``).
_FIELD = re.compile(r"(\S+?)=(.*?)(?= \S+?=|$)")

#: Unix socket paths (slurmstepd's sockets in the spool) must stay under 108 bytes: a longer folder is
#: reached through a short link.
_SHORT_ENOUGH = 48


def find_command(name: str) -> str | None:
    """The path of a Slurm or munge command (daemons live in /usr/sbin, which PATH may lack)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/sbin", "/usr/local/sbin", "/sbin"):
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def slurm_missing() -> list[str]:
    """The commands a private cluster needs that are not installed (empty when all are)."""
    return [name for name in (*DAEMONS, *CLIENTS) if find_command(name) is None]


def slurm_available() -> bool:
    return not slurm_missing() and os.geteuid() == 0


def require_slurm() -> None:
    """Skip (locally) or fail (CI=true) without Slurm and munge, or without root for their daemons."""
    from tests.conftest import require

    missing = slurm_missing()
    require(not missing, f"Slurm and munge (missing: {', '.join(missing)})")
    require(os.geteuid() == 0, "root, for the private Slurm cluster's daemons")


def cgroup_v1_freezer() -> bool:
    """True where ``proctrack/cgroup`` can work as this process: root and a writable cgroup v1 freezer."""
    freezer = Path("/sys/fs/cgroup/freezer")
    return os.geteuid() == 0 and (freezer / "cgroup.procs").exists() and os.access(freezer, os.W_OK)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (all held open at once, so they differ)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


class SlurmError(RuntimeError):
    """The cluster did not start (the message carries the daemons' log tails)."""


class SlurmCluster:
    """A private Slurm cluster under ``directory``; ``start()``/``stop()`` or ``with SlurmCluster(...)``.

    ``proctrack``: ``cgroup`` where a cgroup v1 freezer is writable (as root here), else ``pgid``;
    ``DSV4LAB_SLURM_PROCTRACK`` overrides the choice. ``kill_wait_s``: SIGTERM to SIGKILL at a time limit
    or scancel. ``min_job_age_s``: how long a finished job stays in ``scontrol show job`` / ``squeue
    --json``. ``enforce_part_limits``: ``NO`` (Slurm's default: a job over a partition's limits pends
    forever) or ``ALL`` (refused at submit). ``extra_conf``: more slurm.conf lines.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        nodes: Sequence[str] = ("localhost",),
        gpus_per_node: int = 8,
        cpus_per_node: int = 2,
        memory_mb: int = 16000,
        proctrack: str | None = None,
        kill_wait_s: int = 2,
        min_job_age_s: int = 300,
        enforce_part_limits: str = "NO",
        short_max_time_min: int = 1,
        scheduler_parameters: str = "batch_sched_delay=0",
        extra_conf: Sequence[str] = (),
    ) -> None:
        if proctrack is None:
            proctrack = os.environ.get("DSV4LAB_SLURM_PROCTRACK") or ("cgroup" if cgroup_v1_freezer() else "pgid")
        if proctrack not in PROCTRACKS:
            raise ValueError(f"proctrack must be one of {PROCTRACKS}, not {proctrack!r}")
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        self.directory = Path(directory).resolve()
        self.nodes = tuple(nodes)
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.memory_mb = memory_mb
        self.proctrack = proctrack
        self.kill_wait_s = kill_wait_s
        self.min_job_age_s = min_job_age_s
        self.enforce_part_limits = enforce_part_limits
        self.short_max_time_min = short_max_time_min
        self.scheduler_parameters = scheduler_parameters
        self.extra_conf = tuple(extra_conf)
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._alias: Path | None = None
        self._runtime: Path | None = None
        self._logs: list[IO[bytes]] = []

    # ---- paths -------------------------------------------------------------------------------------------

    @property
    def base(self) -> Path:
        """Where the config points: ``directory`` itself, or a short link to it when its path is long."""
        return self._alias if self._alias is not None else self.directory

    @property
    def munge_socket(self) -> Path:
        """munged's socket, in a short folder of its own under /tmp: munged refuses a socket whose folder
        or any folder above it is not searchable by all (pytest's temporary folders are 0700)."""
        assert self._runtime is not None, "not started"
        return self._runtime / "munge.socket"

    @property
    def conf(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client's environment needs (locally, or in a remote shell: ``SLURM_CONF=... sbatch``)."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with ``env`` on top, and no SLURM_* left over from an outer job."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**base, **self.env, **(extra or {})}

    def log(self, name: str) -> str:
        """A daemon's log so far: ``munged``, ``slurmctld`` or ``slurmd-<node>``."""
        path = self.directory / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- the config --------------------------------------------------------------------------------------

    def _write_config(self) -> None:
        b = self.base
        multi = self.nodes != ("localhost",)
        node_suffix = "%n" if multi else "localhost"
        gpu_files = f"{b}/dev/gpu[0-{self.gpus_per_node - 1}]" if self.gpus_per_node > 1 else f"{b}/dev/gpu0"
        lines = [
            "# A private Slurm 22.05 cluster for tests (tests/slurmcluster.py); all but munged's socket in one folder.",
            "ClusterName=lab",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={b}/state",
            f"SlurmdSpoolDir={b}/spool/{node_suffix}",
            f"SlurmctldPidFile={b}/run/slurmctld.pid",
            f"SlurmdPidFile={b}/run/slurmd-{node_suffix}.pid",
            f"SlurmctldLogFile={b}/log/slurmctld.log",
            f"SlurmdLogFile={b}/log/slurmd-{node_suffix}.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MailProg=/bin/true",
            f"ProctrackType=proctrack/{self.proctrack}",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            # A submitted batch job starts on the controller's next 1 s tick, not after the default 3 s.
            *([f"SchedulerParameters={self.scheduler_parameters}"] if self.scheduler_parameters else []),
            "MpiDefault=none",
            "ReturnToService=2",
            f"MinJobAge={self.min_job_age_s}",
            f"KillWait={self.kill_wait_s}",
            "OverTimeLimit=0",
            f"EnforcePartLimits={self.enforce_part_limits}",
            # Job ids unique among the clusters running now (their cgroups share one freezer tree).
            f"FirstJobId={self.ctld_port * 1000}",
            "GresTypes=gpu",
            *self.extra_conf,
        ]
        shape = (
            f"CPUs={self.cpus_per_node} Sockets=1 CoresPerSocket={self.cpus_per_node} ThreadsPerCore=1 "
            f"RealMemory={self.memory_mb} Gres=gpu:{self.gpus_per_node} State=UNKNOWN"
        )
        gres = ["AutoDetect=off"]
        for node in self.nodes:
            where = f"NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.node_ports[node]}"
            lines.append(f"NodeName={node} {where} {shape}")
            gres.append(f"NodeName={node} Name=gpu File={gpu_files}")
        lines += [
            "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName=short Nodes=ALL MaxTime={self.short_max_time_min} State=UP",
            "",
        ]
        (self.directory / "etc").mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join(lines))
        (self.directory / "etc" / "gres.conf").write_text("\n".join([*gres, ""]))
        (self.directory / "etc" / "cgroup.conf").write_text(
            "\n".join(
                [
                    "CgroupPlugin=cgroup/v1",
                    "CgroupMountpoint=/sys/fs/cgroup",
                    "CgroupAutomount=no",
                    "ConstrainCores=no",
                    "ConstrainRAMSpace=no",
                    "ConstrainDevices=no",
                    "",
                ]
            )
        )

    def _prepare(self) -> None:
        """A clean folder: yesterday's state and spool would bring finished jobs back on restart."""
        for sub in ("state", "spool", "run", "log", "munge", "etc"):
            shutil.rmtree(self.directory / sub, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        # munged refuses a socket folder that is not searchable by all
        os.chmod(self.directory, 0o755)  # noqa: S103 - only root writes here
        for sub in ("state", "run", "log", "dev", *(f"spool/{n}" for n in self.nodes)):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory / "run", 0o755)  # noqa: S103 - as above
        (self.directory / "munge").mkdir(mode=0o700)
        for i in range(self.gpus_per_node):
            link = self.directory / "dev" / f"gpu{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")
        self._runtime = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
        os.chmod(self._runtime, 0o755)  # noqa: S103 - as above
        if len(str(self.directory)) > _SHORT_ENOUGH:
            self._alias = self._runtime / "b"
            self._alias.symlink_to(self.directory)

    # ---- start / stop ------------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.directory / "log" / f"{name}.out").open("wb")
        self._logs.append(log)
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.client_env(), cwd=self.directory
        )

    def _command(self, name: str) -> str:
        path = find_command(name)
        if path is None:
            raise SlurmError(f"{name} is not installed (tools/slurm_install.sh installs Slurm and munge)")
        return path

    def start(self, timeout_s: float = 30.0) -> SlurmCluster:
        """Start munged, slurmctld and the slurmd(s) and wait until every node is idle (about a second).
        Ports are picked free; a start that loses a port race is retried with new ones."""
        last: SlurmError | None = None
        for _ in range(3):
            try:
                self._start_once(timeout_s)
                return self
            except SlurmError as error:
                last = error
                self.stop()
                if "Address already in use" not in str(error):
                    break
        assert last is not None
        raise last

    def _start_once(self, timeout_s: float) -> None:
        if os.geteuid() != 0:
            raise SlurmError("a private Slurm cluster runs its daemons as root (SlurmUser=root)")
        self._prepare()
        ports = free_ports(1 + len(self.nodes))
        self.ctld_port = ports[0]
        self.node_ports = dict(zip(self.nodes, ports[1:], strict=True))
        self._write_config()
        b = self.base
        key = self.directory / "munge" / "munge.key"
        subprocess.run([self._command("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True, timeout=30)
        self._spawn(
            "munged",
            [
                self._command("munged"),
                "-F",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={b}/run/munged.pid",
                f"--log-file={b}/log/munged.log",
                f"--seed-file={b}/munge/munged.seed",
            ],
        )
        self._wait(self.munge_socket.exists, "munged's socket", timeout_s)
        conf = str(self.conf)
        self._spawn("slurmctld", [self._command("slurmctld"), "-D", "-f", conf])
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", [self._command("slurmd"), "-D", "-f", conf, "-N", node])
        self.wait_idle(timeout_s)

    def _dead(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                return name
        return None

    def _tails(self) -> str:
        parts = []
        for path in sorted((self.directory / "log").glob("*")):
            text = path.read_text(errors="replace").strip().splitlines()[-8:]
            if text:
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def _wait(self, check: Callable[[], object], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            dead = self._dead()
            if dead is not None:
                raise SlurmError(f"{dead} exited while waiting for {what}:\n{self._tails()}")
            if time.monotonic() > deadline:
                raise SlurmError(f"{what}: not within {timeout_s:g} s\n{self._tails()}")
            time.sleep(0.05)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo prints it (``idle``, ``mixed``, ``allocated``, ``drained`` ...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=10)
        states: dict[str, str] = {}
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait until every node is idle (no jobs on it, and not down or drained)."""

        seen: dict[str, str] = {}

        def idle() -> bool:
            seen.clear()
            seen.update(self.node_states())
            return all(seen.get(node) == "idle" for node in self.nodes)

        try:
            self._wait(idle, f"nodes {','.join(self.nodes)} idle", timeout_s)
        except SlurmError as exc:
            raise SlurmError(f"{exc}\n--- node states last seen: {seen}") from None

    def run(
        self, argv: Sequence[str], *, check: bool = True, timeout: float = 30, cwd: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (sbatch, squeue, ...) against this cluster; text output. It runs in the
        cluster's folder unless ``cwd`` says otherwise: a job's default working directory (and its
        ``slurm-%j.out``) is where sbatch ran."""
        command = [self._command(argv[0]), *argv[1:]]
        return subprocess.run(
            command,
            env=self.client_env(),
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            cwd=cwd or str(self.directory),
        )

    # ---- jobs --------------------------------------------------------------------------------------------

    def sbatch(self, *args: str, timeout: float = 30) -> str:
        """Submit with ``--parsable`` and return the job id (raises CalledProcessError when refused)."""
        return self.run(["sbatch", "--parsable", *args], timeout=timeout).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, Reason, NodeList, ExitCode ...); empty once the
        record is gone (``MinJobAge`` after the end) or for an id the controller never had."""
        out = self.run(["scontrol", "show", "job", "-o", job_id], check=False).stdout.strip()
        return dict(_FIELD.findall(out)) if out.startswith("JobId=") else {}

    def state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "")

    def wait_state(self, job_id: str, states: Sequence[str], timeout_s: float = 30.0) -> dict[str, str]:
        """Wait until the job is in one of ``states``; its fields then."""
        found: dict[str, str] = {}

        def reached() -> bool:
            found.update(self.job(job_id))
            return found.get("JobState") in states

        try:
            self._wait(reached, f"job {job_id} in {'/'.join(states)}", timeout_s)
        except SlurmError as error:
            last = f"{found.get('JobState')} Reason={found.get('Reason')}"
            raise SlurmError(f"job {job_id} last {last}; {error}") from None
        return found

    def squeue_json(self) -> list[dict[str, object]]:
        """``squeue --json``'s jobs: every job the controller still holds, finished ones too."""
        jobs = json.loads(self.run(["squeue", "--json"]).stdout)["jobs"]
        assert isinstance(jobs, list)
        return jobs

    def active_jobs(self) -> list[str]:
        """Ids of jobs pending, running, suspended or completing (plain ``squeue``'s default)."""
        return self.run(["squeue", "-h", "-o", "%i"]).stdout.split()

    @contextlib.contextmanager
    def for_one_test(self) -> Iterator[SlurmCluster]:
        """The cluster idle when a test starts, and every job it left cancelled (and the nodes idle) after."""
        self.wait_idle()
        try:
            yield self
        finally:
            self.cancel_all()

    def cancel_all(self, timeout_s: float = 45.0) -> None:
        """scancel every job and wait until none is queued or running, and the nodes are idle again."""
        self.run(["scancel", "--user", "root"], check=False)
        self._wait(lambda: not self.active_jobs(), "every job gone after scancel", timeout_s)
        self.wait_idle(timeout_s)

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items() if proc.poll() is None}

    def _uses_folder(self, pid: int) -> bool:
        """True when the process has a file open under this cluster's folder (slurmstepd keeps slurmd's
        log open; it overwrites its own environment with its title, so no marker survives there)."""
        prefix = str(self.directory) + "/"
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fd_dir}/{fd}").startswith(prefix):
                        return True
        return False

    def _job_cgroups(self) -> list[Path]:
        """Under proctrack/cgroup, the freezer cgroups of this cluster's jobs: the nodes' trees are shared
        by every cluster with the same node names, and this one's job ids start at its FirstJobId."""
        if self.proctrack != "cgroup" or not self.ctld_port:
            return []
        first = self.ctld_port * 1000
        found = []
        for node in self.nodes:
            for job_dir in Path(f"/sys/fs/cgroup/freezer/slurm_{node}").glob("uid_*/job_*"):
                if job_dir.name[4:].isdigit() and first <= int(job_dir.name[4:]) < first + 1000:
                    found.append(job_dir)
        return found

    def _job_cgroup_pids(self) -> set[int]:
        """Every process in one of this cluster's job cgroups (setsid and double-forked children too)."""
        pids: set[int] = set()
        for job_dir in self._job_cgroups():
            for procs in job_dir.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(line) for line in procs.read_text().split())
        return pids

    def stray_processes(self) -> list[psutil.Process]:
        """Job processes of this cluster still running: its slurmstepd processes and all below them, and
        (cgroup tracking) whatever is in its jobs' cgroups."""
        found: dict[int, psutil.Process] = {}
        mine = {proc.pid for proc in self.procs.values()}
        for p in psutil.process_iter(["name"]):
            try:
                if p.pid in mine or p.info["name"] != "slurmstepd" or not self._uses_folder(p.pid):
                    continue
                found[p.pid] = p
                for child in p.children(recursive=True):
                    found[child.pid] = child
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        for pid in self._job_cgroup_pids() - mine:
            with contextlib.suppress(psutil.Error):
                found.setdefault(pid, psutil.Process(pid))
        return list(found.values())

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel every job, stop the daemons by PID (slurmd, slurmctld, munged), then end any job process
        still there; remove the short link. Safe to call twice, and after a failed start."""
        live = self.procs.get("slurmctld")
        if live is not None and live.poll() is None:
            with contextlib.suppress(subprocess.SubprocessError, OSError, SlurmError):
                self.run(["scancel", "--quiet", "--user", "root"], check=False, timeout=10)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    queue = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
                    if queue.returncode != 0 or not queue.stdout.strip():
                        break
                    time.sleep(0.1)
        order = [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        for p in self.stray_processes():
            with contextlib.suppress(psutil.Error):
                p.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        for job_dir in self._job_cgroups():  # what a killed slurmstepd left (empty cgroups rmdir cleanly)
            for sub in sorted((d for d in job_dir.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                job_dir.rmdir()
        self.procs.clear()
        for log in self._logs:
            with contextlib.suppress(OSError):
                log.close()
        self._logs.clear()
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)  # the socket, and the link (not what it points to)
            self._runtime = None
            self._alias = None

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        # A forgotten cluster must not outlive the test run (its daemons are our children).
        for proc in getattr(self, "procs", {}).values():
            with contextlib.suppress(OSError):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
