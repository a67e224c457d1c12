"""Port reservations on a host: which ports a launch may take, held in the user's dsv4lab state on that host.

Two launches a second apart, before either server binds, must not pick one port; and a Slurm job's port is
held while the job is queued or running on a node the login host cannot see. The reservations are files
under ``$DSV4LAB_STATE_DIR/ports`` (one per port: run dir, launcher PID or ``slurm:JOB``, the cluster's
config), changed under one lock, read by one shell call per pick.
"""

from __future__ import annotations

from collections.abc import Sequence

from dsv4lab.errors import LaunchError, StaleServerError
from dsv4lab.hosts import STATE_DIR, Host

__all__ = ["PORT_LOCK_WAIT_S", "claim_port", "pick_port", "release_port", "reserve_port"]

# Every change to the reservations happens under one lock per user and host: taking over a stale
# reservation is a read, a check and a remove, and two launches doing that at once each removed the other's
# fresh reservation and both took the port (seen in CI; 50 of 100 tries with a stale file in place).
# flock(1) is util-linux, on every Linux host; without it the steps run unlocked (noclobber still keeps
# two launches off a free port).
#: How long (s) a launch waits for another's hold on the reservations (each holds it for milliseconds);
#: under the 15 s a reservation step may take in all.
PORT_LOCK_WAIT_S = 10.0

_PORTS_LOCKED = r"""
dir=__STATE__/ports
mkdir -p -m 700 -- "$dir" || exit 3
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$dir/.lock" || exit 3
  flock -w __LOCK_WAIT__ 9 || { echo LOCKED; exit 0; }
fi
""".replace("__STATE__", STATE_DIR)

# The ids, of those given, of the Slurm jobs that still hold their ports (queued or running: not ended, not
# purged) on the cluster whose slurm.conf is $1 (empty: the host's default). One squeue for all of them,
# at most 3 s when the controller is silent; a cluster whose config is gone asks nothing (it has no
# controller left to wait for). A reservation outlives its job when a launch never got to release it.
_HELD_JOBS = r"""
held_jobs() {
  conf=$1; shift
  [ "$#" -gt 0 ] || return 0
  [ -n "$conf" ] && [ ! -e "$conf" ] && return 0
  ids=$(printf '%s,' "$@")
  ended='^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|REVOKED)'
  timeout 3 env ${conf:+SLURM_CONF="$conf"} squeue -h -j "${ids%,}" -o '%i %T' 2>/dev/null \
    | awk -v ended="$ended" '$2 !~ ended { print $1 }'
}
"""

# Reserve a port for one launch, atomically, so that two launches a second apart — before either server
# binds — cannot both take it. A reservation names its run dir and, once started, the launcher PID; it is
# stale when that PID is dead, or (no PID yet) when it is older than 5 minutes.
_RESERVE_PORT = (
    _PORTS_LOCKED
    + _HELD_JOBS
    + r"""
f="$dir/$1"
for attempt in 1 2 3; do
  if ( set -o noclobber; printf '%s\n' "$2" > "$f" ) 2>/dev/null; then echo RESERVED; exit 0; fi
  owner=$(sed -n 1p "$f" 2>/dev/null); pid=$(sed -n 2p "$f" 2>/dev/null)
  if [ "$owner" = "$2" ]; then rm -f -- "$f"; continue; fi
  case "$pid" in
    slurm:*)
      conf=$(sed -n 3p "$f" 2>/dev/null)
      if [ -n "$(held_jobs "$conf" "${pid#slurm:}")" ]; then echo "TAKEN - $owner"; exit 0; fi
      rm -f -- "$f"; continue ;;
  esac
  if [ -n "$pid" ]; then
    state=$(ps -o stat= -p "$pid" 2>/dev/null) && case "$state" in *Z*) ;; *) echo "TAKEN $pid $owner"; exit 0 ;; esac
    rm -f -- "$f"; continue
  fi
  age=$(( $(date +%s) - $(stat -c %Y -- "$f" 2>/dev/null || echo 0) ))
  if [ "$age" -lt 300 ]; then echo "TAKEN - $owner"; exit 0; fi
  rm -f -- "$f"
done
echo "TAKEN - ?"
"""
)

_CLAIM_PORT = (
    _PORTS_LOCKED
    + r"""
f="$dir/$1"
[ "$(sed -n 1p "$f" 2>/dev/null)" = "$2" ] || exit 0
printf '%s\n%s\n%s\n' "$2" "$3" "${4:-}" > "$f.tmp" && mv -f -- "$f.tmp" "$f"
exit 0
"""
)

_RELEASE_PORT = (
    _PORTS_LOCKED
    + r"""
f="$dir/$1"
[ "$(sed -n 1p "$f" 2>/dev/null)" = "$2" ] && rm -f -- "$f"
exit 0
"""
)


# Ports that are listening or reserved by a live dsv4lab launch, one per line.
_BUSY_PORTS = (
    _HELD_JOBS
    + r"""
if command -v ss >/dev/null 2>&1; then
  ss -ltnH 2>/dev/null | awk '{ n = split($4, a, ":"); print a[n] }'
else
  for f in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$f" ] && awk 'NR > 1 && $4 == "0A" { split($2, a, ":"); print strtonum("0x" a[2]) }' "$f"
  done
fi
# Reservations pile up (one per launch ever made, stale once its launcher is gone): read them with builtins
# against one process listing, not a sed and a ps per file, or every launch gets slower with age. Slurm
# jobs' are asked about together, one squeue per cluster: one per reservation cost each launch 3 s for
# every reservation left by a cluster that has since stopped.
dir=__STATE__/ports
live=" $(ps -e -o pid= 2>/dev/null | tr -s ' \n' '  ') "
declare -A jobs=() port_of=()
for f in "$dir"/*; do
  [ -e "$f" ] || continue
  pid=""; conf=""
  { IFS= read -r _owner; IFS= read -r pid; IFS= read -r conf; } < "$f" 2>/dev/null
  case "$pid" in
    "") echo "${f##*/}" ;;
    slurm:*[!0-9]* | slurm:) ;;
    slurm:*) jobs["_$conf"]+=" ${pid#slurm:}"; port_of["${pid#slurm:}"]=${f##*/} ;;
    *[!0-9]*) ;;
    *) case "$live" in *" $pid "*) echo "${f##*/}" ;; esac ;;
  esac
done
for key in "${!jobs[@]}"; do
  # shellcheck disable=SC2086
  for id in $(held_jobs "${key#_}" ${jobs[$key]}); do echo "${port_of[$id]}"; done
done
""".replace("__STATE__", STATE_DIR)
)


def pick_port(host: Host, start: int, *, avoid: Sequence[int] = (), timeout_s: float = 15.0) -> int:
    """The first port from ``start`` that nothing listens on and no live launch has reserved (one call).

    Only a hint: :func:`reserve_port` takes the port atomically and refuses it if another launch got there
    first, so a caller retries with the next port.
    """
    out = host.run(["bash", "-c", _BUSY_PORTS], timeout_s=timeout_s).stdout.split()
    busy = {int(x) for x in out if x.isdigit()} | set(avoid)
    port = start
    while port in busy:
        port += 1
    if port > 65535:
        raise LaunchError(f"no free port on {host.name} from {start} up")
    return port


def _ports_script(script: str, lock_wait_s: float = PORT_LOCK_WAIT_S) -> str:
    return script.replace("__LOCK_WAIT__", f"{lock_wait_s:g}")


def reserve_port(
    host: Host, port: int, run_dir: str, *, timeout_s: float = 15.0, lock_wait_s: float = PORT_LOCK_WAIT_S
) -> None:
    """Reserve ``port`` on ``host`` for the launch into ``run_dir``, or raise :class:`StaleServerError`."""
    script = _ports_script(_RESERVE_PORT, lock_wait_s)
    out = host.run(["bash", "-c", script, "dsv4lab-port", str(port), run_dir], timeout_s=timeout_s).check()
    words = out.stdout.split(maxsplit=2)
    if words[:1] == ["RESERVED"]:
        return
    if words[:1] == ["LOCKED"]:
        raise LaunchError(
            f"could not reserve port {port} on {host.name}: another process has held dsv4lab's port "
            f"reservations lock for over {lock_wait_s:g} s (ports/.lock in $DSV4LAB_STATE_DIR, by default "
            "~/.cache/dsv4lab); find it with `fuser -v` on that file, end it, and launch again"
        )
    pid = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    owner = words[2] if len(words) > 2 else "?"
    holder = f"the dsv4lab launch into {owner}" + (f" (launcher PID {pid})" if pid else " (starting now)")
    raise StaleServerError(host.name, port, [pid] if pid else [], holder=holder)


def claim_port(host: Host, port: int, run_dir: str, holder: str, conf: str = "", *, timeout_s: float = 15.0) -> None:
    """Name what holds ``run_dir``'s reservation of ``port`` once it is started: the launcher's PID, or
    ``slurm:JOB`` with the cluster's ``conf`` (the reservation then lasts as long as the job)."""
    argv = ["bash", "-c", _ports_script(_CLAIM_PORT), "dsv4lab-port", str(port), run_dir, holder, conf]
    host.run(argv, timeout_s=timeout_s)


def release_port(host: Host, port: int, run_dir: str, *, timeout_s: float = 15.0) -> None:
    """Drop ``run_dir``'s reservation of ``port`` (a reservation by another run is left alone)."""
    host.run(["bash", "-c", _ports_script(_RELEASE_PORT), "dsv4lab-port", str(port), run_dir], timeout_s=timeout_s)
