"""``dsv4lab bench --host ALIAS --run-dir DIR``: a server launched over SSH is benchmarked by its run
directory, through the SSH tunnel (GPU hosts are firewalled), with the same host options as ``launch``.

Everything is real: the OpenSSH server of the ``sshd`` fixture, the twin launched through it, and the CLI
as a separate process whose ``~/.ssh/config`` (a throwaway HOME) names the host by an alias.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4lab.config.server_config import ServerConfig
from dsv4lab.serving.launch import ServerHandle, launch
from dsv4lab.serving.watch import wait_ready
from tests.sshd import SSHD, free_port

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ALIAS = "gpubox"


def _home(tmp_path: Path, sshd: SSHD) -> dict[str, str]:
    """An environment whose HOME has an ssh config naming the test sshd ``gpubox`` (no agent, no other keys)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host {ALIAS}\n  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.key_path}\n  IdentitiesOnly yes\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT)}


@pytest.fixture
def launched(sshd: SSHD, tmp_path: Path) -> Iterator[ServerHandle]:
    host = sshd.connect()
    config = ServerConfig(model_path="dsv4lab/tiny-moe", tp=2, port=free_port(), mem_fraction_static=0.8)
    env = {"DSV4LAB_TWIN_PACE": "0.02", "DSV4LAB_TWIN_HARDWARE": "tiny"}
    handle = launch(host, config, str(tmp_path / "run"), target="twin", python=sys.executable, twin_env=env)
    try:
        readiness = wait_ready(handle, 120, progress=False)
        assert readiness.ready, readiness.reason
        yield handle
    finally:
        handle.stop(grace_s=1.0)
        host.close()


def _bench(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsv4lab", "bench", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
        check=False,
    )


def test_bench_a_launched_server_by_its_run_dir_through_the_tunnel(
    launched: ServerHandle, sshd: SSHD, tmp_path: Path
) -> None:
    out = tmp_path / "results.jsonl"
    proc = _bench(
        _home(tmp_path, sshd),
        *("--host", ALIAS, "--known-hosts", sshd.known_hosts, "--run-dir", launched.run_dir),
        *("--num-prompts", "3", "--input-len", "16", "--output-len", "4", "--json", "--output-file", str(out)),
    )
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["completed"] == 3 and row["total_output_tokens"] == 12 and row["engine"] == "dsv4lab-twin"
    own = json.loads(out.read_text())["dsv4lab"]
    local_port = int(own["url"].rsplit(":", 1)[1])
    assert local_port != launched.port  # the requests went through a forwarded local port
    assert json.loads(out.read_text())["server_info"]["port"] == launched.port


def test_unknown_host_key_is_refused_with_its_exit_status(launched: ServerHandle, sshd: SSHD, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    proc = _bench(_home(tmp_path, sshd), "--host", ALIAS, "--known-hosts", str(empty), "--run-dir", launched.run_dir)
    assert proc.returncode == 4
    assert proc.stderr.startswith("Error: the ") and "--trust-host-key" in proc.stderr
    assert proc.stdout == ""


def test_port_must_match_the_runs_own(launched: ServerHandle, sshd: SSHD, tmp_path: Path) -> None:
    argv = ["--host", ALIAS, "--known-hosts", sshd.known_hosts, "--run-dir", launched.run_dir]
    proc = _bench(_home(tmp_path, sshd), *argv, "--port", str(launched.port + 1))
    assert proc.returncode == 2 and proc.stderr.startswith("Error: --port=")
