"""The config panel without a browser: set values, click buttons, read what it shows — against the real twin.

ipywidgets run without a kernel here (a dummy comm): ``.value =`` and ``.click()`` are the public ways a
front end drives them. The preflight runs synchronously (``debounce_s=0``) unless a test is about the
debounce; long actions run in the panel's worker thread and the tests wait for them with bounded waits.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import papermill
import pytest

from dsv4lab import Lab
from dsv4lab.config.presets import config_b_fixed
from dsv4lab.config.server_config import ServerConfig, diff, field_help, field_names, load
from dsv4lab.config.versions import resolve_release
from dsv4lab.notebook.experiment import overrides_text, parse_overrides
from dsv4lab.notebook.nbrun import IOPUB_TIMEOUT_S
from dsv4lab.notebook.widgets import ConfigPanel, FieldControl, build_controls, field_specs
from dsv4lab.notebook.widgets import reproduce as ex
from dsv4lab.notebook.widgets.actions import Jobs, ResultsPane
from dsv4lab.notebook.widgets.controls import UNSET
from dsv4lab.notebook.widgets.logpane import LogPane
from tests.figures import problems, read_page

ROOT = Path(__file__).resolve().parents[1]
LAB_NOTEBOOK = ROOT / "notebooks" / "lab.ipynb"


def panel(**kwargs: Any) -> ConfigPanel:
    kwargs.setdefault("debounce_s", 0)
    kwargs.setdefault("charts", False)
    return ConfigPanel(**kwargs)


def short_by(p: ConfigPanel) -> float:
    m = re.search(r"OOM in cuda_graph_capture on GPU 1, short by ([\d.]+) GiB", p.view.verdict.value)
    assert m, p.view.verdict.value
    return float(m.group(1))


# -- controls from the dataclass -------------------------------------------------------------------------------


def test_every_field_has_a_control_with_its_help() -> None:
    controls = build_controls(resolve_release("0.5.23"))
    assert sorted(controls) == sorted(field_names())
    for name, c in controls.items():
        assert field_help(name) in html.unescape(c.help.value)
    assert controls["mem_fraction_static"].kind == "slider"
    assert controls["mem_fraction_static"].toggle is not None  # optional: "set" box
    assert controls["cuda_graph_max_bs"].input.max >= 512
    assert controls["disable_cuda_graph"].kind == "checkbox"
    assert controls["env"].kind == "env"
    assert controls["cuda_graph_bs"].kind == "text"
    assert controls["speculative.algorithm"].kind == "dropdown"


def test_dropdowns_offer_what_the_release_accepts() -> None:
    new = build_controls(resolve_release("0.5.23"))
    old = build_controls(resolve_release("0.4.10"))

    def options(c: FieldControl) -> list[Any]:
        return [v for _, v in c.input.options if v != UNSET]

    assert options(new["kv_cache_dtype"]) == list(resolve_release("0.5.23").kv_cache_dtypes)
    assert options(old["kv_cache_dtype"]) == ["auto", "fp8_e5m2", "fp8_e4m3"]
    assert "UNO" in options(new["speculative.algorithm"]) and "UNO" not in options(old["speculative.algorithm"])


def test_a_new_field_gets_a_control_without_touching_the_panel() -> None:
    @dataclasses.dataclass(frozen=True)
    class Extended(ServerConfig):
        swa_full_tokens_ratio: float | None = dataclasses.field(
            default=None, metadata={"help": "share of full-attention tokens", "min": 0.05, "max": 1.0, "step": 0.05}
        )
        attention_backend: str | None = dataclasses.field(default=None, metadata={"help": "attention kernels"})

    names = [s.name for s in field_specs(Extended)]
    assert names[-2:] == ["swa_full_tokens_ratio", "attention_backend"]
    controls = build_controls(resolve_release("0.5.23"), Extended)
    ratio = controls["swa_full_tokens_ratio"]
    assert ratio.kind == "slider" and ratio.input.min == 0.05 and ratio.input.max == 1.0
    assert controls["attention_backend"].kind == "text"
    assert "attention kernels" in controls["attention_backend"].help.value


# -- the live preflight ------------------------------------------------------------------------------------------


def test_b_fixed_fits_and_clearing_its_graph_cap_goes_red_with_the_shortfall_and_fixes() -> None:
    p = panel(preset="config_b_fixed", concurrency=[1, 16])
    assert p.verdict == "ok" and "fits" in p.view.verdict.value and not p.suggestion_buttons
    assert p.buttons["launch"].disabled is False

    p.controls["cuda_graph_max_bs"].toggle.value = False  # the user unticks "set"
    assert p.verdict == "fail"
    assert 8.0 < short_by(p) < 13.0  # about 10 GiB by today's model
    assert p.config is not None and p.config.cuda_graph_max_bs is None
    assert "unset: SGLang picks 256" in p.controls["cuda_graph_max_bs"].note.value
    # The pick is said once: the parked, greyed slider shows no readout of its own beside the note.
    assert p.controls["cuda_graph_max_bs"].input.disabled and not p.controls["cuda_graph_max_bs"].input.readout
    assert "(drop --cuda-graph-max-bs-decode)" in p.view.flags.value

    labels = [b.description for b in p.suggestion_buttons]
    assert labels[0] == "cuda_graph_max_bs = 16"  # the first captured size that serves concurrency 16
    assert any(label.startswith("mem_fraction_static = ") for label in labels)
    assert all(b.tooltip for b in p.suggestion_buttons)  # each says why

    p.suggestion_buttons[0].click()
    assert p.verdict == "ok"
    assert p.controls["cuda_graph_max_bs"].value() == 16
    assert p.controls["cuda_graph_max_bs"].input.readout  # set again: its value is its readout
    assert not p.changes  # back to exactly Config B-fixed
    assert "Same as Config B-fixed" in p.view.flags.value


def test_the_fraction_fix_moves_the_slider() -> None:
    p = panel(preset="config_b")
    assert p.verdict == "fail"
    fraction = next(b for b in p.suggestion_buttons if b.description.startswith("mem_fraction_static"))
    fraction.click()
    assert p.verdict == "ok"
    assert p.controls["mem_fraction_static"].input.value < 0.70
    assert "--mem-fraction-static" in p.view.flags.value


def test_changes_against_the_preset_are_shown_as_flags() -> None:
    p = panel(preset="config_b_fixed")
    p.set(mem_fraction_static=0.55, speculative__num_steps=2, speculative__num_draft_tokens=3)
    flags = p.view.flags.value
    assert "--mem-fraction-static 0.55" in flags and "--speculative-num-steps 2" in flags
    assert [c.field for c in p.changes] == [
        "mem_fraction_static",
        "speculative.num_steps",
        "speculative.num_draft_tokens",
    ]


def test_invalid_values_are_shown_at_the_control_never_raised() -> None:
    p = panel(preset="config_b_fixed")
    p.controls["context_length"].input.value = "lots"
    assert p.verdict == "invalid" and p.config is None
    assert "context_length='lots' is not valid: an integer" in p.errors()["context_length"]
    assert p.buttons["launch"].disabled and p.buttons["save"].disabled
    p.controls["context_length"].input.value = "32768"
    assert p.verdict == "ok" and not p.errors()

    p.set(speculative__num_draft_tokens=3)  # with topk 1 it must be steps + 1
    assert "num_steps + 1 = 2" in p.errors()["speculative.num_draft_tokens"]
    p.set(speculative__num_draft_tokens=2)

    p.controls["env"].input.value = "NCCL_PROTO=LL\nnot a variable"
    assert "NAME=value lines" in p.errors()["env"]
    p.controls["env"].input.value = "NCCL_PROTO=LL"

    p.set(tp=16)  # more GPUs than the host has: the preflight's error, at the tp slider
    assert "at most 8 GPUs" in p.errors()["tp"]
    p.set(tp=8)
    assert p.verdict == "ok"

    p.version_picker.value = "0.4.10"  # B-fixed's EAGLE stays, its dtype list shrinks: still valid
    assert p.verdict == "ok"
    p.version_picker.value = "0.5.23"
    p.set(kv_cache_dtype="nvfp4")
    p.version_picker.value = "0.5.4"  # 0.5.4 has no nvfp4: said at the dropdown
    assert "a value SGLang 0.5.4 accepts" in p.errors()["kv_cache_dtype"]


def test_unsetting_the_algorithm_turns_the_speculative_block_off() -> None:
    p = panel(preset="config_b_fixed")
    p.set(speculative__algorithm=None)
    assert p.config is not None and p.config.speculative is None
    assert p.controls["speculative.num_steps"].input.disabled
    assert p.verdict == "ok"


def test_the_preset_picker_loads_its_values() -> None:
    p = panel(preset="config_b_fixed")
    p.preset_picker.value = "config_a"
    assert Path(p.actions.notebook_picker.value).name == "01_config_a_baseline.ipynb"
    assert p.config == config_b_fixed().replace(speculative=None, mem_fraction_static=0.70, cuda_graph_max_bs=None)
    assert p.controls["speculative.algorithm"].value() is None
    assert not p.changes


def test_the_hardware_picker_reruns_the_preflight() -> None:
    p = panel(preset="config_b_fixed")
    p.hardware_picker.value = "h200-x8"
    assert p.preflight is not None and p.preflight.hardware == "h200-x8"


def test_changes_are_debounced_into_one_preflight() -> None:
    p = ConfigPanel(preset="config_b_fixed", debounce_s=0.2, charts=False)
    before = p.refreshes
    for f in (0.55, 0.56, 0.57, 0.58, 0.59):
        p.controls["mem_fraction_static"].input.value = f
    assert p.wait_idle(10)
    assert p.refreshes - before == 1
    assert p.config is not None and p.config.mem_fraction_static == 0.59


def test_the_budget_chart_is_drawn_for_the_deciding_gpu() -> None:
    p = ConfigPanel(preset="config_b", debounce_s=0, charts=True)
    assert p.wait_idle(60)
    svg = p.view.chart.svg
    assert "<svg" in svg and p.view.chart.last_error is None
    assert "GPU 1" in svg and "short" in svg


# -- actions against the twin ---------------------------------------------------------------------------------


@pytest.fixture
def twin_lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(pace=0.02, run_root=tmp_path / "runs")
    yield lab
    lab.close()


@pytest.mark.slow
def test_launch_watch_bench_diagnose_stop_on_the_twin(twin_lab: Lab) -> None:
    p = panel(lab=twin_lab, preset="config_b_fixed", concurrency="1 2", charts=True)
    assert twin_lab.progress is False  # the panel draws its own
    assert p.state == "no server" and p.buttons["bench"].disabled

    p.buttons["launch"].click()
    assert p.jobs.busy  # the click returned at once; the launch runs in the background
    assert p.wait_idle(120)
    assert p.state == "READY", p.results.texts
    assert any("READY" in t for t in p.results.texts)
    assert len(p.log.lines) > 20 and "READY" in {k.name for k in p.log.kinds()}
    # The pane draws at most every min_redraw_s (the line arrived, its draw may be a moment behind it).
    assert _drawn(p.log, lambda body: "dsv4lab-log-ready" in body or "dsv4lab-log-serving" in body), p.log.body.value
    assert p.gpu_chart.drawn >= 1 and "<svg" in p.gpu_chart.svg

    assert not p.buttons["bench"].disabled
    p.buttons["bench"].click()
    assert p.wait_idle(120)
    assert any(t.startswith("benchmark runs: C=1") and "C=2" in t for t in p.results.texts), p.results.texts
    assert any("<svg" in h for h in p.results.htmls)  # the chart after the table
    assert len(p.server.runs) == 2
    # Every figure the panel shows says its unit, and on the twin it is the modelled hardware's.
    for i, markup in enumerate(p.results.htmls):
        assert problems(read_page(markup, f"panel output {i}"), twin=True) == []

    p.buttons["diagnose"].click()
    assert p.wait_idle(60)
    assert p.results.texts[-1].startswith("diagnosis of config-b-fixed")

    p.buttons["stop"].click()
    assert p.actions._stopping is not None
    p.actions._stopping.join(30)
    assert p.state == "stopped" and p.server.stopped is not None
    assert p.buttons["stop"].disabled and p.buttons["bench"].disabled


@pytest.mark.slow
def test_a_predicted_oom_launched_anyway_crashes_with_its_diagnosis(twin_lab: Lab) -> None:
    p = panel(lab=twin_lab, preset="config_b")
    assert p.verdict == "fail"
    p.buttons["launch"].click()
    assert p.wait_idle(120)
    assert p.state == "CRASHED"
    card = p.results.htmls[-1]
    assert "CRASHED" in card and "CUDA graph capture" in card and "GPU 1" in card
    assert "OOM" in {k.name for k in p.log.kinds()}
    assert _drawn(p.log, lambda body: "dsv4lab-log-oom" in body), p.log.body.value
    assert p.buttons["bench"].disabled and not p.buttons["diagnose"].disabled


@pytest.mark.slow
def test_stop_while_starting_ends_the_launch(tmp_path: Path) -> None:
    lab = Lab(pace=0.3, run_root=tmp_path / "runs")
    try:
        p = panel(lab=lab, preset="config_a")
        p.buttons["launch"].click()
        for _ in range(200):  # bounded: until the server exists
            if p.server is not None:
                break
            p.jobs.wait_idle(0.05)
        assert p.server is not None and p.state == "starting"
        p.buttons["stop"].click()
        assert p.jobs.wait_idle(30)
        assert p.state in ("STOPPED", "stopped")
        assert not p.server.is_alive()
    finally:
        lab.close()


# -- files and experiments --------------------------------------------------------------------------------------


def test_save_toml_and_the_real_host_launch_script(tmp_path: Path) -> None:
    p = panel(preset="config_b_fixed")
    p.set(mem_fraction_static=0.58)
    p.actions.save_path.value = str(tmp_path / "tweak.toml")
    p.buttons["save"].click()
    assert load(tmp_path / "tweak.toml") == p.config
    p.buttons["script"].click()
    script = p.results.texts[-1]
    assert "--mem-fraction-static 0.58" in script and "--cuda-graph-max-bs-decode 16" in script
    assert "dsv4-kernel-configs" in script and "DSV4LAB_TWIN" not in script  # the real host's, not the twin's


def test_experiment_parameters_are_the_preset_plus_the_diff() -> None:
    tweaked = config_b_fixed().replace(cuda_graph_max_bs=None, mem_fraction_static=0.55, env={"A": "x y"})
    changes = diff(config_b_fixed(), tweaked)
    text = overrides_text(changes)
    assert text == "mem_fraction_static=0.55 cuda_graph_max_bs=none env.NCCL_PROTO=none env.NCCL_ALGO=none 'env.A=x y'"
    assert config_b_fixed().with_overrides(parse_overrides(text)) == tweaked  # what the experiment runner reads
    graphs = diff(config_b_fixed(), config_b_fixed().replace(cuda_graph_bs=(1, 2, 4, 8)))
    assert overrides_text(graphs) == "'cuda_graph_bs=1 2 4 8'"
    assert config_b_fixed().with_overrides(parse_overrides(overrides_text(graphs))).cuda_graph_bs == (1, 2, 4, 8)
    params = ex.experiment_parameters(
        preset="config_b_fixed",
        changes=changes,
        host="local",
        target="twin",
        hardware="rtx-pro-6000-x8",
        sglang_version="0.5.23",
        pace=0.05,
        concurrency=[1, 16],
        declared={"preset", "overrides", "concurrency", "host"},
    )
    assert params == {"host": "local", "preset": "config_b_fixed", "overrides": text, "concurrency": [1, 16]}
    nbs = [Path(n) for n in ("01_config_a_baseline.ipynb", "02_config_b_mtp.ipynb", "04_config_b_fixed.ipynb")]
    assert ex.matching_notebook("config_b", nbs) == nbs[1]
    assert ex.matching_notebook("config_b_fixed", nbs) == nbs[2]
    assert ex.matching_notebook("config_a", nbs) == nbs[0]


def _experiment_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(  # type: ignore[no-untyped-call]
        'host: str = "local"  # host\npreset: str = "config_a"  # preset\noverrides: str = ""  # changes\n'
        "concurrency: list = [1]  # levels"
    )
    cell.metadata["tags"] = ["parameters"]
    nb.cells.append(cell)
    path = folder / "04_config_b_fixed_try.ipynb"
    nbformat.write(nb, str(path))  # type: ignore[no-untyped-call]
    return path


def test_open_as_experiment_runs_the_matching_notebook_with_the_panels_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = _experiment_notebook(tmp_path)
    calls: list[tuple[Any, ...]] = []

    class Run:
        ok = True
        report = tmp_path / "reports" / "x" / "report.html"
        run_dir = tmp_path / "reports" / "x"

    def run_notebook(notebook: Any, parameters: Any, *, reports_root: Any = "reports") -> Run:
        calls.append((notebook, dict(parameters), reports_root))
        return Run()

    fake = types.ModuleType("dsv4lab.notebook.nbrun")
    fake.run_notebook = run_notebook  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dsv4lab.notebook.nbrun", fake)
    p = panel(preset="config_b_fixed", notebooks_dir=tmp_path, reports_root=tmp_path / "reports", concurrency=[1, 4])
    assert p.actions.notebook_picker.value == str(nb)
    p.set(mem_fraction_static=0.55)
    p.buttons["experiment"].click()
    assert p.wait_idle(30)
    assert calls == [
        (
            nb,
            {
                "host": "local",
                "preset": "config_b_fixed",
                "overrides": "mem_fraction_static=0.55",
                "concurrency": [1, 4],
            },
            tmp_path / "reports",
        )
    ]
    assert "report.html" in p.results.htmls[-1] and "<a href=" in p.results.htmls[-1]


def test_open_as_experiment_without_the_runner_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _experiment_notebook(tmp_path)
    monkeypatch.setitem(sys.modules, "dsv4lab.notebook.nbrun", None)  # import fails as if the module were missing
    p = panel(preset="config_b_fixed", notebooks_dir=tmp_path)
    p.buttons["experiment"].click()
    assert p.wait_idle(30)
    assert "dsv4lab.notebook.nbrun" in p.results.texts[-1]


# -- the parts ---------------------------------------------------------------------------------------------------


def test_action_errors_become_cards() -> None:
    results = ResultsPane()
    jobs = Jobs(results, lambda: None)

    def boom() -> None:
        1 / 0  # noqa: B018

    assert jobs.start("boom", boom)
    assert jobs.wait_idle(10)
    assert results.texts == ["boom failed: division by zero"]
    assert "traceback" in results.htmls[0]


def test_the_log_pane_keeps_the_last_lines_and_colours_them() -> None:
    pane = LogPane(max_lines=3, min_redraw_s=0)
    pane.append(
        [
            "[2026-01-01 00:00:00] Load weight begin. avail mem=95.00 GB",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.48 GiB",
            "[2026-01-01 00:00:09] The server is fired up and ready to roll!",
            "plain line",
        ]
    )
    assert len(pane.lines) == 3 and pane.count == 4
    body = pane.body.value
    assert "dsv4lab-log-oom" in body and "#cf222e" in body and "dsv4lab-log-ready" in body


def test_the_last_lines_of_a_burst_are_drawn_when_no_more_come() -> None:
    pane = LogPane(min_redraw_s=0.2)
    pane.append(["[2026-01-01 00:00:00] Load weight begin. avail mem=95.00 GB"])  # drawn at once
    pane.append(["[2026-01-01 00:00:09] The server is fired up and ready to roll!"])  # held back by the throttle
    assert "dsv4lab-log-ready" not in pane.body.value
    # Nothing else arrives and nobody calls flush(): the held-back draw is made within the throttle's interval.
    assert _drawn(pane, lambda body: "dsv4lab-log-ready" in body, within_s=2.0)


# -- the notebook ---------------------------------------------------------------------------------------------------


def test_lab_notebook_is_a_clean_template() -> None:
    nb = nbformat.read(str(LAB_NOTEBOOK), as_version=4)  # type: ignore[no-untyped-call]
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert [c for c in code if "parameters" in c.metadata.get("tags", [])] == [code[0]]
    assert all(len(c.source.splitlines()) <= 15 for c in code)
    widget_cells = [c for c in code if "ConfigPanel" in c.source or "panel." in c.source]
    assert widget_cells and all("skip-execution" in c.metadata.get("tags", []) for c in widget_cells)
    params = papermill.inspect_notebook(str(LAB_NOTEBOOK))
    assert params["host"]["default"] == '"local"' and params["host"]["help"]
    assert all(p["help"] for p in params.values())


@pytest.mark.slow
def test_lab_notebook_runs_headless_and_skips_the_panel(tmp_path: Path) -> None:
    out = tmp_path / "lab.out.ipynb"
    executed = papermill.execute_notebook(
        str(LAB_NOTEBOOK),
        str(out),
        cwd=str(tmp_path),
        kernel_name="python3",
        progress_bar=False,
        iopub_timeout=IOPUB_TIMEOUT_S,  # nbclient's 4 s drops outputs on a loaded CI machine
    )
    assert not executed.metadata.papermill.exception
    text = out.read_text()
    assert "memory preflight" in text  # the headless cell ran
    assert "application/vnd.jupyter.widget" not in text  # the panel did not
    skipped = [c for c in executed.cells if "skip-execution" in c.metadata.get("tags", [])]
    assert skipped and all(not c.outputs for c in skipped)


@pytest.mark.slow
def test_open_as_experiment_with_the_real_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The panel's tweak becomes a headless run of the step notebook, with a report that shows the tweak."""
    monkeypatch.chdir(tmp_path)
    lab = Lab(pace=0.02, run_root=tmp_path / "runs", progress=False)
    try:
        p = panel(lab=lab, preset="config_b_fixed", concurrency=[1], reports_root=tmp_path / "reports")
        assert Path(p.actions.notebook_picker.value).name == "04_config_b_fixed.ipynb"
        p.set(mem_fraction_static=0.58)
        p.buttons["experiment"].click()
        assert p.wait_idle(600)
        card = p.results.htmls[-1]
        assert "experiment 04_config_b_fixed" in card and ">ok<" in card, p.results.texts[-1]
        (params_file,) = (tmp_path / "reports").glob("*/params.json")
        params = json.loads(params_file.read_text())
        assert params["preset"] == "config_b_fixed" and params["overrides"] == "mem_fraction_static=0.58"
        assert params["concurrency"] == [1] and params["pace"] == 0.02
        assert "mem_fraction_static 0.58" in (params_file.parent / "report.html").read_text()
    finally:
        lab.close()


def _drawn(pane: LogPane, seen: Any, within_s: float = 5.0) -> bool:
    """Whether the pane's drawn body satisfies ``seen`` within ``within_s``."""
    import time

    deadline = time.monotonic() + within_s
    while not seen(pane.body.value):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
