"""One campaign at a time per host: a lock file on the host, and one in the campaign's folder.

Two campaigns against one GPU host would start their servers on the same GPUs (the second OOMs, or both
run and each measures the other's load), reuse each other's ports a moment apart and write the same
``campaign.json``: every number they produced would be suspect. The second one is refused at once with
who holds the host, instead of interleaving.

The host lock lives in dsv4lab's per-user state directory on the server host (beside the port
reservations); the folder lock in the campaign's reports folder. Both record the client machine and the
PID of the campaign that holds them, so a lock left by a campaign that was killed is taken over by the
next one started from the same machine; from another machine the message says which file to remove.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dsv4lab.errors import DSV4LabError, LaunchError
from dsv4lab.hosts import STATE_DIR, Host, open_host

__all__ = ["HOST_LOCK", "campaign_lock"]

#: The host lock, in dsv4lab's state directory on the host.
HOST_LOCK = "campaign.lock"
_FOLDER_LOCK = "campaign.lock"

# $1 the lock line. Prints LOCKED, or HELD and the holder's line.
_TAKE = r"""
dir=__STATE__
mkdir -p -m 700 -- "$dir" || exit 3
f="$dir/__LOCK__"
if ( set -o noclobber; printf '%s\n' "$1" > "$f" ) 2>/dev/null; then echo LOCKED; exit 0; fi
printf 'HELD %s\n' "$(head -n 1 -- "$f" 2>/dev/null)"
printf 'PATH %s\n' "$f"
""".replace("__STATE__", STATE_DIR).replace("__LOCK__", HOST_LOCK)

# $1 the line the lock must still hold: remove it only then (never another campaign's lock).
_DROP = r"""
f=__STATE__/__LOCK__
[ "$(head -n 1 -- "$f" 2>/dev/null)" = "$1" ] && rm -f -- "$f"
exit 0
""".replace("__STATE__", STATE_DIR).replace("__LOCK__", HOST_LOCK)


def _line(name: str, folder: Path) -> str:
    started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    holder = {"client": socket.gethostname(), "pid": os.getpid(), "campaign": name, "folder": str(folder)}
    return json.dumps({**holder, "started": started}, separators=(",", ":"))


def _stale(line: str) -> bool:
    """A lock held by a process of this machine that is gone (a campaign that was killed)."""
    try:
        holder = json.loads(line)
        if holder.get("client") != socket.gethostname():
            return False
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (ValueError, TypeError, KeyError, AttributeError, PermissionError, OSError):
        return False
    return False


def _describe(line: str) -> str:
    try:
        h: dict[str, Any] = json.loads(line)
        return (
            f"campaign {h.get('campaign')!r} (PID {h.get('pid')} on {h.get('client')}, since {h.get('started')}, "
            f"writing to {h.get('folder')})"
        )
    except (ValueError, AttributeError):
        return f"an unknown holder ({line!r})"


def _take_host(host: Host, line: str, host_name: str) -> None:
    for _ in range(3):
        out = host.run(["bash", "-c", _TAKE, "dsv4lab-lock", line], timeout_s=30.0).check().stdout.splitlines()
        if out[:1] == ["LOCKED"]:
            return
        held = next((w[5:] for w in out if w.startswith("HELD ")), "")
        path = next((w[5:] for w in out if w.startswith("PATH ")), HOST_LOCK)
        if held and _stale(held):
            host.run(["bash", "-c", _DROP, "dsv4lab-lock", held], timeout_s=30.0)
            continue
        raise LaunchError(
            f"host {host_name} is in use by {_describe(held)}: two campaigns on one host would put their servers "
            "on the same GPUs and ports, and both would measure each other. Wait for it to finish or stop it, "
            f"then start this one again (if no campaign is running there, remove {path} on {host_name})"
        )
    raise LaunchError(f"could not take the campaign lock on {host_name}; another campaign keeps starting there")


def _take_folder(folder: Path, line: str) -> Path:
    path = folder / _FOLDER_LOCK
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            held = ""
            with contextlib.suppress(OSError):
                held = path.read_text(encoding="utf-8").strip()
            if held and _stale(held):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            raise LaunchError(
                f"{folder} is in use by {_describe(held)}: two runs of one campaign would overwrite each other's "
                f"campaign.json and index.html. Wait for it to finish (or remove {path} if nothing is running)"
            ) from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(line + "\n")
        return path
    raise LaunchError(f"could not take the campaign lock in {folder}")


@contextlib.contextmanager
def campaign_lock(name: str, folder: Path, host_spec: str | None) -> Iterator[None]:
    """Hold the campaign's folder and its host for the duration (see module doc); refuse if either is taken."""
    line = _line(name, folder)
    host_name = host_spec or "local"
    folder_lock = _take_folder(folder, line)
    host: Host | None = None
    try:
        host = open_host(host_spec)
        _take_host(host, line, host_name)
    except BaseException:
        with contextlib.suppress(OSError):
            folder_lock.unlink()
        if host is not None:
            host.close()
        raise
    try:
        yield
    finally:
        with contextlib.suppress(DSV4LabError):
            host.run(["bash", "-c", _DROP, "dsv4lab-lock", line], timeout_s=30.0)
        host.close()
        with contextlib.suppress(OSError):
            folder_lock.unlink()
