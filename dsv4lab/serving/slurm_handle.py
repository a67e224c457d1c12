"""A server launched as a Slurm batch job: its handle reads the job's state, and stopping it is ``scancel``.

The launch script is the job's batch script, so the server is a child of the job's own step and ends with
it under every process tracking (nothing is detached out of Slurm's reach). The login host may not see the
node's processes, so whether the server lives is the job's state (and the exit files the script writes into
the run dir), never a PID.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field

from dsv4lab.errors import DSV4LabError, SchedulerError
from dsv4lab.hosts import KillReport, PortForward
from dsv4lab.rundir import RunLayout
from dsv4lab.serving.handle import ServerHandle
from dsv4lab.serving.ports import release_port
from dsv4lab.serving.slurm import ACTIVE_STATES, Slurm, SlurmJob, SlurmPlacement, node_dir

__all__ = ["JobStopReport", "SlurmServerHandle"]

#: How long a job's state is reused before Slurm is asked again (a watch asks twice per look).
_JOB_CACHE_S = 0.25

#: How long a watch that saw the server end waits for its job to reach an end state (KillWait and the
#: epilog come between).
_END_SETTLE_S = 15.0

#: How long ``stop()`` waits past the grace for a cancelled job to leave its active states.
_CANCEL_WAIT_S = 60.0


@dataclass(frozen=True)
class JobStopReport(KillReport):
    """What ``scancel`` did: the job's state before and after, and how long it took to be gone."""

    job_id: str = ""
    before: str = ""
    after: str = ""
    waited_s: float = 0.0

    def __str__(self) -> str:
        if self.before not in ACTIVE_STATES:
            return f"Slurm job {self.job_id}: nothing was running ({self.before})"
        return f"Slurm job {self.job_id}: cancelled ({self.before} → {self.after} in {self.waited_s:.1f} s)"


@dataclass
class SlurmServerHandle(ServerHandle):
    """A launch submitted to Slurm: ``job_id`` and the ``placement`` it asked for."""

    job_id: str = ""
    placement: SlurmPlacement = field(default_factory=SlurmPlacement)
    _cached: tuple[float, SlurmJob] | None = field(default=None, repr=False, compare=False)
    _address: str | None = field(default=None, repr=False, compare=False)

    @property
    def layout(self) -> RunLayout:
        """Node 0's files on a job of several nodes (it serves the API); the run dir's on one node."""
        return RunLayout(node_dir(self.run_dir, 0) if self.placement.nodes > 1 else self.run_dir)

    @property
    def slurm(self) -> Slurm:
        return Slurm(self.host, slurm_conf=self.placement.slurm_conf)

    def job(self, *, fresh: bool = False) -> SlurmJob:
        """The job as Slurm tells it now (reused for a quarter of a second unless ``fresh``)."""
        now = time.monotonic()
        if not fresh and self._cached is not None and now - self._cached[0] < _JOB_CACHE_S:
            return self._cached[1]
        job = self.slurm.job(self.job_id)
        self._cached = (now, job)
        return job

    def is_alive(self) -> bool:
        return self.job().active

    def running(self, server_pid: int | None) -> bool:
        # The script writes server.exit when the server ends; the job may still be COMPLETING then.
        return self.job().running and self.host.read_text(self.layout.server_exit) is None

    def waiting(self) -> SlurmJob | None:
        job = self.job()
        return job if job.pending else None

    def end_words(self, *, settle_s: float = _END_SETTLE_S) -> str | None:
        # The server ends before its job does: Slurm's SIGTERM reaches the script and the server at once,
        # and the job reads RUNNING/COMPLETING until its last process is gone. Its end state is the evidence.
        deadline = time.monotonic() + settle_s
        job = self.job(fresh=True)
        while job.active and time.monotonic() < deadline:
            time.sleep(0.2)
            job = self.job(fresh=True)
        if job.active or job.state == "GONE":
            return None
        return job.end_words()

    def exit_status(self) -> int | None:
        status = super().exit_status()
        if status is not None:
            return status
        job = self.job()
        return None if job.active else job.exit_status()

    def node_address(self) -> str:
        """Where the login host reaches the server: its node's address (asked once the job runs)."""
        if self._address is None:
            nodes = self.job().nodes
            if not nodes:
                raise SchedulerError(f"Slurm job {self.job_id} has no node yet ({self.job().state})")
            self._address = self.slurm.node_address(nodes[0])
        return self._address

    def forward(self) -> PortForward:
        return self.host.forward(self.port, address=self.node_address())

    def owns_port(self, *, timeout_s: float = 15.0) -> bool | None:
        return None  # the node's listeners are not the login host's to list

    def stop(self, *, grace_s: float = 10.0) -> KillReport:
        """``scancel``, and return once the job has left its active states (Slurm has ended its processes:
        SIGTERM, then SIGKILL after the cluster's ``KillWait``)."""
        before = self.job(fresh=True)
        started = time.monotonic()
        if not before.active:
            self._release_port()
            return JobStopReport(0, job_id=self.job_id, before=before.state, after=before.state)
        marker = {"stopped_at": time.time(), "job_id": self.job_id}
        with contextlib.suppress(DSV4LabError):  # the cancel matters more than the marker
            self.host.put_text(self.layout.stopped, json.dumps(marker) + "\n", mode=0o600)
        self.slurm.cancel(self.job_id)
        after = self.slurm.wait_gone(self.job_id, timeout_s=grace_s + _CANCEL_WAIT_S)
        self._cached = None
        if after.active:
            raise SchedulerError(
                f"Slurm job {self.job_id} is still {after.state} {grace_s + _CANCEL_WAIT_S:g} s after scancel; "
                f"ask the cluster's admins (scontrol show job {self.job_id})"
            )
        self._release_port()
        return JobStopReport(
            0, job_id=self.job_id, before=before.state, after=after.state, waited_s=time.monotonic() - started
        )

    def reap(self, *, grace_s: float = 5.0) -> KillReport | None:
        return None  # Slurm ends a job's processes with the job

    def end_crashed(self, *, wait_s: float = 3.0, grace_s: float = 5.0) -> KillReport | None:
        deadline = time.monotonic() + wait_s
        while self.job(fresh=True).active:
            if time.monotonic() >= deadline:
                self.slurm.cancel(self.job_id)
                after = self.slurm.wait_gone(self.job_id, timeout_s=grace_s + _CANCEL_WAIT_S)
                if not after.active:
                    self._release_port()
                return JobStopReport(0, job_id=self.job_id, before="RUNNING", after=after.state)
            time.sleep(0.2)
        self._release_port()
        return None

    def _release_port(self) -> None:
        """The job has ended: its port reservation goes now, not when someone next asks Slurm about it."""
        with contextlib.suppress(DSV4LabError):  # a reservation left behind only costs a later pick one squeue
            release_port(self.host, self.config.port, self.run_dir)

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        job = self.job()
        facts: list[tuple[str, object]] = [
            ("host", f"{self.host.name} ({self.target}, {self.engine.release_words(self.version)})"),
            ("Slurm job", f"{self.job_id}: {job.state}" + (f" ({job.reason_words()})" if job.pending else "")),
            ("placement", self.placement.words()),
            ("port", str(self.port)),
            ("run dir", self.run_dir),
        ]
        return hv.card("server submitted to Slurm", hv.kv_table(facts))
