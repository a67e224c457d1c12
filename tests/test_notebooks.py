"""The campaign is the notebooks: stored clean, parameters checked before a kernel starts, and the story run
by papermill on real kernels against the twin — from an installed copy of the package, outside the checkout —
leaving results under stable names and reports that open offline in a real browser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from dsv4lab.errors import ConfigError
from dsv4lab.notebook.nbrun import NOTEBOOK_DIR, check_parameters, find_notebook, list_notebooks, notebook_parameters
from tests.browser import launch_chromium
from tests.figures import problems, read_page

#: The campaigns take the host's campaign lock and the module's campaign fixture must run once: `make test`
#: gives each file to one pytest-xdist worker (--dist loadfile), and this one is scheduled first.
pytestmark = [pytest.mark.campaign, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
STORY = [
    "01_config_a_baseline",
    "02_config_b_mtp_launch",
    "03_mtp_oom_diagnosis",
    "04_config_b_fixed",
    "05_ab_comparison",
    "06_decode_kernel_profile",
]

# -- stored notebooks ----------------------------------------------------------------------------------------


def test_the_repository_and_the_package_hold_the_same_notebooks() -> None:
    assert (ROOT / "dsv4lab" / "notebooks").resolve() == (ROOT / "notebooks").resolve()
    assert set(STORY) <= set(list_notebooks())


@pytest.mark.parametrize("name", [*STORY, "lab"])
def test_notebooks_are_stored_clean(name: str) -> None:
    nb = nbformat.read(str(NOTEBOOK_DIR / f"{name}.ipynb"), as_version=4)  # type: ignore[no-untyped-call]
    assert nb.metadata["kernelspec"]["name"] == "python3"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged parameters"
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        assert not cell.outputs and cell.execution_count is None, "committed without outputs"
        code = [line for line in cell.source.splitlines() if line.strip() and not line.strip().startswith("#")]
        if "parameters" in cell.metadata.get("tags", []):
            # Declarations only, one per line (papermill reads them; the runner checks them): any number.
            odd = [line for line in code if not re.match(r"^\w+: [\w\[\], ]+ = [^=]+$", line)]
            assert odd == [], f"the parameters cell declares one name per line: {odd}"
            continue
        assert len(code) <= 15, f"a cell of {len(code)} lines: logic belongs in dsv4lab/"
    for line in tagged[0].source.splitlines():
        if line.strip():
            # papermill reads `name: type = default  # help`, one "=" per line, or it drops the parameter
            assert line.count("=") == 1 and "  # " in line, f"parameter line papermill cannot read: {line!r}"


@pytest.mark.parametrize("name", STORY)
def test_every_parameter_has_a_type_and_help(name: str) -> None:
    params = notebook_parameters(name)
    assert {"host", "target", "hardware", "pace", "run_dir"} <= set(params)
    for p in params.values():
        assert p.type_name in ("str", "int", "float", "bool", "list"), p
        assert len(p.help) > 10, p


def test_parameters_are_checked_before_a_kernel_starts() -> None:
    with pytest.raises(ConfigError, match=r"parameter 'concurency' of 01_config_a_baseline.*'concurrency'"):
        check_parameters("01_config_a_baseline", {"concurency": [1, 16]})
    with pytest.raises(ConfigError, match=r"parameter pace of 02_config_b_mtp_launch='fast'.*a number"):
        check_parameters("02", {"pace": "fast"})
    with pytest.raises(ConfigError, match=r"parameter repeats of 05_ab_comparison.*an integer"):
        check_parameters("05_ab_comparison", {"repeats": 2.5})
    assert check_parameters("01", {"concurrency": "1,16", "pace": "0.02", "input_len": "512"}) == {
        "concurrency": [1, 16],
        "pace": 0.02,
        "input_len": 512,
    }
    with pytest.raises(ConfigError, match="notebook"):
        find_notebook("07_does_not_exist")


def _cli(args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 900.0) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "dsv4lab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )


def test_run_refuses_a_wrong_parameter_with_one_line(tmp_path: Path) -> None:
    out = _cli(["run", "01", "-p", "concurrency", "one,two", "--reports", str(tmp_path)])
    assert out.returncode == 2 and out.stderr.startswith("Error: ") and "Traceback" not in out.stderr
    assert not list(tmp_path.iterdir())  # nothing ran, nothing was made


def test_a_failing_notebook_leaves_its_report_and_exits_non_zero(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("divisor: int = 1  # what to divide by")  # type: ignore[no-untyped-call]
    params.metadata["tags"] = ["parameters"]
    nb.cells += [
        nbformat.v4.new_markdown_cell("# A notebook with a bug"),  # type: ignore[no-untyped-call]
        params,
        nbformat.v4.new_code_cell("print('before')"),  # type: ignore[no-untyped-call]
        nbformat.v4.new_code_cell("1 / divisor"),  # type: ignore[no-untyped-call]
        nbformat.v4.new_code_cell("print('never')"),  # type: ignore[no-untyped-call]
    ]
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, str(path))  # type: ignore[no-untyped-call]
    out = _cli(["run", str(path), "-p", "divisor", "0", "--reports", str(tmp_path / "reports")], timeout=300)
    assert out.returncode == 10, out.stderr
    assert "ZeroDivisionError" in out.stderr and "report.html#papermill-error-cell" in out.stderr
    report = Path(out.stdout.strip().splitlines()[-1])
    html = report.read_text()
    assert 'id="papermill-error-cell"' in html and "failed: see the failing cell" in html
    results = json.loads((report.parent / "results.json").read_text())
    assert results["status"] == "failed" and "ZeroDivisionError" in results["error"]


# -- the campaign, from an installed copy ----------------------------------------------------------------------


@dataclass(frozen=True)
class Campaign:
    index: Path
    stdout: str
    steps: dict[str, Path]
    figures: dict[str, dict[str, Any]]
    env: dict[str, str]
    workdir: Path


def _installed_copy(tmp: Path) -> Path:
    """The package as ``pip install .`` lays it out (built wheel, unpacked), away from the checkout."""
    wheels = tmp / "wheel"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    site = tmp / "site"
    with zipfile.ZipFile(next(wheels.glob("*.whl"))) as whl:
        whl.extractall(site)
    return site


#: The campaign fixture's own limit: it is charged to whichever test asks for it first (275-300 s under a full
#: suite's load, over pytest-timeout's default 300 s once).
CAMPAIGN_SETUP_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    tmp = tmp_path_factory.mktemp("campaign")
    site = _installed_copy(tmp)
    workdir = tmp / "elsewhere"
    workdir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = _cli(
        ["campaign", "--reports", "reports"],  # the twin in virtual time, as make demo runs it
        env=env,
        cwd=workdir,
        timeout=CAMPAIGN_SETUP_TIMEOUT_S - 60,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    index = Path(out.stdout.strip().splitlines()[-1])
    state = json.loads((index.parent / "campaign.json").read_text())["steps"]
    steps = {k: Path(v["run_dir"]) for k, v in state.items()}
    figures = {k: json.loads((d / "results.json").read_text())["figures"] for k, d in steps.items()}
    return Campaign(index, out.stdout, steps, figures, env, workdir)


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_the_campaign_ran_from_the_installed_copy(campaign: Campaign) -> None:
    assert campaign.index.name == "index.html" and campaign.index.is_file()
    assert campaign.index.is_relative_to(campaign.workdir)
    for d in campaign.steps.values():
        env = json.loads((d / "env.json").read_text())
        assert env["git"] is None  # not run from the checkout
        params = json.loads((d / "params.json").read_text())
        assert Path(params["run_dir"]).is_absolute() and Path(params["run_dir"]) == d
        assert {"notebook.ipynb", "report.html", "results.json", "params.json", "env.json"} <= {
            p.name for p in d.iterdir()
        }


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_results_hold_the_contracts_figures(campaign: Campaign) -> None:
    f = campaign.figures
    assert {"output_throughput_c1", "output_throughput_c16", "fp8_gain", "attention_share"} <= set(f["a"])
    assert {"verdict", "detected_after_s"} <= set(f["b"])
    assert {"oom_gpu", "short_by_gib", "chosen_fix"} <= set(f["diagnosis"])
    for key in ("mtp_gain_c1", "mtp_gain_c16"):
        gain = f["ab"][key]
        assert {"rel", "ci", "verdict"} <= set(gain) and len(gain["ci"]) == 2


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_the_story_emerges(campaign: Campaign) -> None:
    f = campaign.figures
    assert f["a"]["fp8_kernels_tuned"] is True and f["a"]["verdict"] == "READY"
    assert 0.0 < f["a"]["fp8_gain"]["rel"] < 0.15  # autotuning: real, but small
    assert f["a"]["nccl_gain"]["verdict"] != "worse"
    assert f["b"]["verdict"] == "CRASHED" and f["b"]["exit_status"] == 137 and f["b"]["detected_after_s"] < 1.5
    d = f["diagnosis"]
    assert d["oom_gpu"] == 1 and d["phase"] == "cuda_graph_capture" and 17 < d["short_by_gib"] < 23
    assert "--mem-fraction-static 0.60" in d["chosen_fix"] and "16" in d["chosen_fix"]
    assert f["fixed"]["verdict"] == "READY" and f["fixed"]["fix"] == d["chosen_fix_overrides"]  # not retyped
    assert f["ab"]["mtp_gain_c1"]["verdict"] == "better" and 0.25 < f["ab"]["mtp_gain_c1"]["rel"] < 0.7
    assert abs(f["ab"]["mtp_gain_c16"]["rel"]) < 0.12  # the verifier saturates: nothing to gain at 16
    assert 0.55 < f["kernels"]["attention_share"] < 0.72 and "sparse_mla" in f["kernels"]["top_kernel"]
    assert f["kernels"]["gap_to_goal"] > 20
    # Each lever's throughputs come with the workload they were measured on (they differ between levers).
    assert f["a"]["fp8_gain"]["workload"] == "8,000 in / 128 out tokens per request"
    assert "in / " in f["ab"]["mtp_gain_c1"]["workload"]
    assert "8,000 in / 128 out tokens per request" in campaign.index.read_text()


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_every_report_opens_offline_with_its_charts(campaign: Campaign, tmp_path: Path) -> None:
    pages = [campaign.index, *(d / "report.html" for d in campaign.steps.values())]
    with launch_chromium() as browser:
        for page_path in pages:
            assert page_path.stat().st_size < 2 * 1024 * 1024, f"{page_path} is over 2 MB"
            html = page_path.read_text()
            assert "<script src=" not in html and "cdn" not in html.lower()
            context = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
            page = context.new_page()
            requests: list[str] = []
            errors: list[str] = []
            page.on("request", lambda r, out=requests: out.append(r.url))
            page.on("console", lambda m, out=errors: out.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e, out=errors: out.append(str(e)))
            page.goto(page_path.as_uri(), wait_until="load")
            charts = page.evaluate(
                "Array.from(document.images).filter(i => i.src.startsWith('data:image/svg'))"
                ".map(i => [i.naturalWidth, i.getBoundingClientRect().width])"
            )
            # Each chart says what it shows: the alt text is its title (inline SVGs carry it as their label).
            unnamed = page.evaluate(
                "[...document.images].filter(i => !(i.alt || '').trim() || i.alt.startsWith('No description'))"
                ".map(i => i.src.slice(0, 60)).concat([...document.querySelectorAll('svg.marks')]"
                ".filter(s => !(s.getAttribute('aria-label') || '').trim()).map(() => 'inline svg'))"
            )
            page.screenshot(path=str(tmp_path / f"{page_path.parent.name}.png"), full_page=True)
            context.close()
            assert [r for r in requests if not r.startswith(("file:", "data:"))] == [], page_path
            assert errors == [], (page_path, errors)
            assert charts, f"no chart in {page_path}"
            assert unnamed == [] and "No description has been provided" not in html, (page_path, unnamed)
            assert all(natural > 0 and shown > 100 for natural, shown in charts), (page_path, charts)


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_every_figure_says_its_unit_and_its_clock(campaign: Campaign) -> None:
    """Reports and the index read on the modelled hardware: no number without its unit, every time axis on the
    modelled clock, nothing above the roofline. (A twin's figures have one clock now, its stamps'.)"""
    from dsv4lab.model.roofline import decode_roofline

    roofline = max(decode_roofline("rtx-pro-6000-x8", concurrency=c).tok_s for c in (1, 16))
    found = []
    for page in [campaign.index, *(d / "report.html" for d in campaign.steps.values())]:
        found += problems(read_page(page.read_text(), page.parent.name), twin=True, max_tok_s=roofline)
    assert found == []


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_the_index_leads_with_one_headline_per_config(campaign: Campaign) -> None:
    html = campaign.index.read_text()
    page = read_page(html)
    heads = next(t for t in page.tables if t.headers[:3] == ["config", "concurrency", "headline"])
    keys = [(r[0], r[1]) for r in heads.rows]
    assert len(keys) == len(set(keys))  # one row, so one headline, per config and concurrency
    a16 = next(r for r in heads.rows if r[:2] == ["config-a", "16"])
    assert "mean of 3 runs" in a16[3] and "A/B" in a16[3] and "8,000 in / 256 out" in a16[3]
    assert "benchmark, step a" in a16[4] and "lever A/B against untuned-fp8, step a" in a16[4]
    assert "profile step, step kernels" in a16[4]
    # Every config measured, on one frontier: a key chart of the index, an image whose alt text names it.
    assert 'alt="Every config measured: throughput per GPU against interactivity"' in html


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_a_rerun_resumes_instead_of_redoing(campaign: Campaign) -> None:
    out = _cli(["campaign", "--reports", "reports"], env=campaign.env, cwd=campaign.workdir)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("(reused)") == len(STORY)
    assert Path(out.stdout.strip().splitlines()[-1]) == campaign.index


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_make_demo_is_the_campaign_and_prints_its_index_last(campaign: Campaign) -> None:
    out = _cli(["demo", "--reports", "reports"], env=campaign.env, cwd=campaign.workdir)
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip().splitlines()[-1]) == campaign.index  # resumed: every step reused


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_one_notebook_from_the_installed_copy(campaign: Campaign, tmp_path: Path) -> None:
    b_dir = campaign.figures["b"]["server_dir"]
    out = _cli(
        ["run", "03_mtp_oom_diagnosis", "-p", "crash_run_dir", b_dir, "--reports", str(tmp_path)],
        env=campaign.env,
        cwd=campaign.workdir,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    run_dir = Path(out.stdout.strip().splitlines()[-1]).parent
    figures = json.loads((run_dir / "results.json").read_text())["figures"]
    assert figures["chosen_fix"] == campaign.figures["diagnosis"]["chosen_fix"]


@pytest.mark.timeout(CAMPAIGN_SETUP_TIMEOUT_S)  # the module fixture runs the campaign first
def test_a_step_run_again_under_load_gives_the_same_figures(campaign: Campaign, tmp_path: Path) -> None:
    """The twin keeps its own time: step 04 (launch Config B-fixed, benchmark it at 1 and 16) made again while
    two busy loops hold both cores reads the same figures as in the campaign, to the last bit."""
    diagnosis = str(campaign.steps["diagnosis"])
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        out = _cli(
            ["run", "04_config_b_fixed", "-p", "diagnosis_run_dir", diagnosis, "--reports", str(tmp_path)],
            env=campaign.env,
            cwd=campaign.workdir,
        )
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert out.returncode == 0, out.stderr[-2000:]
    run_dir = Path(out.stdout.strip().splitlines()[-1]).parent
    again = json.loads((run_dir / "results.json").read_text())
    first = json.loads((campaign.steps["fixed"] / "results.json").read_text())
    assert again["figures"] == first["figures"]
    assert again["measurements"] == first["measurements"]
    assert first["figures"]["output_throughput_c16"] > 0


# -- sweeps and a real host --------------------------------------------------------------------------------------


def test_a_sweep_runs_the_grid_and_skips_what_the_model_says_cannot_fit(tmp_path: Path) -> None:
    args = ["sweep", "04_config_b_fixed", "--reports", str(tmp_path)]
    args += ["-p", "cuda_graph_max_bs", "16,64", "-p", "mem_fraction_static", "0.9", "-p", "concurrency", "[1]"]
    args += ["-p", "input_len", "1000", "-p", "output_len", "16"]
    out = _cli(args, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    index = Path(out.stdout.strip().splitlines()[-1])
    points = json.loads((index.parent / "sweep.json").read_text())["points"]
    by_cap = {p["cuda_graph_max_bs"]: p for p in points}
    assert by_cap[16]["status"] == "ok" and by_cap[16]["predicted"].startswith("fits")
    assert by_cap[16]["verdict"] == "READY" and by_cap[16]["output_throughput_c1"] > 0
    assert by_cap[64]["status"] == "skipped" and by_cap[64]["predicted"].startswith("OOM")
    html = index.read_text()
    assert "<svg" in html and "skipped" in html and "report.html" in html
    # The points' frontier: throughput per GPU against tok/s per user, on the modelled hardware's clock.
    assert "Every point: throughput per GPU against interactivity" in html
    assert "output throughput per GPU (tok/s, modelled hardware)" in html
    # The sweep says what it held fixed and over what base, with units, in the index, sweep.json and terminal.
    sweep = json.loads((index.parent / "sweep.json").read_text())
    assert sweep["swept"] == ["cuda_graph_max_bs"] and sweep["fixed"]["mem_fraction_static"] == 0.9
    assert sweep["fixed"]["concurrency"] == [1] and sweep["fixed"]["preset"] == "config_b"
    assert sweep["title"] == "Sweep of cuda_graph_max_bs over config_b with mem_fraction_static=0.9"
    assert sweep["title"] in html and "mem_fraction_static=0.9" in html and "output tok/s at C=1" in html
    assert "predicted fits" in html and ">yes<" in html  # a boolean figure is a filled column
    assert problems(read_page(html, "sweep index"), twin=True) == []
    assert "short by" in " ".join(sweep["notes"]) and "--run-predicted-oom" in html
    assert sweep["title"] in out.stdout and "output tok/s at C=1" in out.stdout  # the terminal shows the table


def test_the_campaign_runs_against_a_host_over_ssh(sshd: Any, tmp_path: Path) -> None:
    """``host = "<ssh alias>"``: the same notebooks, the server on the other end of a real OpenSSH connection."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host gpubox\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {sshd.key_path}\n"
    )
    (home / ".ssh" / "known_hosts").write_text(sshd.host_key_line + "\n")
    spec = tmp_path / "over-ssh.toml"
    spec.write_text(
        '[campaign]\nname = "over-ssh"\n\n[parameters]\nhost = "gpubox"\ntarget = "twin"\n'
        f'python = "{sys.executable}"\n\n'
        '[[step]]\nid = "b"\nnotebook = "02_config_b_mtp_launch"\n\n'
        '[[step]]\nid = "diagnosis"\nnotebook = "03_mtp_oom_diagnosis"\ninputs = { crash_run_dir = "b.server_dir" }\n'
    )
    env = {**os.environ, "HOME": str(home)}
    out = _cli(["campaign", str(spec), "--reports", str(tmp_path / "reports")], env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    state = json.loads((Path(out.stdout.strip().splitlines()[-1]).parent / "campaign.json").read_text())["steps"]
    b = json.loads((Path(state["b"]["run_dir"]) / "results.json").read_text())["figures"]
    d = json.loads((Path(state["diagnosis"]["run_dir"]) / "results.json").read_text())["figures"]
    assert b["verdict"] == "CRASHED" and d["oom_gpu"] == 1
    record = json.loads((Path(b["server_dir"]) / "server.json").read_text())
    assert record["host_spec"] == "gpubox" and record["run_dir"] != b["server_dir"]  # it ran over there
    assert (Path(b["server_dir"]) / "server.log").is_file()  # and its log came home for the diagnosis
    assert (Path(b["server_dir"]) / "gpu_memory.csv").stat().st_size > 100  # sampled over the same connection


def test_sweep_points_from_a_toml_file(tmp_path: Path) -> None:
    points = tmp_path / "points.toml"
    points.write_text(
        "[[point]]\nmem_fraction_static = 0.9\ncuda_graph_max_bs = 64\n\n"
        "[[point]]\nmem_fraction_static = 0.85\ncuda_graph_max_bs = 64\n"
    )
    out = _cli(["sweep", "04_config_b_fixed", "--points", str(points), "--reports", str(tmp_path)], timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]  # both predicted to run out of memory: skipped, nothing launched
    sweep = json.loads((Path(out.stdout.strip().splitlines()[-1]).parent / "sweep.json").read_text())
    assert [p["status"] for p in sweep["points"]] == ["skipped", "skipped"]
    assert all(p["predicted"].startswith("OOM") for p in sweep["points"])
    # Skipped points say by how much and what would fit instead (the model's first suggestion).
    notes = " ".join(sweep["notes"])
    assert "2 points skipped as predicted to run out of memory, short by" in notes
    assert "The memory model suggests:" in notes and "cuda_graph_max_bs=" in notes
    bad = tmp_path / "bad.toml"
    bad.write_text("[[point]]\nmem_fractio = 0.9\n")
    out = _cli(["sweep", "04_config_b_fixed", "--points", str(bad), "--reports", str(tmp_path)], timeout=120)
    assert out.returncode == 2 and "mem_fractio" in out.stderr
