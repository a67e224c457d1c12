"""Start, find again and stop a server (the twin, SGLang or vLLM: see :mod:`dsv4lab.engines`) on a host.

A launch writes everything it needs into one run directory on the host — config, env file, launch
script, and a ``handle.json`` — so that a later notebook, another machine or ``dsv4lab stop`` can
re-attach from the directory alone. Stopping ends the whole process tree: SGLang leaves scheduler and
detokenizer children behind, and a GPU held by an orphan blocks the next launch.
"""

from __future__ import annotations

import contextlib
import functools
import json
import posixpath
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from dsv4lab.config import AnyConfig
from dsv4lab.config.launch_script import render_env_file
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.counts import plural
from dsv4lab.engines import Engine, get_engine
from dsv4lab.errors import ConfigError, HostConnectionError, HostSetupError, LaunchError, StaleServerError
from dsv4lab.hosts import Host, LocalHost
from dsv4lab.resources import __version__
from dsv4lab.rundir import RunLayout
from dsv4lab.serving.handle import HANDLE_FILE, ServerHandle
from dsv4lab.serving.ports import claim_port, pick_port, release_port, reserve_port
from dsv4lab.serving.slurm import FIRST_NODE, Slurm, SlurmPlacement, node_dir, render_nodes_batch
from dsv4lab.serving.slurm_handle import SlurmServerHandle

__all__ = [
    "AnyConfig",
    "LaunchError",
    "ServerHandle",
    "SlurmPlacement",
    "SlurmServerHandle",
    "StaleServerError",
    "attach",
    "check_host",
    "find_listener",
    "launch",
    "launch_nodes",
    "pick_port",
    "release_port",
    "reserve_port",
    "submit_job",
]

T = TypeVar("T")


#: Attempts of an idempotent launch step when the SSH connection drops under it, and the pause before each retry.
_STEP_ATTEMPTS = 3
_STEP_BACKOFF_S = 0.5


def _retry(step: Callable[[], T]) -> T:
    """Run an idempotent launch step; again (up to three times in all) if the SSH connection dropped under it.

    A host re-opens a connection it finds dead before running anything, so only a drop in the middle of a
    step (or a reconnect that failed) gets here; every step but the start itself can simply be done again.
    """
    for attempt in range(1, _STEP_ATTEMPTS + 1):
        try:
            return step()
        except HostConnectionError:
            if attempt == _STEP_ATTEMPTS:
                raise
            time.sleep(_STEP_BACKOFF_S * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


# The launcher of one run dir, found by its PID file or, before it has written that, by its command line:
# what a start whose answer was lost (a dropped connection, the user's Stop) may have left running.
_FIND_LAUNCHER = r"""
script=$1; pidfile=$2; tries=$3
i=0
while [ "$i" -lt "$tries" ]; do
  if [ -s "$pidfile" ]; then cat -- "$pidfile"; exit 0; fi
  found=$(ps -eww -o pid=,args= 2>/dev/null | awk -v want="bash $script" '
    { line = $0; sub(/^ *[0-9]+ /, "", line)
      if (line == want) { sub(/^ */, ""); split($0, a, " "); print a[1]; exit } }')
  if [ -n "$found" ]; then echo "$found"; exit 0; fi
  sleep 0.1
  i=$((i + 1))
done
echo NONE
"""


def _find_launcher(host: Host, layout: RunLayout, *, wait_s: float, timeout_s: float) -> int | None:
    """The PID of the launch script of ``layout`` if it was started (running or already ended), else None."""
    tries = str(max(1, round(wait_s / 0.1)))
    argv = ["bash", "-c", _FIND_LAUNCHER, "dsv4lab-find", layout.script, layout.launcher_pid, tries]
    out = _retry(lambda: host.run(argv, timeout_s=timeout_s).check()).stdout.split()
    return int(out[-1]) if out and out[-1].isdigit() else None


def _start(host: Host, layout: RunLayout, run_dir: str, timeout_s: float) -> int:
    """Start the launch script detached and return its PID — exactly once, even if the connection drops.

    When the answer to the start is lost, the script may or may not be running: look for it (its PID file
    or its command line) and adopt it, or start it if it never began. A Stop in that moment ends whatever
    was started before the interrupt goes on.
    """
    try:
        return _start_once(host, layout, run_dir, timeout_s)
    except BaseException as exc:
        if not isinstance(exc, HostConnectionError):
            with contextlib.suppress(Exception):
                pid = _find_launcher(host, layout, wait_s=0.5, timeout_s=timeout_s)
                if pid is not None:
                    host.kill_tree(pid, grace_s=2.0)
        raise


def _start_once(host: Host, layout: RunLayout, run_dir: str, timeout_s: float) -> int:
    argv = ["bash", layout.script]
    try:
        return host.start_detached(argv, cwd=run_dir, timeout_s=timeout_s)
    except HostConnectionError as exc:
        lost = exc
    for attempt in range(3):
        try:
            pid = _find_launcher(host, layout, wait_s=2.0, timeout_s=timeout_s)
        except HostConnectionError as exc:
            lost = exc
            time.sleep(0.5 * (attempt + 1))
            continue
        return pid if pid is not None else host.start_detached(argv, cwd=run_dir, timeout_s=timeout_s)
    raise HostConnectionError(
        f"the SSH connection to {host.name} dropped while starting the server in {run_dir}, and the host could "
        f"not be asked whether it started ({lost}). It may be running: its PID is in {layout.launcher_pid} on "
        "the host; stop it with `kill -- -PID` there before launching on that port again"
    )


def find_listener(host: Host, port: int, *, timeout_s: float = 15.0) -> tuple[bool, list[int]]:
    """(something listens on ``port`` on the host's loopback, PIDs of the listeners when ``ss`` can tell)."""
    script = (
        'if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then echo LISTEN; fi\n'
        'ss -ltnpH "sport = :$1" 2>/dev/null | grep -o "pid=[0-9]*" | cut -d= -f2 | sort -un || true\n'
    )
    result = host.run(["bash", "-c", script, "dsv4lab-port", str(port)], timeout_s=timeout_s)
    lines = result.stdout.split()
    return ("LISTEN" in lines, [int(x) for x in lines if x.isdigit()])


#: A run dir, private to the user whether it is new or was made before (by a notebook's session, say).
_PRIVATE_DIR = 'mkdir -p -- "$1" && chmod 700 -- "$1"'

# One remote call that checks what a launch needs before anything starts: the interpreter (after the
# user's env files, which often activate a venv), its module, and the tuned kernel-config folder.
_CHECK_HOST = r"""
py=$1; module=$2; kdir=$3; shift 3
for f in "$@"; do
  case "$f" in "~/"*) f="$HOME/${f#\~/}" ;; esac
  [ -r "$f" ] || { echo "NOENVFILE $f"; exit 0; }
  # shellcheck disable=SC1090
  source "$f" >/dev/null 2>&1 || { echo "BADENVFILE $f"; exit 0; }
done
command -v -- "$py" >/dev/null 2>&1 || { echo "NOPYTHON"; exit 0; }
case "$py" in /*) ;; */*) py="$PWD/$py" ;; esac
# From /: the server runs in a fresh run dir, so a package in this shell's cwd must not count.
( cd / && "$py" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 1)' \
  "$module" ) >/dev/null 2>&1 || {
  echo "NOMODULE $("$py" -c 'import sys; print(sys.executable)' 2>/dev/null)"
  exit 0
}
if [ -n "$kdir" ]; then
  case "$kdir" in "~/"*) kdir="$HOME/${kdir#\~/}" ;; esac
  [ -d "$kdir" ] || { echo "NOKDIR"; exit 0; }
  ls -- "$kdir"/N=*.json >/dev/null 2>&1 || { echo "EMPTYKDIR"; exit 0; }
fi
echo OK
"""


def check_host(
    host: Host, config: AnyConfig, *, target: str = "sglang", python: str = "python3", timeout_s: float = 30.0
) -> None:
    """Raise :class:`~dsv4lab.errors.HostSetupError` naming what the launch would miss on ``host``.

    The server's interpreter must exist after the config's env files are sourced and must find ``sglang``
    (or ``dsv4lab`` for the twin); a ``kernel_config_dir`` must hold tuned ``N=*.json`` files, because
    without them SGLang quietly runs the untuned kernels and the campaign measures the wrong thing.
    """
    module = get_engine(target).module
    argv = [
        "bash",
        "-c",
        _CHECK_HOST,
        "dsv4lab-check",
        python,
        module,
        getattr(config, "kernel_config_dir", None) or "",
        *getattr(config, "env_files", ()),
    ]
    out = host.run(argv, timeout_s=timeout_s).check().stdout.strip().splitlines()
    verdict = out[-1] if out else "?"
    word, _, rest = verdict.partition(" ")
    if word == "OK":
        return
    if word == "NOENVFILE":
        raise HostSetupError(f"on {host.name}: the env file {rest} in env_files does not exist or is not readable")
    if word == "BADENVFILE":
        raise HostSetupError(f"on {host.name}: sourcing the env file {rest} failed")
    if word == "NOPYTHON":
        raise HostSetupError(
            f"on {host.name}: the interpreter {python!r} was not found; name the server host's Python with "
            "python= (CLI --python), e.g. the venv or conda env where SGLang is installed"
        )
    if word == "NOMODULE":
        where = f" ({rest})" if rest else ""
        raise HostSetupError(
            f"on {host.name}: the interpreter {python!r}{where} cannot import {module!r}; install it there or "
            f"point python= (CLI --python) at the environment that has it"
        )
    if word in ("NOKDIR", "EMPTYKDIR"):
        what = "does not exist" if word == "NOKDIR" else "holds no tuned N=*.json kernel configs"
        raise HostSetupError(
            f"on {host.name}: kernel_config_dir {getattr(config, 'kernel_config_dir', None)!r} {what}; without it "
            "SGLang runs the "
            "untuned FP8 kernels. Copy the tuned JSONs there, or unset kernel_config_dir to run untuned on purpose"
        )
    raise HostSetupError(f"on {host.name}: the pre-launch check printed {verdict!r}")


def launch(
    host: Host,
    config: AnyConfig,
    run_dir: str,
    *,
    target: str = "sglang",
    sglang_version: str | None = None,
    python: str | None = None,
    twin_env: Mapping[str, str] | None = None,
    replace_stale: bool = False,
    check: bool = True,
    preflight: bool = True,
    placement: SlurmPlacement | None = None,
    timeout_s: float = 60.0,
) -> ServerHandle:
    """Upload the env file and launch script into ``run_dir`` on ``host``, start the server, return at once.

    ``target="twin"`` starts the SGLang twin with the same flags (``twin_env`` sets its hardware profile,
    time scale and fault). ``python`` is the server host's interpreter (a venv or conda env); with
    ``check`` it is checked first, with the kernel-config folder, in one remote call (:func:`check_host`).
    A port in use, or reserved by another launch, raises :class:`StaleServerError` unless
    ``replace_stale`` kills the process tree holding it. With ``preflight`` the engine's memory prediction
    on this host (:meth:`Engine.predict_on_host <dsv4lab.engines.Engine.predict_on_host>`: vLLM's CPU build) refuses
    a launch that would fail for memory; ``preflight=False`` launches it anyway, to watch it fail.

    With a Slurm ``placement`` ``host`` is the cluster's login host: the launch script is submitted as a batch
    job (:func:`submit_job`) and the handle follows the job (:class:`SlurmServerHandle`).
    """
    engine = get_engine(target)
    version = engine.resolve_version(sglang_version)
    # What cannot be rendered (a flag the release lacks, a redacted secret) or what the engine refuses at
    # start is refused here, before anything is written on the host.
    engine.check(config, version, twin_env)
    if python is None:
        python = engine.default_python(isinstance(host, LocalHost))
    if placement is not None:
        return submit_job(
            host,
            config,
            run_dir,
            placement,
            engine=engine,
            version=version,
            python=python,
            twin_env=twin_env,
            check=check,
            timeout_s=timeout_s,
        )
    if check:
        _retry(lambda: check_host(host, config, target=target, python=python, timeout_s=timeout_s))
    from dsv4lab.serving.hostmem import HostProbe

    # Made with or without ``preflight``: handle.json keeps it, and the memory chart draws its figures.
    prediction = _retry(lambda: engine.predict_on_host(config, version, HostProbe(host, timeout_s)))
    if preflight and prediction is not None and not prediction.fits:
        raise prediction.refusal()
    run_dir = _retry(lambda: host.absolute_path(run_dir))
    layout = RunLayout(run_dir)
    _claim_run_dir(host, run_dir, replace_stale, timeout_s)
    _reserve_port(host, config.port, run_dir, replace_stale, timeout_s)
    try:
        _free_port(host, config.port, replace_stale, timeout_s)
        _upload_config(host, layout, config, timeout_s)
        script = engine.launch_script(config, run_dir=run_dir, version=version, python=python, settings=twin_env)
        _retry(lambda: host.put_text(layout.script, script, mode=0o700))
        started = time.time()
        pid = _start(host, layout, run_dir, timeout_s)
    except BaseException:
        with contextlib.suppress(Exception):
            release_port(host, config.port, run_dir)
        raise
    try:
        _retry(lambda: claim_port(host, config.port, run_dir, str(pid), timeout_s=timeout_s))
        extra: dict[str, Any] = {"twin_env": dict(twin_env or {}), "python": python}
        if prediction is not None:
            extra["preflight"] = prediction.to_dict()
        handle = ServerHandle(host, config, run_dir, pid, started, engine.name, version, _node_rank(config), extra)
        record = json.dumps(handle.to_dict(), indent=2)
        _retry(lambda: host.put_text(f"{run_dir}/{HANDLE_FILE}", record, mode=0o600))
    except BaseException:
        # Without handle.json nothing could find this server again: it must not outlive the failed launch.
        with contextlib.suppress(Exception):
            host.kill_tree(pid, grace_s=2.0)
        with contextlib.suppress(Exception):
            release_port(host, config.port, run_dir)
        raise
    return handle


def submit_job(
    host: Host,
    config: AnyConfig,
    run_dir: str,
    placement: SlurmPlacement,
    *,
    engine: Engine,
    version: str,
    python: str,
    twin_env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout_s: float = 60.0,
) -> SlurmServerHandle:
    """:func:`launch` on a Slurm cluster: the job refused before anything is written when it could never run,
    then the run dir, the launch script as its batch script, and ``handle.json`` with the job id.

    The port is reserved as for a launch on the host (held while the job is queued or running); nothing is
    checked for listening on the login host, which is not the node, and no host-memory preflight is made.
    A placement of several nodes runs an SGLang server spanning them (its ``nnodes``) as one job: each node's
    launch script in ``run_dir/nodeK``, started by one ``srun`` step
    (:func:`~dsv4lab.serving.slurm.render_nodes_batch`); the handle follows node 0, which serves the API.
    """
    node_configs = _job_node_configs(config, placement, engine)
    slurm = Slurm(host, slurm_conf=placement.slurm_conf, timeout_s=timeout_s)
    needed = engine.gpus_per_node(config) if placement.gpus_per_node else None
    _retry(lambda: slurm.check(placement, gpus_needed=needed))
    if check:
        _retry(lambda: check_host(host, config, target=engine.name, python=python, timeout_s=timeout_s))
    run_dir = _retry(lambda: host.absolute_path(run_dir))
    layout = RunLayout(run_dir)
    _claim_run_dir(host, run_dir, False, timeout_s)
    # The port is reserved in this user's dsv4lab state (shared by the login host and, on a shared home, the
    # nodes), held while the job is queued or running: two of the user's jobs on one node never take one port.
    _reserve_port(host, config.port, run_dir, False, timeout_s)
    try:
        if len(node_configs) == 1:
            _upload_config(host, layout, config, timeout_s)
            script = engine.launch_script(config, run_dir=run_dir, version=version, python=python, settings=twin_env)
        else:
            _upload_nodes(host, run_dir, node_configs, engine, version, python, twin_env, timeout_s)
            config = node_configs[0]
            script = render_nodes_batch(run_dir, len(node_configs), version=__version__)
        _retry(lambda: host.put_text(layout.script, script, mode=0o700))
        started = time.time()
        name = "dsv4lab-" + (posixpath.basename(run_dir.rstrip("/")) or "run")
        job_id = slurm.submit(layout.script, run_dir, placement, job_name=name)
    except BaseException:
        with contextlib.suppress(Exception):
            release_port(host, config.port, run_dir)
        raise
    try:
        conf = placement.slurm_conf or ""
        _retry(lambda: claim_port(host, config.port, run_dir, f"slurm:{job_id}", conf, timeout_s=timeout_s))
        extra: dict[str, Any] = {
            "twin_env": dict(twin_env or {}),
            "python": python,
            "slurm": {"job_id": job_id, "placement": placement.to_dict()},
        }
        handle = SlurmServerHandle(
            host, config, run_dir, 0, started, engine.name, version, 0, extra, job_id=job_id, placement=placement
        )
        record = json.dumps(handle.to_dict(), indent=2)
        _retry(lambda: host.put_text(f"{run_dir}/{HANDLE_FILE}", record, mode=0o600))
    except BaseException:
        # Without handle.json nothing could find this job again: it must not stay queued.
        with contextlib.suppress(Exception):
            slurm.cancel(job_id)
        with contextlib.suppress(Exception):
            release_port(host, config.port, run_dir)
        raise
    return handle


def _job_node_configs(config: AnyConfig, placement: SlurmPlacement, engine: Engine) -> list[AnyConfig]:
    """The config of each node of the job: the config itself on one node; on several, SGLang's ``nnodes``
    ranks with the job's first node as the dist-init host (known when the job runs) and its port kept."""
    nodes = placement.nodes
    spans = config.nnodes if isinstance(config, ServerConfig) else 1
    if nodes == 1 and spans == 1:
        return [config]
    if not isinstance(config, ServerConfig):
        raise ConfigError(
            "--slurm-nodes",
            nodes,
            f"1 for {engine.name}: a server spanning several nodes as one job is SGLang's (nnodes, node_rank, "
            "dist_init_addr)",
        )
    if spans != nodes:
        raise ConfigError(
            "--slurm-nodes",
            nodes,
            f"{spans}, the config's nnodes: a server on N nodes is one job of N nodes (set nnodes={nodes}, and "
            "dist_init_addr=HOST:PORT, whose host the job's first node replaces, to spread it)",
        )
    dist_port = (config.dist_init_addr or f"{FIRST_NODE}:5000").rsplit(":", 1)[1]
    return [
        config.replace(
            node_rank=rank, dist_init_addr=f"{FIRST_NODE}:{dist_port}", port=config.port + rank * placement.port_step
        )
        for rank in range(nodes)
    ]


def _upload_nodes(
    host: Host,
    run_dir: str,
    node_configs: Sequence[AnyConfig],
    engine: Engine,
    version: str,
    python: str,
    twin_env: Mapping[str, str] | None,
    timeout_s: float,
) -> None:
    """Each node's folder, config, env file and launch script (the dist-init host read on the node)."""

    def upload(rank: int, node_config: AnyConfig) -> None:
        where = node_dir(run_dir, rank)
        host.run(["bash", "-c", _PRIVATE_DIR, "dsv4lab-mkdir", where], timeout_s=timeout_s).check()
        node_layout = RunLayout(where)
        _upload_config(host, node_layout, node_config, timeout_s)
        addr = node_config.dist_init_addr if isinstance(node_config, ServerConfig) else None
        runtime = {addr: f'"$DSV4LAB_DIST_INIT_HOST":{addr.rsplit(":", 1)[1]}'} if addr else None
        script = engine.launch_script(
            node_config, run_dir=where, version=version, python=python, settings=twin_env, runtime_words=runtime
        )
        host.put_text(node_layout.script, script, mode=0o700)

    for rank, node_config in enumerate(node_configs):
        _retry(functools.partial(upload, rank, node_config))


def _node_rank(config: AnyConfig) -> int:
    return config.node_rank if isinstance(config, ServerConfig) else 0


def _claim_run_dir(host: Host, run_dir: str, replace_stale: bool, timeout_s: float) -> None:
    """The run dir, private; a server still running from it is refused (or, with ``replace_stale``, killed)."""
    # Private: the run dir holds env.sh with the server's secrets (0600 inside a 0700 dir; see render).
    _retry(lambda: host.run(["bash", "-c", _PRIVATE_DIR, "dsv4lab-mkdir", run_dir], timeout_s=timeout_s).check())
    previous = _read_handle(host, run_dir)
    if previous is not None and "slurm" in previous:
        old = _handle_from(host, run_dir, previous)
        if _retry(old.is_alive):
            if not replace_stale:
                raise LaunchError(
                    f"run dir {run_dir} on {host.name} already has a queued or running Slurm job "
                    f"({previous['slurm'].get('job_id')}); stop it first (dsv4lab stop {run_dir}) or use another "
                    "run dir"
                )
            old.stop(grace_s=10.0)
    elif previous is not None and _retry(lambda: host.is_alive(int(previous["launcher_pid"]))):
        if not replace_stale:
            raise LaunchError(
                f"run dir {run_dir} on {host.name} already has a running server (launcher PID "
                f"{previous['launcher_pid']}); stop it first or use another run dir"
            )
        host.kill_tree(int(previous["launcher_pid"]), grace_s=10.0)


def _reserve_port(host: Host, port: int, run_dir: str, replace_stale: bool, timeout_s: float) -> None:
    """This launch's reservation of the port; another live launch's is refused (or replaced)."""
    try:
        _retry(lambda: reserve_port(host, port, run_dir, timeout_s=timeout_s))
    except StaleServerError as exc:
        if not replace_stale or not exc.pids:
            raise
        host.kill_tree(exc.pids[0], grace_s=10.0)
        _retry(lambda: reserve_port(host, port, run_dir, timeout_s=timeout_s))


def _free_port(host: Host, port: int, replace_stale: bool, timeout_s: float) -> None:
    """Nothing may listen on the port already (a server started by hand, or one whose run dir is gone)."""
    listening, pids = _retry(lambda: find_listener(host, port, timeout_s=timeout_s))
    if listening:
        if not replace_stale or not pids:
            raise StaleServerError(host.name, port, pids)
        for pid in pids:
            host.kill_tree(pid, grace_s=10.0)


def _upload_config(host: Host, layout: RunLayout, config: AnyConfig, timeout_s: float) -> None:
    # An old stop marker would make the new server's death a "stop"; an old launcher.pid would be taken
    # for this launch's if the connection dropped while starting it.
    # A queued job starts later: an old run's exit files would read as this one's death until then.
    old = [
        "rm",
        "-f",
        "--",
        layout.stopped,
        layout.launcher_pid,
        layout.server_pid,
        layout.server_exit,
        layout.launcher_exit,
    ]
    _retry(lambda: host.run(old, timeout_s=timeout_s).check())
    _retry(lambda: host.put_text(layout.config_file, config.to_toml(redact=True), mode=0o600))
    _retry(lambda: host.put_text(layout.env_file, render_env_file(config), mode=0o600))


def launch_nodes(
    hosts: Sequence[Host],
    config: ServerConfig,
    run_dir: str,
    *,
    dist_port: int = 5000,
    node0_address: str | None = None,
    port_step: int = 0,
    target: str = "sglang",
    sglang_version: str | None = None,
    python: str | None = None,
    twin_env: Mapping[str, str] | None = None,
    replace_stale: bool = False,
    timeout_s: float = 60.0,
) -> list[ServerHandle]:
    """One process per node for ``nnodes > 1``: the same flags with node_rank 0..n-1 and node 0's address.

    Each node gets its own ``run_dir/nodeN``. ``port_step`` shifts node N's port by N x step, which only
    matters when several "nodes" share one machine (a rehearsal on the twin).
    """
    if len(hosts) != config.nnodes:
        raise LaunchError(
            f"config has nnodes={config.nnodes} but {plural(len(hosts), 'host')} "
            f"{plural(len(hosts), 'was', number=False)} given"
        )
    addr = config.dist_init_addr or f"{node0_address or '127.0.0.1'}:{dist_port}"
    handles: list[ServerHandle] = []
    try:
        for rank, host in enumerate(hosts):
            node_config = config.replace(node_rank=rank, dist_init_addr=addr, port=config.port + rank * port_step)
            handles.append(
                launch(
                    host,
                    node_config,
                    f"{run_dir}/node{rank}",
                    target=target,
                    sglang_version=sglang_version,
                    python=python,
                    twin_env=twin_env,
                    replace_stale=replace_stale,
                    timeout_s=timeout_s,
                )
            )
    except Exception:
        for h in handles:
            h.stop(grace_s=2.0)
        raise
    return handles


def _read_handle(host: Host, run_dir: str) -> dict[str, Any] | None:
    text = host.read_text(f"{run_dir}/{HANDLE_FILE}")
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def attach(host: Host, run_dir: str) -> ServerHandle:
    """The handle of a server launched earlier into ``run_dir`` (running or not)."""
    run_dir = host.absolute_path(run_dir)
    data = _read_handle(host, run_dir)
    if data is None:
        raise LaunchError(f"no dsv4lab launch in {run_dir} on {host.name} ({HANDLE_FILE} missing or unreadable)")
    return _handle_from(host, run_dir, data)


def _handle_from(host: Host, run_dir: str, data: Mapping[str, Any]) -> ServerHandle:
    """The handle a ``handle.json`` records (a Slurm job's when it names one)."""
    target = str(data.get("target") or "sglang")
    config = get_engine(target).load_config(data["config"])
    extra = {k: v for k, v in data.items() if k in ("twin_env", "python", "preflight", "slurm")}
    slurm = data.get("slurm")
    if isinstance(slurm, Mapping):
        return SlurmServerHandle(
            host,
            config,
            run_dir,
            0,
            float(data["started_at"]),
            target,
            str(data.get("version") or data.get("sglang_version") or "0.5.23"),
            0,
            extra,
            job_id=str(slurm["job_id"]),
            placement=SlurmPlacement.from_dict(slurm.get("placement") or {}),
        )
    return ServerHandle(
        host,
        config,
        run_dir,
        int(data["launcher_pid"]),
        float(data["started_at"]),
        target,
        str(data.get("version") or data.get("sglang_version") or "0.5.23"),
        int(data.get("node_rank", 0)),
        extra,
    )
