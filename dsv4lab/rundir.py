"""The files a launch leaves in its run directory.

The launch script writes them and the watcher, ``stop`` and re-attach read them; naming them in one
place keeps both sides agreeing. The PID and exit-status files are what let a watcher tell a dead
server from a slow one without guessing from the log.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

__all__ = ["RunLayout"]


@dataclass(frozen=True)
class RunLayout:
    """Paths inside one run directory (POSIX paths: the directory may live on a remote host)."""

    run_dir: str

    def _join(self, name: str) -> str:
        return posixpath.join(self.run_dir, name)

    @property
    def script(self) -> str:
        return self._join("launch.sh")

    @property
    def env_file(self) -> str:
        return self._join("env.sh")

    @property
    def config_file(self) -> str:
        return self._join("config.toml")

    @property
    def log(self) -> str:
        return self._join("server.log")

    @property
    def server_pid(self) -> str:
        return self._join("server.pid")

    @property
    def server_exit(self) -> str:
        """Exit status of the server process, written when it ends (137 = SIGKILL)."""
        return self._join("server.exit")

    @property
    def launcher_pid(self) -> str:
        return self._join("launcher.pid")

    @property
    def stopped(self) -> str:
        """Written by a deliberate stop, before the kill: a later watch says STOPPED, not CRASHED."""
        return self._join("stopped.json")

    @property
    def launcher_exit(self) -> str:
        """Exit status of the launch script itself, written on any exit (a failed ``source`` included)."""
        return self._join("launcher.exit")
