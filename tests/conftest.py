"""Shared test helpers.

Real parts (sshd, a Jupyter kernel, a real SGLang parser) are used wherever they can exist here. When one
is missing a test skips locally, but under CI (CI=true) it fails: CI promises to have installed them, so
a skip there would hide a broken setup.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from dsv4lab.hosts import Host, LocalHost, SSHHost
from tests.sshd import SSHD, sshd_binary, start_sshd

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
    from dsv4lab.hardware import hardware_profile, model_profile
    from dsv4lab.presets import MODEL
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
