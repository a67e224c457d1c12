"""The notebook session against the twin: a few obvious lines per step, and no silent degradation."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest

from dsv4lab import ConfigError, Lab, StaleServerError, Verdict
from dsv4lab.config.presets import KERNEL_CONFIG_DIR
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.errors import BenchError, HostSetupError
from dsv4lab.serving.launch import launch
from tests.sshd import SSHD

pytestmark = pytest.mark.slow


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with Lab(run_root=tmp_path / "runs", pace=0.05, progress=False) as session:
        yield session


def test_the_story_in_a_few_lines(lab: Lab) -> None:
    p = lab.preflight("config_b")
    assert not p.fits and p.fail_phase == "cuda_graph_capture" and p.failing_gpu is not None
    assert p.failing_gpu.gpu == 1
    b = lab.launch("config_b").wait()
    assert b.state == "CRASHED" and b.readiness is not None and b.readiness.exit_status == 137
    a = lab.launch("config_a").wait()
    assert a.state == "READY" and a.port != b.port
    runs = a.bench(concurrency="1,4", input_len=256, output_len=16)  # a papermill -p value works too
    frame = runs.to_frame()
    assert frame["concurrency"].tolist() == [1, 4]
    # Twin figures are the modelled hardware's, read from the twin's stamps; this machine's wall time apart.
    assert (frame["clock"] == "modelled hardware").all() and (frame["clock_kind"] == "twin-paced").all()
    assert (frame["pace"] == 0.05).all() and (frame["host_lag_s"] >= 0).all()
    assert (frame["output_throughput"] > 0).all() and "twin clock" not in " ".join(frame.columns)
    html = runs._repr_html_()
    assert "modelled hardware" in html
    r = a.readiness
    assert r is not None and r.first_line_s is not None and 0 < r.first_line_s < r.elapsed_s
    # On the twin the startup counts from the server's first log line to its ready line, by the log's own
    # timestamps, on the modelled hardware's clock (the twin's own Python start models nothing).
    assert r.log_end_s is not None and 0 < r.log_end_s * 0.05 <= r.elapsed_s  # paced at 0.05: modelled s
    assert r.startup_s == pytest.approx(r.log_end_s)  # the log's stamps are the twin's modelled time
    assert [t for _, t in r.phases()] == sorted(t for _, t in r.phases())
    headline = r.headline()
    assert headline.startswith("READY after ") and headline.endswith(" s (modelled)")
    assert headline in r._repr_html_()
    assert len(a.runs) == 2 and isinstance(a.runs.to_frame(), pd.DataFrame)
    assert {"READY", "CRASHED"} == set(lab.ps()["state"])


def test_crash_card_is_the_model_checked_diagnosis(lab: Lab) -> None:
    b = lab.launch("config_b").wait()
    assert b.readiness is not None and b.readiness.diagnosis is not None
    watched = b.readiness.diagnosis
    full = b.diagnose()
    assert [f.change for f in watched.fixes] == [f.change for f in full.fixes]
    assert any("Checked:" in f.why for f in full.fixes)
    assert watched.figures.get("model_short_by_gib") == pytest.approx(full.figures.get("model_short_by_gib"))
    assert "GPU 1" in b.readiness.reason and "CRASHED" in b._repr_html_()


def test_presets_get_the_sessions_tuned_kernel_folder(lab: Lab) -> None:
    cfg = lab.config("config_a")
    assert cfg.kernel_config_dir != KERNEL_CONFIG_DIR
    assert cfg.kernel_config_dir is not None and any(Path(cfg.kernel_config_dir).glob("N=*.json"))
    a = lab.launch("config_a").wait()
    assert a.log(200).lines and any("Using configuration from" in line for line in a.log(400).lines)


def test_a_real_target_refuses_what_the_host_lacks_before_launch(tmp_path: Path) -> None:
    real = Lab(target="sglang", run_root=tmp_path / "runs", python=sys.executable, progress=False)
    # No nvidia-smi here: sampling says so as a warning, and the launch refuses what the host lacks.
    sampling = pytest.warns(UserWarning, match="GPU memory sampling on localhost could not start")
    with real, sampling, pytest.raises(HostSetupError, match=r"cannot import 'sglang'; install it there or point"):
        real.launch("config_a")
    # With an interpreter that has SGLang (a stand-in package here), the missing tuned kernels are next.
    fake = tmp_path / "site" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = tmp_path / "env.sh"
    env.write_text(f"export PYTHONPATH={tmp_path / 'site'}\n")
    real = Lab(target="sglang", run_root=tmp_path / "runs2", python=sys.executable, progress=False)
    sampling = pytest.warns(UserWarning, match="GPU memory sampling on localhost could not start")
    with real, sampling, pytest.raises(HostSetupError, match="kernel_config_dir '~/dsv4-kernel-configs' does not"):
        real.launch("config_a", env_files=[str(env)])
    assert real.servers == []


def test_wrong_values_are_clear_errors_before_launch(lab: Lab) -> None:
    with pytest.raises(ConfigError, match="mem_fraction_static='lots' is not valid: a number"):
        lab.launch("config_a", mem_fraction_static="lots")
    with pytest.raises(ConfigError, match="mem_fractio"):
        lab.launch("config_a", mem_fractio=0.6)
    with pytest.raises(ConfigError, match="config_c"):
        lab.launch("config_c")
    with pytest.raises(ConfigError, match="target"):
        Lab(target="tgi")
    with pytest.raises(ConfigError, match="hardware"):
        Lab(hardware="a100-x3")
    with pytest.raises(ConfigError, match="fault"):
        Lab(target="sglang").launch("config_a", fault="silent_death")
    assert lab.servers == []


def test_overrides_by_keyword_and_nested(lab: Lab) -> None:
    cfg = lab.config("config_b", mem_fraction_static=0.6, cuda_graph_max_bs="16", speculative__num_steps=1)
    assert cfg.mem_fraction_static == 0.6 and cfg.cuda_graph_max_bs == 16
    assert lab.preflight("config_b", mem_fraction_static=0.6, cuda_graph_max_bs=16).fits


def test_two_launches_on_one_port_a_moment_apart_are_refused(lab: Lab, tmp_path: Path) -> None:
    first = lab.launch("config_a", port=0 or lab.base_port + 500)
    with pytest.raises(StaleServerError, match=str(first.port)):
        lab.launch("config_a", port=first.port)  # before the first has even bound it
    with pytest.raises(StaleServerError, match=r"reserved|in use"):
        launch(lab.host, lab.config("config_a", port=first.port), str(tmp_path / "other"), target="twin")


def test_bench_before_wait_and_on_a_crashed_server_say_why(lab: Lab) -> None:
    b = lab.launch("config_b")
    with pytest.raises(BenchError, match="call wait"):
        b.bench()
    b.wait()
    with pytest.raises(BenchError, match="CRASHED"):
        b.bench()


def test_attach_reports_the_server_now_not_old_log_lines(lab: Lab, tmp_path: Path) -> None:
    a = lab.launch("config_a", keep=True).wait()
    with Lab(run_root=tmp_path / "second", progress=False) as second:  # a restarted kernel
        again = second.attach(a.run_dir)
        assert again.state == "READY"
        a.stop()
        dead = second.attach(a.run_dir)
        assert dead.readiness is not None and dead.readiness.verdict is Verdict.STOPPED
        assert dead.state == "STOPPED"


def test_the_session_stops_what_it_started_and_keeps_what_it_was_told_to(tmp_path: Path) -> None:
    lab = Lab(run_root=tmp_path / "runs", pace=0.05, progress=False)
    a = lab.launch("config_a")
    kept = lab.launch("config_a", keep=True)
    pids = [a.handle.launcher_pid, kept.handle.launcher_pid]
    lab.close()
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
    assert psutil.pid_exists(pids[1])
    kept.stop(grace_s=2)


def test_displays(lab: Lab) -> None:
    a = lab.launch("config_a").wait()
    for obj in (lab, a, a.readiness, a.log(5), lab.preflight("config_b"), lab.hardware):
        html = obj._repr_html_()  # type: ignore[union-attr]
        assert html.startswith("<") and "text-align:left" in html


def test_lab_over_ssh_with_the_hosts_python(sshd: SSHD, tmp_path: Path) -> None:
    host = sshd.connect()
    with Lab(
        host, run_root=tmp_path / "local", remote_root=str(tmp_path / "remote"), python=sys.executable, progress=False
    ) as lab:
        a = lab.launch("config_a").wait()
        assert a.state == "READY"
        assert a.url.startswith("http://127.0.0.1:") and a.url != f"http://127.0.0.1:{a.port}"  # the tunnel
        runs = a.bench(concurrency=[2], input_len=128, output_len=8)
        assert not runs.partial
        a.stop()
        assert (a.local_dir / "server.log").exists()  # copied home for the report
    base = os.path.join(sys.base_prefix, "bin", "python3")
    lab = Lab(sshd.connect(), run_root=tmp_path / "l2", remote_root=str(tmp_path / "r2"), python=base, progress=False)
    sampling = pytest.warns(UserWarning, match="GPU memory sampling on .* could not start")  # the twin's smi needs it
    with lab, sampling, pytest.raises(HostSetupError, match=rf"on {sshd.target}: the interpreter '{base}'.*'dsv4lab'"):
        lab.launch("config_a")


def test_compare_a_against_a_with_a_change_in_its_natural_forms(lab: Lab) -> None:
    """``compare("config_a", cuda_graph_max_bs=8)`` and ``compare("config_a", "config_a", [4], b_overrides=...)``:
    A and A-with-the-change, both launched, benchmarked, named by what differs, and stopped after."""
    load: dict[str, Any] = {"repeats": 1, "prompts": 4, "input_len": 256, "output_len": 16}
    runs = lab.launch_ab("config_a", concurrency=[4], cuda_graph_max_bs=8, **load)
    assert (runs.label_a, runs.label_b) == ("config_a", "config_a+cuda_graph_max_bs=8")
    assert len(runs.a) == len(runs.b) == 1 and not runs.partial
    assert {r.label for r in runs.a} == {"config_a"} and {r.label for r in runs.b} == {"config_a+cuda_graph_max_bs=8"}
    a, b = lab.servers
    assert isinstance(a.config, ServerConfig) and isinstance(b.config, ServerConfig)
    assert a.config.cuda_graph_max_bs is None and b.config.cuda_graph_max_bs == 8
    assert a.config.replace(cuda_graph_max_bs=8, port=b.port) == b.config  # the change, and nothing else
    assert (a.name, b.name) == ("config-a", "config-a-cuda-graph-max-bs-8")
    assert a.stopped is not None and b.stopped is not None
    again = lab.launch_ab("config_a", "config_a", [4], b_overrides={"env.NCCL_PROTO": "Simple"}, **load)
    assert again.label_b == "config_a+env.NCCL_PROTO=Simple" and len(again.b) == 1
    named = lab.launch_ab("config_a", "config_b_fixed", 4, names=("A", "B fixed"), **load)
    assert (named.label_a, named.label_b) == ("A", "B fixed") and lab.servers[-1].name == "B-fixed"
    assert all(s.stopped is not None for s in lab.servers)


def test_ab_refuses_bad_input_before_a_request(lab: Lab) -> None:
    a = lab.launch("config_a", sample_gpus=False).wait()
    rows: list[tuple[dict[str, Any], str]] = [
        ({"b": a}, "b='config-a' is not valid: a server other than a"),
        ({"b": "config_b"}, "b='config_b' is not valid: a server from lab.launch"),
        ({"b": a, "labels": ("A", "A")}, "a server other than a"),
    ]
    for kwargs, message in rows:
        with pytest.raises(ConfigError, match=re.escape(message)):
            lab.ab(a, **kwargs)
    b = lab.launch("config_a", sample_gpus=False, cuda_graph_max_bs=8).wait()
    checked: list[tuple[dict[str, Any], str]] = [
        ({"labels": ("A", "A")}, "labels=('A', 'A') is not valid: two different names"),
        ({"concurrency": 0}, "concurrency=0 is not valid: one or more integers >= 1"),
        ({"repeats": -1}, "repeats=-1 is not valid: an integer >= 1"),
        ({"output_len": 0}, "output_len=0 is not valid"),
        ({"interleave": "yes"}, "interleave='yes' is not valid"),
    ]
    for kwargs, message in checked:
        with pytest.raises(ConfigError, match=re.escape(message)):
            lab.ab(a, b, **kwargs)
    assert not list(lab.run_root.glob("ab-*")), "a benchmark was started"
    runs = lab.ab(a, b, 2, repeats=1, prompts=2, input_len=128, output_len=8)
    assert (runs.label_a, runs.label_b) == (a.name, b.name) and len(runs.a) == len(runs.b) == 1
