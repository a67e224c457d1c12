from __future__ import annotations

import base64
import contextlib
import http.server
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import paramiko
import psutil
import pytest

from dsv4lab.errors import CommandError, HostConnectionError, HostKeyError
from dsv4lab.hosts import Host, LocalHost, LogLine, SSHHost, fingerprint, resolve_target
from tests.sshd import SSHD

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


# -- commands ---------------------------------------------------------------------------------------------------


def test_run_argv_and_script(any_host: Host) -> None:
    r = any_host.run(["printf", "%s|", "a b", "it's", "$(nope)"], timeout_s=30)
    assert r.ok and r.stdout == "a b|it's|$(nope)|"
    r = any_host.run("echo out; echo err >&2; exit 3", timeout_s=30)
    assert r.exit_status == 3 and r.stdout == "out\n" and r.stderr == "err\n"
    with pytest.raises(CommandError) as err:
        r.check()
    assert "exited with status 3" in str(err.value) and "err" in str(err.value)
    assert any_host.run(["cat"], timeout_s=30, input_text="piped").stdout == "piped"


def test_run_timeout_is_explicit(any_host: Host) -> None:
    r = any_host.run(["sleep", "5"], timeout_s=0.5)
    assert r.timed_out and r.exit_status is None and r.duration_s < 4
    with pytest.raises(CommandError, match="timed out"):
        r.check()


def test_files_round_trip(any_host: Host, tmp_path: Path) -> None:
    weird = tmp_path / "a dir 'with' $(quotes)"
    any_host.makedirs(str(weird))
    path = str(weird / "f;1.txt")
    any_host.put_text(path, "hello\nwörld\n", mode=0o755)
    assert any_host.read_text(path) == "hello\nwörld\n"
    assert Path(path).stat().st_mode & 0o777 == 0o755
    assert any_host.read_text(path, max_bytes=6) == "wörld\n"[-6:] or any_host.read_text(path, max_bytes=6)
    assert any_host.read_text(str(weird / "missing")) is None
    local = tmp_path / "local.bin"
    local.write_bytes(bytes(range(256)))
    any_host.put(str(local), str(weird / "copy.bin"))
    back = tmp_path / "back.bin"
    any_host.get(str(weird / "copy.bin"), str(back))
    assert back.read_bytes() == bytes(range(256))


# -- processes ----------------------------------------------------------------------------------------------------

TREE = "sleep 300 & sleep 300 & (sleep 300 & wait) & wait"


def test_detached_tree_is_alive_then_killed_without_orphans(any_host: Host, tmp_path: Path) -> None:
    pid = any_host.start_detached(["bash", "-c", TREE], cwd=str(tmp_path))
    deadline = time.monotonic() + 10

    def sleeps() -> int:  # the tree is settled once every `sleep` has been exec'd (forks come first, as bash)
        n = 0
        for c in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):  # a short-lived fork can end between the two calls
                n += c.name() == "sleep"
        return n

    while time.monotonic() < deadline and sleeps() < 3:
        time.sleep(0.05)
    tree = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    assert len(tree) >= 5
    assert any_host.is_alive(pid)
    report = any_host.kill_tree(pid, grace_s=2)
    assert set(report.all) >= set(tree)
    assert not _wait_gone(tree), "processes survived kill_tree"
    assert not any_host.is_alive(pid)
    assert "nothing was running" in str(any_host.kill_tree(pid, grace_s=1))


def test_kill_tree_escalates_to_sigkill(any_host: Host, tmp_path: Path) -> None:
    stubborn = "trap '' TERM; sleep 300 & wait"
    pid = any_host.start_detached(["bash", "-c", stubborn], cwd=str(tmp_path))
    time.sleep(0.3)
    report = any_host.kill_tree(pid, grace_s=0.5)
    assert pid in report.killed
    assert not _wait_gone([pid])


def test_this_machine_reads_liveness_from_proc_as_ps_would_say_it() -> None:
    """``LocalHost.is_alive`` reads ``/proc`` (no shell per look); it says what every other host's ``ps`` says:
    a running process lives, a zombie (ended, not yet reaped) and a PID that is gone do not."""
    host = LocalHost()
    running = subprocess.Popen(["sleep", "30"])
    ended = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 5
        while psutil.Process(ended.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.02)
        gone = subprocess.Popen(["true"])
        gone.wait()
        for pid, alive in ((running.pid, True), (ended.pid, False), (gone.pid, False)):
            assert host.is_alive(pid) is alive and Host.is_alive(host, pid) is alive, pid
    finally:
        running.kill()
        running.wait()
        ended.wait()


def test_reparented_children_are_found_by_process_group(tmp_path: Path) -> None:
    host = LocalHost()
    # The parent exits at once; its child lives on, re-parented, in the same process group.
    pid = host.start_detached(["bash", "-c", "sleep 300 & echo $! > child.pid"], cwd=str(tmp_path))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (tmp_path / "child.pid").exists():
        time.sleep(0.05)
    time.sleep(0.2)
    child = int((tmp_path / "child.pid").read_text())
    assert not host.is_alive(pid) and host.is_alive(child)
    report = host.kill_tree(pid, grace_s=1)
    assert child in report.all
    assert not _wait_gone([child])


def test_detached_process_outlives_the_ssh_session(sshd: SSHD, tmp_path: Path) -> None:
    host = sshd.connect()
    pid = host.start_detached(["sleep", "300"], cwd=str(tmp_path))
    host.close()
    time.sleep(0.3)
    assert psutil.pid_exists(pid)
    again = sshd.connect()
    assert again.is_alive(pid)
    again.kill_tree(pid, grace_s=1)
    again.close()
    assert not _wait_gone([pid])


# -- follow -------------------------------------------------------------------------------------------------------


def test_follow_streams_lines_and_resumes(any_host: Host, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with any_host.follow(str(log), 0) as follower:
        assert follower.poll(0.2) == []  # the file does not exist yet
        with log.open("ab") as f:
            f.write(b"first line\nCapturing 10%\rCapturing 20%\rpart")
            f.flush()
            got: list[LogLine] = []
            deadline = time.monotonic() + 10
            while len(got) < 3 and time.monotonic() < deadline:
                got += follower.poll(0.5)
            assert [line.text for line in got] == ["first line", "Capturing 10%", "Capturing 20%"]
            assert follower.poll(0.3) == []  # "part" has no end yet
            f.write(b"ial\n")
            f.flush()
            rest: list[LogLine] = []
            while not rest and time.monotonic() < deadline:
                rest = follower.poll(0.5)
            assert [line.text for line in rest] == ["partial"]
            resume = follower.resume_offset
            assert resume == log.stat().st_size == rest[-1].end_offset
    with log.open("ab") as f:
        f.write(b"after reconnect\n")
    with any_host.follow(str(log), resume) as again:
        lines: list[LogLine] = []
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            lines = again.poll(0.5)
        assert [line.text for line in lines] == ["after reconnect"]


def test_dropped_connection_is_a_connection_error(sshd: SSHD, tmp_path: Path) -> None:
    host = sshd.connect()
    log = tmp_path / "x.log"
    log.write_text("a\n")
    follower = host.follow(str(log), 0)
    assert [line.text for line in follower.poll(5)] == ["a"]
    sshd.drop_connections()

    def poll_until_error() -> None:
        for _ in range(50):
            follower.poll(0.2)

    with pytest.raises(HostConnectionError):
        poll_until_error()
    assert not host.connected
    host.connect()
    assert host.run(["true"], timeout_s=30).ok
    host.close()


# -- port forwarding ----------------------------------------------------------------------------------------------


@pytest.fixture
def http_port() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"tunnelled " + self.path.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_forward_reaches_the_hosts_loopback(any_host: Host, http_port: int) -> None:
    with any_host.forward(http_port) as fwd:
        for i in range(3):  # several connections through one forward
            with urllib.request.urlopen(f"{fwd.url}/health/{i}", timeout=10) as resp:  # noqa: S310 - loopback only
                assert resp.read() == f"tunnelled /health/{i}".encode()


# -- host keys and ssh config -------------------------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_fingerprint(sshd: SSHD, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    with pytest.raises(HostKeyError) as err:
        sshd.connect(known_hosts=str(known))
    key_type, key_b64 = sshd.host_key_line.split()[1:3]
    key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))
    assert err.value.fingerprint == fingerprint(key)
    assert fingerprint(key) in str(err.value) and "trust_unknown_host=True" in str(err.value)
    assert not known.exists()


def test_trusting_records_the_key_then_it_is_known(sshd: SSHD, tmp_path: Path) -> None:
    known = tmp_path / "sub" / "known_hosts"
    sshd.connect(known_hosts=str(known), trust_unknown_host=True).close()
    assert known.read_text().strip() == sshd.host_key_line
    sshd.connect(known_hosts=str(known)).close()


def test_changed_host_key_is_always_refused(sshd: SSHD, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 {_other_ed25519(tmp_path)}\n")
    for trust in (False, True):
        with pytest.raises(HostKeyError) as err:
            sshd.connect(known_hosts=str(known), trust_unknown_host=trust)
        assert err.value.changed and "CHANGED" in str(err.value)


def _other_ed25519(tmp_path: Path) -> str:
    import subprocess

    path = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    return path.with_suffix(".pub").read_text().split()[1]


def test_ssh_config_alias_and_proxyjump(sshd: SSHD, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu-box\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {sshd.key_path}\n"
        f"Host behind-jump\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.key_path}\n  ProxyJump gpu-box\n"
    )
    target = resolve_target("gpu-box", ssh_config=str(config))
    assert (target.hostname, target.port, target.user) == ("127.0.0.1", sshd.port, sshd.user)
    assert target.identity_files == (sshd.key_path,)
    for alias in ("gpu-box", "behind-jump"):
        host = SSHHost(
            alias, known_hosts=sshd.known_hosts, ssh_config=str(config), allow_agent=False, look_for_keys=False
        )
        assert host.run(["echo", alias], timeout_s=30).stdout == alias + "\n"
        host.close()


def test_auth_failure_is_a_connection_error(sshd: SSHD, tmp_path: Path) -> None:
    with pytest.raises(HostConnectionError, match="authentication"):
        SSHHost(
            f"nobody-{shlex.quote('x')}@127.0.0.1:{sshd.port}",
            key_filename=sshd.key_path,
            known_hosts=sshd.known_hosts,
            ssh_config=None,
            allow_agent=False,
            look_for_keys=False,
        )


def test_connection_refused_is_a_connection_error() -> None:
    from tests.sshd import free_port

    with pytest.raises(HostConnectionError, match="cannot connect"):
        SSHHost(
            f"root@127.0.0.1:{free_port()}",
            ssh_config=None,
            allow_agent=False,
            look_for_keys=False,
            connect_timeout_s=3,
        )


def test_python_of_this_venv_runs_over_ssh(ssh_host: SSHHost) -> None:
    r = ssh_host.run([sys.executable, "-c", "import dsv4lab; print(dsv4lab.__version__)"], timeout_s=60)
    assert r.ok, r.stderr
