"""Every name a user types is answered with the nearest known one: presets, config fields, notebooks and their
parameters, hardware and model profiles, SGLang releases, twin faults, campaign steps and parameters, sweep
parameters, panel fields, bench metrics, CLI commands and choices.

The CLI rows run the real ``dsv4lab`` in this process (exit status 2, one ``Error:`` line with the suggestion
and the allowed names); the library rows call the API a notebook calls and check the error it raises.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsv4lab import cli
from dsv4lab.config.hardware import hardware_profile
from dsv4lab.config.presets import config_a, preset
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.config.versions import resolve_release
from dsv4lab.errors import BenchError, ConfigError, UnknownNameError, VersionError, closest_name
from dsv4lab.notebook.nbrun import check_parameters, find_notebook
from dsv4lab.twin.faults import parse_fault

# -- the helper ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "choices", "meant"),
    [
        ("config_bb", ["config_a", "config_b", "config_b_fixed"], "config_b"),
        ("mem_frac", ["tp", "mem_fraction_static", "cuda_graph_max_bs"], "mem_fraction_static"),  # a prefix
        ("Mem-Fraction-Static", ["mem_fraction_static"], "mem_fraction_static"),  # case and dashes
        ("overide", ["host", "overrides", "preset"], "overrides"),
        ("paec", ["pace", "target"], "pace"),
        ("eagle", ["EAGLE", "EAGLE3", "NEXTN"], "EAGLE"),
        ("nope", ["nnodes", "tp"], None),  # nothing near: no guess
        ("gpu9000", ["rtx-pro-6000-x8", "h200-x8", "tiny"], None),
        ("c", ["config_a", "cuda_graph_bs"], None),  # too short to be a prefix of one
        ("", ["a"], None),
    ],
)
def test_closest_name(typed: str, choices: list[str], meant: str | None) -> None:
    assert closest_name(typed, choices) == meant


def test_the_message_names_the_guess_and_every_allowed_name() -> None:
    err = UnknownNameError("preset", "config_bb", ["config_a", "config_b", "config_b_fixed"])
    assert str(err) == (
        "unknown preset 'config_bb' — did you mean 'config_b'? (allowed: config_a, config_b, config_b_fixed)"
    )
    assert err.suggestion == "config_b" and err.choices == ("config_a", "config_b", "config_b_fixed")
    assert isinstance(err, ConfigError) and err.exit_code == 2 and err.field == "preset"
    assert str(UnknownNameError("preset", "zzz", ["config_a"])) == "unknown preset 'zzz' (allowed: config_a)"
    # re-raised where the caller knows more: the suggestion and the class stay
    moved = err.within("step a: ")
    assert isinstance(moved, UnknownNameError) and moved.suggestion == "config_b"
    assert str(moved).startswith("step a: unknown preset 'config_bb' — did you mean 'config_b'?")


# -- the CLI: exit status 2 and one line with the guess ------------------------------------------------------------

CAMPAIGN_TYPO = (
    '[campaign]\nname = "x"\n[[step]]\nid = "fix"\nnotebook = "03_mtp_oom_diagnosis"\n'
    '[[step]]\nid = "d"\nnotebook = "04_config_b_fixed"\ninputs = { diagnosis_run_dir = "fxi.run_dir" }\n'
)

CLI_ROWS: list[tuple[str, list[str], str]] = [
    ("preset", ["config", "show", "--preset", "config_bb"], "unknown preset 'config_bb' — did you mean 'config_b'?"),
    ("preset in diff", ["config", "diff", "config_a", "config_bb"], "did you mean 'config_b'?"),
    ("preset in preflight", ["preflight", "--preset", "config_bb"], "did you mean 'config_b'?"),
    (
        "config field in --set",
        ["config", "show", "--set", "mem_frac=0.6"],
        "unknown config field 'mem_frac' — did you mean 'mem_fraction_static'?",
    ),
    ("speculative field", ["config", "show", "--set", "speculative.num_step=2"], "'speculative.num_steps'?"),
    (
        "notebook in run",
        ["run", "01_config_aa"],
        "unknown notebook '01_config_aa' — did you mean '01_config_a_baseline'?",
    ),
    (
        "notebook in sweep",
        ["sweep", "04_config_b_fixd", "-p", "mem_fraction_static", "0.5,0.6"],
        "'04_config_b_fixed'?",
    ),
    (
        "notebook parameter",
        ["run", "01", "-p", "overide", "x"],
        "unknown parameter 'overide' of 01_config_a_baseline — did you mean 'overrides'?",
    ),
    (
        "preset parameter",
        ["run", "04", "-p", "preset", "config_bb"],
        "parameter preset of 04_config_b_fixed: unknown preset 'config_bb' — did you mean 'config_b'?",
    ),
    ("field in -p overrides", ["run", "01", "-p", "overrides", "mem_frac=0.6"], "'mem_fraction_static'?"),
    ("sweep parameter", ["sweep", "04", "-p", "mem_frac", "0.5,0.6"], "did you mean 'mem_fraction_static'?"),
    ("hardware", ["preflight", "--hardware", "h200"], "unknown hardware profile 'h200' — did you mean 'h200-x8'?"),
    ("hardware parameter", ["run", "01", "-p", "hardware", "tinyy"], "did you mean 'tiny'?"),
    ("twin hardware", ["launch", "--twin", "--hardware", "tinyy", "--run-dir", "r"], "did you mean 'tiny'?"),
    ("model", ["preflight", "--model", "deepseek-v4-flsh"], "did you mean 'deepseek-ai/DeepSeek-V4-Flash'?"),
    ("release", ["config", "render", "--sglang-version", "0.5.2x"], "did you mean '0.5.23'?"),
    (
        "twin fault",
        ["launch", "--twin", "--fault", "crash_servin", "--run-dir", "r"],
        "unknown twin fault 'crash_servin' — did you mean 'crash_serving'?",
    ),
    ("campaign parameter", ["campaign", "-p", "paec", "0.02"], "did you mean 'pace'?"),
    ("campaign step", ["campaign", "typo.toml"], "unknown earlier step 'fxi'"),
    ("kv cache dtype", ["config", "show", "--set", "kv_cache_dtype=fp8_e4m"], "did you mean 'fp8_e4m3'?"),
    ("speculative algorithm", ["config", "show", "--set", "speculative.algorithm=eagle"], "did you mean 'EAGLE'?"),
]


@pytest.mark.parametrize(("argv", "says"), [r[1:] for r in CLI_ROWS], ids=[r[0] for r in CLI_ROWS])
def test_the_cli_suggests_the_name_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "typo.toml").write_text(CAMPAIGN_TYPO, encoding="utf-8")
    status = cli.main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, (status, out, err)
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert says in lines[0], lines[0]
    assert "allowed: " in lines[0] or "known releases: " in lines[0], lines[0]
    assert not (tmp_path / "reports").exists() and not (tmp_path / "r").exists()  # refused before anything


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["lanch"], "argument COMMAND: unknown command 'lanch' — did you mean 'launch'?"),
        (["config", "shwo"], "unknown command 'shwo' — did you mean 'show'?"),
        (["config", "show", "--format", "tomll"], "argument --format: unknown value 'tomll' — did you mean 'toml'?"),
        (["config", "render", "--target", "twins"], "did you mean 'twin'? (allowed: sglang, twin)"),
    ],
)
def test_argparse_choices_and_commands_suggest_too(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


# -- the library: the named error, with its suggestion -------------------------------------------------------------


def _lab_launch() -> Any:
    from dsv4lab.notebook.lab import Lab

    with Lab("local", target="twin", hardware="tiny", progress=False, run_root="unused") as lab:
        return lab.launch("config_bb")


def _panel() -> Any:
    from dsv4lab.notebook.widgets import ConfigPanel

    return ConfigPanel(preset="config_bb", debounce_s=0, charts=False)


def _panel_set() -> Any:
    from dsv4lab.notebook.widgets import ConfigPanel

    ConfigPanel(preset="config_a", debounce_s=0, charts=False).set(mem_frac=0.6)


def _metric() -> Any:
    from dsv4lab.bench.stats import metric_value
    from tests.test_bench_stats import run

    return metric_value(run(1, 1.0), "output_throughputt")


LIBRARY_ROWS: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "preset()": (lambda: preset("config_bb"), UnknownNameError, "config_b"),
    "lab.launch(preset)": (_lab_launch, UnknownNameError, "config_b"),
    "ConfigPanel(preset)": (_panel, UnknownNameError, "config_b"),
    "ConfigPanel.set(field)": (_panel_set, UnknownNameError, "mem_fraction_static"),
    "with_values(field)": (
        lambda: config_a().with_values({"cuda_graph_max": 1}),
        UnknownNameError,
        "cuda_graph_max_bs",
    ),
    "from_dict(field)": (lambda: ServerConfig.from_dict({"model_path": "m", "tpp": 8}), UnknownNameError, "tp"),
    "find_notebook": (lambda: find_notebook("05_ab_comparsion"), UnknownNameError, "05_ab_comparison"),
    "check_parameters": (lambda: check_parameters("01", {"concurency": [1]}), UnknownNameError, "concurrency"),
    "hardware_profile": (lambda: hardware_profile("rtx-pro-600-x8"), UnknownNameError, "rtx-pro-6000-x8"),
    "parse_fault": (lambda: parse_fault("nccl_eror"), UnknownNameError, "nccl_error"),
    "resolve_release": (lambda: resolve_release("0.5.2x"), VersionError, "0.5.23"),
    "metric_value": (_metric, BenchError, "output_throughput"),
}


@pytest.mark.parametrize(("call", "error", "meant"), LIBRARY_ROWS.values(), ids=list(LIBRARY_ROWS))
def test_the_library_raises_the_named_error_with_the_guess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: Callable[[], Any], error: type[Exception], meant: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as raised:
        call()
    assert f"did you mean {meant!r}?" in str(raised.value), str(raised.value)
    if isinstance(raised.value, UnknownNameError):
        assert raised.value.suggestion == meant and meant in raised.value.choices
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_a_sweep_point_file_with_a_typo_is_refused_with_the_guess(tmp_path: Path) -> None:
    from dsv4lab.notebook.sweeps import load_points, run_sweep

    points = tmp_path / "points.toml"
    points.write_text("[[point]]\nmem_fracton_static = 0.6\n", encoding="utf-8")
    with pytest.raises(UnknownNameError, match="did you mean 'mem_fraction_static'"):
        run_sweep("04", None, points=load_points(points), reports_root=tmp_path / "reports")
    assert not (tmp_path / "reports").exists()
