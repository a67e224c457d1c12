from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4lab.config.launch_script import render_argv, render_env_file, render_launch_script, server_command
from dsv4lab.config.presets import config_a, config_b, config_b_fixed
from dsv4lab.config.server_config import ServerConfig, SpeculativeConfig
from dsv4lab.config.versions import RELEASES, VersionFallbackWarning, parse_version, resolve_release
from dsv4lab.errors import UnsupportedFlagError, VersionError
from dsv4lab.rundir import RunLayout

BASH = shutil.which("bash") or "/bin/bash"

# -- versions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("0.5.23", (0, 5, 23)),
        ("0.5.4.post3", (0, 5, 4)),
        ("v0.4.10.post2", (0, 4, 10)),
        ("0.5.10rc1", (0, 5, 10)),
        ("0.5", (0, 5, 0)),
        ("0.5.17.dev3+g1234abc", (0, 5, 17)),
    ],
)
def test_parse_version(text: str, key: tuple[int, int, int]) -> None:
    assert parse_version(text) == key


@pytest.mark.parametrize("text", ["latest", "", "five", "0.x"])
def test_bad_version_is_named(text: str) -> None:
    with pytest.raises(VersionError, match="not a version number"):
        parse_version(text)


def test_known_versions_resolve_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for r in RELEASES:
            assert resolve_release(r.version) is r
        assert resolve_release("0.5.4.post3").version == "0.5.4"
        assert resolve_release("0.4.10.post2").version == "0.4.10"


@pytest.mark.parametrize(
    ("asked", "used"), [("0.5.10", "0.5.4"), ("0.5.30", "0.5.23"), ("0.3.0", "0.4.10"), ("0.5.20", "0.5.16")]
)
def test_unknown_version_renders_as_nearest_and_says_so(asked: str, used: str) -> None:
    with pytest.warns(VersionFallbackWarning, match=f"rendering as SGLang {used}"):
        assert resolve_release(asked).version == used
    script = render_launch_script(config_a(), run_dir="/r", sglang_version=asked)
    assert f"rendered as SGLang {used}" in script


# -- the flag matrix --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "max_bs_flag"),
    [
        ("0.4.10", "--cuda-graph-max-bs"),
        ("0.5.4", "--cuda-graph-max-bs"),
        ("0.5.16", "--cuda-graph-max-bs-decode"),
        ("0.5.23", "--cuda-graph-max-bs-decode"),
    ],
)
def test_cuda_graph_flag_by_version(version: str, max_bs_flag: str) -> None:
    argv = render_argv(config_b_fixed(), version)
    i = argv.index(max_bs_flag)
    assert argv[i + 1] == "16"
    other = {"--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"} - {max_bs_flag}
    assert not other & set(argv)
    bs = render_argv(ServerConfig(model_path="m", cuda_graph_bs=(1, 2, 4)), version)
    assert bs[-4:] == [max_bs_flag.replace("max-bs", "bs"), "1", "2", "4"]


def test_story_config_b_argv() -> None:
    assert render_argv(config_b(), "0.5.23") == [
        "--model-path",
        "deepseek-ai/DeepSeek-V4-Flash",
        "--tp-size",
        "8",
        "--mem-fraction-static",
        "0.7",
        "--trust-remote-code",
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "1",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "2",
    ]


def test_full_config_renders_every_field() -> None:
    c = ServerConfig(
        model_path="m",
        served_model_name="s",
        tp=8,
        dp=2,
        host="0.0.0.0",
        port=31000,
        mem_fraction_static=0.6,
        cuda_graph_max_bs=16,
        max_running_requests=48,
        chunked_prefill_size=-1,
        context_length=8192,
        kv_cache_dtype="fp8_e4m3",
        quantization="fp8",
        trust_remote_code=True,
        enable_metrics=True,
        speculative=SpeculativeConfig("EAGLE", 3, 1, 4, "/draft"),
        nnodes=2,
        node_rank=1,
        dist_init_addr="node0:5000",
        extra_args=("--attention-backend", "triton"),
    )
    argv = render_argv(c, "0.5.23")
    for flag in [
        "--served-model-name",
        "--dp-size",
        "--host",
        "--port",
        "--max-running-requests",
        "--context-length",
        "--kv-cache-dtype",
        "--quantization",
        "--enable-metrics",
        "--speculative-draft-model-path",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
    ]:
        assert flag in argv, flag
    assert "--chunked-prefill-size=-1" in argv  # a dash-led value is glued to its flag
    assert argv[-2:] == ["--attention-backend", "triton"]


def test_a_value_a_release_lacks_is_an_error_not_a_drop() -> None:
    c = ServerConfig(model_path="m", kv_cache_dtype="mxfp8")
    assert "mxfp8" in render_argv(c, "0.5.23")
    with pytest.raises(UnsupportedFlagError, match=r"SGLang 0.5.4 .*kv_cache_dtype.*accepts"):
        render_argv(c, "0.5.4")
    dspark = ServerConfig(model_path="m", speculative=SpeculativeConfig("DSPARK"))
    with pytest.raises(UnsupportedFlagError, match=r"speculative\.algorithm"):
        render_argv(dspark, "0.5.4")


def test_server_command_and_bench_module() -> None:
    assert server_command("0.5.23") == ["python3", "-m", "sglang.launch_server"]
    assert server_command(target="twin", python="/v/bin/python") == ["/v/bin/python", "-m", "dsv4lab.twin"]
    assert resolve_release("0.5.4").bench_module == "sglang.bench_serving"
    assert resolve_release("0.5.23").bench_module == "sglang.benchmark.serving"


# -- scripts ----------------------------------------------------------------------------------------------


def _bash_n(script: str) -> None:
    proc = subprocess.run([BASH, "-n"], input=script, text=True, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("version", [r.version for r in RELEASES])
@pytest.mark.parametrize("make", [config_a, config_b, config_b_fixed])
def test_scripts_pass_bash_n(version: str, make: object) -> None:
    config = make()  # type: ignore[operator]
    for target in ("sglang", "twin"):
        script = render_launch_script(config, run_dir="~/runs/x y", sglang_version=version, target=target)
        _bash_n(script)
        assert script.startswith("#!/usr/bin/env bash\n")
        assert "set -euo pipefail" in script
    _bash_n(render_env_file(config))


def test_env_file_exports_story_nccl_settings(tmp_path: Path) -> None:
    env_sh = tmp_path / "env.sh"
    env_sh.write_text(render_env_file(config_a()), encoding="utf-8")
    out = subprocess.run(
        [BASH, "-c", 'source "$1"; echo "$NCCL_PROTO/$NCCL_ALGO"', "_", str(env_sh)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == "LL/Ring"


# A stand-in server: prints its argv and the DSV4T_ environment as JSON, then exits with a chosen status.
STAND_IN = (
    "import json, os, sys\n"
    "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
    "if k.startswith('DSV4T_')}}), flush=True)\n"
    "code = int(os.environ.get('STAND_IN_EXIT', '0'))\n"
    "if code == 137:\n"
    "    os.kill(os.getpid(), 9)\n"
    "sys.exit(code)\n"
)


def _fake_sglang(root: Path) -> Path:
    """A stand-in ``sglang`` package with a configs directory like the real one's (for the install step)."""
    configs = root / "site" / "sglang" / "srt" / "layers" / "quantization" / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    (root / "site" / "sglang" / "__init__.py").write_text("", encoding="utf-8")
    shipped = "N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"
    (configs / shipped).write_text("{}", encoding="utf-8")
    return configs


def _run_script(
    config: ServerConfig, run_dir: Path, *, extra_env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    run_dir.mkdir(parents=True, exist_ok=True)
    _fake_sglang(run_dir.parent)
    layout = RunLayout(str(run_dir))
    Path(layout.env_file).write_text(render_env_file(config), encoding="utf-8")
    script = render_launch_script(config, run_dir=str(run_dir), command=[sys.executable, "-c", STAND_IN])
    Path(layout.script).write_text(script, encoding="utf-8")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(run_dir),
        "PYTHONPATH": str(run_dir.parent / "site"),
        **(extra_env or {}),
    }
    proc = subprocess.run([BASH, layout.script], capture_output=True, text=True, timeout=60, env=env)
    log = Path(layout.log).read_text(encoding="utf-8")
    last = log.strip().splitlines()[-1] if log.strip() else ""
    record = json.loads(last) if last.startswith("{") else {}
    return proc.returncode, record


def test_script_records_pid_and_exit_status(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, record = _run_script(config_b_fixed(), run)
    layout = RunLayout(str(run))
    assert code == 0
    assert record["argv"] == render_argv(config_b_fixed())
    assert int(Path(layout.server_pid).read_text()) > 0
    assert Path(layout.server_exit).read_text().strip() == "0"
    assert Path(layout.launcher_exit).read_text().strip() == "0"
    assert int(Path(layout.launcher_pid).read_text()) > 0


def test_tuned_kernel_configs_are_installed_into_sglang(tmp_path: Path) -> None:
    run = tmp_path / "run"
    tuned = run / "dsv4-kernel-configs"  # the preset's ~/dsv4-kernel-configs, with HOME = run dir
    tuned.mkdir(parents=True)
    gpu = "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
    name = f"N=4096,K=512,device_name={gpu},dtype=fp8_w8a8,block_shape=[128, 128].json"
    (tuned / name).write_text('{"1": {}}', encoding="utf-8")
    code, _ = _run_script(config_a(), run)
    assert code == 0
    assert (_fake_sglang(tmp_path) / name).read_text() == '{"1": {}}'


def test_missing_tuned_configs_are_reported_in_the_log(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, _ = _run_script(config_a(), run)
    assert code == 0
    assert "no N=*.json kernel configs" in Path(RunLayout(str(run)).log).read_text()


def test_sigkilled_server_records_137(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, _ = _run_script(config_a(), run, extra_env={"STAND_IN_EXIT": "137"})
    assert code == 137
    assert Path(RunLayout(str(run)).server_exit).read_text().strip() == "137"


def test_failed_env_file_is_recorded_as_launcher_exit(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = config_a().replace(env_files=(str(tmp_path / "missing env.sh"),))
    code, record = _run_script(config, run)
    layout = RunLayout(str(run))
    assert code != 0 and record == {}
    assert not Path(layout.server_pid).exists()
    assert Path(layout.launcher_exit).read_text().strip() == str(code)
    assert "missing env.sh: No such file or directory" in Path(layout.log).read_text()


_PIECES = [*"ab -_./'\"`$();&|<>*?![]{}#~\\\té", "$(touch PWNED)", "'; touch PWNED; '", "`touch PWNED`"]
_hostile_line = (
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12).map("".join).filter(lambda s: s.strip() != "")
)
_hostile_any = st.lists(st.sampled_from([*_PIECES, "\n"]), max_size=12).map("".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model=_hostile_line,
    name=_hostile_line,
    kernel_dir=_hostile_line,
    env_value=_hostile_any,
    dir_name=_hostile_line.map(lambda s: s.replace("/", "_").replace("~", "_")),
    extra=_hostile_line,
)
def test_hostile_values_never_run_and_argv_comes_back_identical(
    tmp_path: Path, model: str, name: str, kernel_dir: str, env_value: str, dir_name: str, extra: str
) -> None:
    base = tmp_path / "case"
    if base.exists():
        shutil.rmtree(base)
    run = base / f"run {dir_name}"
    env_file = base / f"env {dir_name}.sh"
    base.mkdir()
    env_file.write_text("export DSV4T_FROM_FILE=yes\n", encoding="utf-8")
    config = ServerConfig(
        model_path=model,
        served_model_name=name,
        tp=8,
        env={"DSV4T_VALUE": env_value},
        env_files=(str(env_file),),
        extra_args=(f"--attention-backend={extra}",),
    )
    config = config.replace(kernel_config_dir=kernel_dir) if not kernel_dir.startswith("-") else config
    code, record = _run_script(config, run)
    assert code == 0, record
    assert record["argv"] == render_argv(config)
    assert record["env"] == {"DSV4T_VALUE": env_value, "DSV4T_FROM_FILE": "yes"}
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


_any_line = st.text(st.characters(codec="utf-8", exclude_characters="\x00\n\r"), min_size=1, max_size=24).filter(
    lambda s: s.strip() != ""
)
_any_value = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=24).filter(
    lambda s: "[redacted]" not in s  # the placeholder of a redacted file is refused on purpose
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model=_any_line,
    name=_any_line,
    env=st.dictionaries(st.from_regex(r"DSV4T_[A-Za-z0-9_]{1,8}", fullmatch=True), _any_value, max_size=4),
    extra=_any_value,
)
def test_arbitrary_values_reach_the_server_byte_for_byte(
    tmp_path: Path, model: str, name: str, env: dict[str, str], extra: str
) -> None:
    """Any text at all (unicode, quotes, spaces, a leading dash, newlines in env values) in every field that
    reaches the command line or the environment arrives exactly as given, and nothing runs."""
    base = tmp_path / "case"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir()
    config = ServerConfig(
        model_path=model, served_model_name=name, env=env, extra_args=(f"--attention-backend={extra}",)
    )
    code, record = _run_script(config, base / "run")
    assert code == 0, record
    assert record["argv"] == render_argv(config)
    assert record["env"] == env
    assert not list(tmp_path.rglob("PWNED"))
