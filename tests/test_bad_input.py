"""The bad-input table: one row per hostile or wrong value per entry point, each refused before anything runs.

Every row asserts what is shown — a :class:`~dsv4lab.errors.ConfigError` (or the CLI's one ``Error:`` line
with exit status 2) naming the field, parameter or option and what it allows — and what is kept: nothing.
No run dir, report folder or file appears in the working folder, and no process is left (or was started):
the rows run the real CLI in this process, in a fresh folder, and compare the folder and this process's
children before and after.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from dsv4lab import Lab, cli
from dsv4lab.bench.workload import sharegpt_workload
from dsv4lab.config.presets import config_a
from dsv4lab.config.server_config import ServerConfig, load
from dsv4lab.errors import BenchError, ConfigError, HostConnectionError, HostKeyError, LogError
from dsv4lab.logs import parse_log
from dsv4lab.model.memory import preflight
from dsv4lab.notebook.campaign import load_campaign
from dsv4lab.notebook.experiment import Experiment
from dsv4lab.notebook.nbrun import check_hosts, run_notebook
from dsv4lab.notebook.sweeps import load_points, run_sweep
from tests.sshd import SSHD, free_port

# -- the inputs the rows point at ---------------------------------------------------------------------------------

INPUTS: dict[str, str | bytes] = {
    "notoml.toml": "this is = = not toml\n",
    "unknown.toml": 'model_path = "deepseek-ai/DeepSeek-V4-Flash"\ntpp = 3\n',
    "wrongtype.toml": 'model_path = "deepseek-ai/DeepSeek-V4-Flash"\ntp = "8"\n',
    "list.json": "[1, 2]",
    "binary.toml": b"\x00\x01\xff\xfe" * 64,
    "binary.log": b"\x7fELF\x00\x00\x01" * 200,
    "garbage.log": "lorem ipsum\n" * 50,
    "notjson.json": "not json",
    "empty.json": "[]",
    "shape.json": '{"conversations": "not a list of them"}',
    "noturn.json": '[{"conversations": [{"from": "human", "value": "hi"}]}]',
    "nopoints.toml": "[sweep]\nname = 'x'\n",
    "emptypoint.toml": "[[point]]\n",
    "campaign-nosteps.toml": '[campaign]\nname = "x"\n',
    "campaign-badtype.toml": (
        '[campaign]\nname = "x"\n[[step]]\nid = "a"\nnotebook = "01_config_a_baseline"\n'
        '[[step]]\nid = "b"\nnotebook = "04_config_b_fixed"\nparameters = { input_len = "long" }\n'
    ),
    "campaign-later.toml": (
        '[campaign]\nname = "x"\n[[step]]\nid = "d"\nnotebook = "04_config_b_fixed"\n'
        'inputs = { diagnosis_run_dir = "fix.run_dir" }\n[[step]]\nid = "fix"\nnotebook = "03_mtp_oom_diagnosis"\n'
    ),
    "campaign-nonotebook.toml": '[campaign]\nname = "x"\n[[step]]\nid = "a"\nnotebook = "99_nope"\n',
    "campaign-badname.toml": '[campaign]\nname = "../escape"\n[[step]]\nnotebook = "01_config_a_baseline"\n',
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh folder with the inputs, as the working directory; nothing else may appear in it."""
    for name, content in INPUTS.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


# -- CLI rows: (argv, what the message must name, what it must allow) ------------------------------------------------

CLI_ROWS: list[tuple[str, list[str], str, str]] = [
    # config
    ("config: unknown field", ["config", "show", "--set", "tpp=3"], "config field 'tpp'", "did you mean 'tp'"),
    (
        "config: fraction 1.5",
        ["config", "show", "--set", "mem_fraction_static=1.5"],
        "mem_fraction_static=1.5",
        "strictly between 0 and 1",
    ),
    ("config: port 80000", ["config", "show", "--set", "port=80000"], "port=80000", "from 1 to 65535"),
    ("config: tp 3 on 128 heads", ["config", "show", "--set", "tp=3"], "tp=3", "divides the 128 attention heads"),
    ("config: tp not a number", ["config", "show", "--set", "tp=eight"], "tp='eight'", "an integer"),
    ("config: --set without =", ["config", "show", "--set", "mem_fraction_static"], "--set=", "FIELD=VALUE"),
    ("config: env name", ["config", "render", "--set", "env.1BAD=x"], "env='1BAD'", "variable names of letters"),
    (
        "config: NUL in a value",
        ["config", "render", "--set", "served_model_name=a\x00b"],
        "served_model_name=",
        "without NUL",
    ),
    (
        "config: owned flag in extra_args",
        ["config", "render", "--set", "extra_args=--tp-size 8"],
        "extra_args=",
        "set tp instead",
    ),
    (
        "config: redacted secret",
        ["config", "render", "--what", "env", "--set", "env.HF_TOKEN=[redacted]"],
        "env.HF_TOKEN=",
        "the real value",
    ),
    (
        "config: unknown release",
        ["config", "render", "--sglang-version", "latest"],
        "'latest'",
        "a version number like 0.5.23",
    ),
    ("config: file missing", ["config", "show", "--file", "missing.toml"], "path=", "a readable .toml or .json file"),
    ("config: file not TOML", ["config", "show", "--file", "notoml.toml"], "toml=", "valid TOML"),
    ("config: file binary", ["config", "show", "--file", "binary.toml"], "path=", "a readable .toml or .json file"),
    ("config: file unknown field", ["config", "show", "--file", "unknown.toml"], "field 'tpp'", "allowed: chunked"),
    ("config: file wrong type", ["config", "show", "--file", "wrongtype.toml"], "tp='8'", "an integer"),
    ("config: file a list", ["config", "show", "--file", "list.json"], "config=[1, 2]", "a table/object"),
    ("config: diff of a non-config", ["config", "diff", "config_a", "nope"], "preset 'nope'", "or a .toml/.json"),
    # preflight
    ("preflight: hardware", ["preflight", "--hardware", "gpu9000"], "profile 'gpu9000'", "allowed: rtx-pro-6000-x8"),
    ("preflight: tp 16 on 8 GPUs", ["preflight", "--set", "tp=16"], "tp=16", "at most 8 GPUs"),
    ("preflight: tp 3", ["preflight", "--set", "tp=3"], "tp=3", "divides the 128 attention heads"),
    ("preflight: model", ["preflight", "--model", "llama-9"], "model 'llama-9'", "allowed: deepseek-ai/DeepSeek-V4"),
    ("preflight: concurrency 0", ["preflight", "--concurrency", "0"], "--concurrency=0", "an integer >= 1"),
    ("preflight: context -5", ["preflight", "--context-len", "-5"], "--context-len=-5", "an integer >= 1"),
    ("preflight: margin -1", ["preflight", "--margin-gib", "-1"], "--margin-gib=-1", "non-negative"),
    # launch (each with a run dir that must not appear)
    ("launch: tp 3", ["launch", "--twin", "--set", "tp=3", "--run-dir", "run"], "tp=3", "divides the 128"),
    (
        "launch: tp 16 on the twin",
        ["launch", "--twin", "--set", "tp=16", "--run-dir", "run"],
        "tp=16",
        "at most 8 GPUs",
    ),
    (
        "launch: twin hardware",
        ["launch", "--twin", "--hardware", "gpu9000", "--run-dir", "run"],
        "--hardware: unknown hardware profile 'gpu9000'",
        "allowed: rtx",
    ),
    (
        "launch: time scale 0",
        ["launch", "--twin", "--pace", "0", "--run-dir", "run"],
        "--pace=0",
        "positive number",
    ),
    (
        "launch: time scale nan",
        ["launch", "--twin", "--pace", "nan", "--run-dir", "run"],
        "--pace=nan",
        "positive",
    ),
    (
        "launch: unknown fault",
        ["launch", "--twin", "--fault", "meteor", "--run-dir", "run"],
        "--fault: unknown twin fault 'meteor'",
        "allowed: silent_death",
    ),
    (
        "launch: fault without twin",
        ["launch", "--fault", "nccl_error", "--run-dir", "run"],
        "--fault=",
        "only with --twin",
    ),
    ("launch: port 0", ["launch", "--twin", "--set", "port=0", "--run-dir", "run"], "port=0", "from 1 to 65535"),
    (
        "launch: host with shell",
        ["launch", "--twin", "--set", "host=0.0.0.0;rm", "--run-dir", "run"],
        "host=",
        "a host name or IP",
    ),
    (
        "launch: release",
        ["launch", "--twin", "--sglang-version", "v-next", "--run-dir", "run"],
        "'v-next'",
        "a version number",
    ),
    # watch / stop: checked before the run dir is even looked at
    ("watch: timeout -5", ["watch", "run", "--timeout", "-5"], "--timeout=-5", "a positive number of seconds"),
    ("watch: stall 0", ["watch", "run", "--stall-after", "0"], "--stall-after=0", "a positive number of seconds"),
    ("stop: grace -1", ["stop", "run", "--grace", "-1"], "--grace=-1", "seconds >= 0"),
    # bench (no server is asked anything)
    ("bench: url scheme", ["bench", "--url", "ftp://127.0.0.1:9"], "--url=", "http(s)://HOST:PORT"),
    ("bench: port 80000", ["bench", "--port", "80000"], "--port=80000", "1-65535"),
    (
        "bench: concurrency 0",
        ["bench", "--url", "http://127.0.0.1:9", "--concurrency", "0"],
        "--concurrency=",
        "integers >= 1",
    ),
    (
        "bench: prompts 0",
        ["bench", "--url", "http://127.0.0.1:9", "--num-prompts", "0"],
        "--num-prompts=0",
        "integer >= 1",
    ),
    (
        "bench: range 1.5",
        ["bench", "--url", "http://127.0.0.1:9", "--range-ratio", "1.5"],
        "--range-ratio=1.5",
        "between 0 and 1",
    ),
    (
        "bench: body not JSON",
        ["bench", "--url", "http://127.0.0.1:9", "--extra-request-body", "{x"],
        "--extra-request-body=",
        "a JSON object",
    ),
    (
        "bench: header",
        ["bench", "--url", "http://127.0.0.1:9", "--header", "novalue"],
        "--header='novalue'",
        "KEY=VALUE",
    ),
    ("bench: goodput", ["bench", "--url", "http://127.0.0.1:9", "--goodput", "ttft:-1"], "--goodput=", "MS > 0"),
    (
        "bench: temperature",
        ["bench", "--url", "http://127.0.0.1:9", "--temperature", "-1"],
        "request options",
        "temperature",
    ),
    ("bench: rate 0", ["bench", "--url", "http://127.0.0.1:9", "--request-rate", "0"], "load options", "request_rate"),
    (
        "bench: dataset missing",
        ["bench", "--url", "http://127.0.0.1:9", "--dataset-path", "none.json"],
        "--dataset-path=",
        "ShareGPT JSON list",
    ),
    (
        "bench: dataset not JSON",
        ["bench", "--url", "http://127.0.0.1:9", "--dataset-path", "notjson.json"],
        "--dataset-path=",
        "ShareGPT JSON list",
    ),
    (
        "bench: dataset binary",
        ["bench", "--url", "http://127.0.0.1:9", "--dataset-path", "binary.log"],
        "--dataset-path=",
        "ShareGPT JSON list",
    ),
    (
        "bench: dataset empty",
        ["bench", "--url", "http://127.0.0.1:9", "--dataset-path", "empty.json"],
        "--dataset-path=",
        "at least one",
    ),
    (
        "bench: dataset shape",
        ["bench", "--url", "http://127.0.0.1:9", "--dataset-path", "shape.json"],
        "--dataset-path=",
        "ShareGPT JSON list",
    ),
    (
        "bench: dataset one turn",
        ["bench", "--url", "http://127.0.0.1:9", "--dataset-path", "noturn.json"],
        "--dataset-path=",
        "at least one",
    ),
    (
        "bench: sharegpt without file",
        ["bench", "--url", "http://127.0.0.1:9", "--dataset-name", "sharegpt"],
        "--dataset-name=",
        "--dataset-path FILE",
    ),
    # diagnose: a log that cannot be one
    ("diagnose: missing log", ["diagnose", "missing.log"], "LOGFILE='missing.log'", "a readable log file"),
    ("diagnose: a folder", ["diagnose", "."], "LOGFILE='.'", "a readable log file"),
    ("diagnose: binary log", ["diagnose", "binary.log"], "LOGFILE='binary.log'", "a text server log"),
    # run: notebook parameters, checked before a run dir or a kernel
    ("run: unknown notebook", ["run", "99_nope"], "notebook '99_nope'", "01_config_a_baseline"),
    (
        "run: unknown parameter",
        ["run", "01", "-p", "nope", "1"],
        "parameter 'nope' of 01_config_a_baseline",
        "allowed: host, target",
    ),
    (
        "run: not a number",
        ["run", "01", "-p", "pace", "fast"],
        "parameter pace of 01_config_a_baseline",
        "a number",
    ),
    (
        "run: time scale -1",
        ["run", "01", "-p", "pace", "-1"],
        "parameter pace of 01_config_a_baseline",
        "positive",
    ),
    ("run: concurrency 0", ["run", "01", "-p", "concurrency", "0"], "parameter concurrency", "integers >= 1"),
    ("run: repeats 2", ["run", "01", "-p", "repeats", "2"], "parameter repeats", "an integer >= 3"),
    ("run: target", ["run", "01", "-p", "target", "tgi"], "parameter target", "(allowed: twin, sglang"),
    ("run: hardware", ["run", "01", "-p", "hardware", "gpu9000"], "parameter hardware", "allowed: rtx-pro-6000-x8"),
    ("run: release", ["run", "01", "-p", "sglang_version", "latest"], "parameter sglang_version", "a version number"),
    ("run: preset", ["run", "04", "-p", "preset", "config_z"], "parameter preset", "allowed: config_a"),
    (
        "run: overrides tp 3",
        ["run", "01", "-p", "overrides", "tp=3"],
        "parameter overrides",
        "divides the 128 attention heads",
    ),
    ("run: overrides field", ["run", "01", "-p", "overrides", "tpp=3"], "parameter overrides", "allowed: model_path"),
    (
        "run: overrides 1.5",
        ["run", "01", "-p", "overrides", "mem_fraction_static=1.5"],
        "parameter overrides",
        "strictly between",
    ),
    (
        "run: overrides quote",
        ["run", "01", "-p", "overrides", "model_path='x"],
        "parameter overrides",
        "field=value pairs",
    ),
    ("run: fix", ["run", "04", "-p", "fix", "cuda_graph_max_bs=0"], "parameter fix", "an integer >= 1"),
    (
        "run: earlier run dir",
        ["run", "03", "-p", "crash_run_dir", "nowhere"],
        "parameter crash_run_dir",
        "the run dir of the earlier step",
    ),
    ("run: timeout 0", ["run", "01", "--timeout", "0"], "--timeout=0", "a positive number of seconds"),
    (
        "run: host port not a number",
        ["run", "01", "-p", "host", "gpubox:ssh"],
        "parameter host of 01_config_a_baseline='gpubox:ssh'",
        "user@host:PORT",
    ),
    # campaign
    ("campaign: timeout -1", ["campaign", "--timeout", "-1"], "--timeout=-1", "a positive number of seconds"),
    ("campaign: file missing", ["campaign", "missing.toml"], "campaign=", "a readable campaign .toml file"),
    ("campaign: not TOML", ["campaign", "notoml.toml"], "campaign=", "valid TOML"),
    ("campaign: binary", ["campaign", "binary.toml"], "campaign=", "valid TOML"),
    ("campaign: no steps", ["campaign", "campaign-nosteps.toml"], "campaign.step=", "one or more [[step]]"),
    ("campaign: step 2 type", ["campaign", "campaign-badtype.toml"], "step b: parameter input_len", "an integer"),
    ("campaign: later input", ["campaign", "campaign-later.toml"], "step d: unknown earlier step", "<earlier step>"),
    ("campaign: notebook", ["campaign", "campaign-nonotebook.toml"], "notebook '99_nope'", "a .ipynb file"),
    ("campaign: name", ["campaign", "campaign-badname.toml"], "campaign.name=", "letters, digits"),
    ("campaign: unused parameter", ["campaign", "-p", "paec", "0.02"], "parameter 'paec'", "'pace'?"),
    ("campaign: bad value", ["campaign", "-p", "pace", "-1"], "step a: parameter pace", "positive"),
    (
        "campaign: side by side on one host",
        ["campaign", "--max-parallel", "2"],
        "max_parallel=2",
        "1 without a Slurm placement",
    ),
    (
        "campaign: max parallel 0",
        ["campaign", "--max-parallel", "0", "-p", "slurm", "partition:gpu"],
        "max_parallel=0",
        ">= 1",
    ),
    (
        "campaign: bad overrides",
        ["campaign", "-p", "overrides", "tp=3"],
        "step a: parameter overrides",
        "divides the 128",
    ),
    # tune
    ("tune: unknown field", ["tune", "--twin", "--space", "nope=1,2"], "unknown config field 'nope'", "mem_fraction"),
    (
        "tune: goodput without an SLO",
        ["tune", "--twin", "--space", "cuda_graph_max_bs=8,16", "--objective", "goodput"],
        "objective='goodput'",
        "goodput with an SLO",
    ),
    (
        "tune: SLO name",
        ["tune", "--twin", "--space", "cuda_graph_max_bs=8,16", "--slo", "tpot_p42_ms=1"],
        "slo='tpot_p42_ms'",
        "NAME=MS with NAME one of",
    ),
    ("tune: budget", ["tune", "--twin", "--space", "cuda_graph_max_bs=8,16", "--budget", "0"], "budget=0", ">= 1"),
    (
        "tune: side by side on one host",
        ["tune", "--twin", "--space", "cuda_graph_max_bs=8,16", "--max-parallel", "2"],
        "max_parallel=2",
        "1 without a Slurm placement",
    ),
    (
        "tune: one value",
        ["tune", "--twin", "--space", "mem_fraction_static=0.5"],
        "space mem_fraction_static",
        "at least two different values",
    ),
    # sweep
    (
        "sweep: one bad point",
        ["sweep", "04", "-p", "mem_fraction_static", "0.5,1.5"],
        "sweep point mem_fraction_static=1.5",
        "strictly between",
    ),
    ("sweep: unknown key", ["sweep", "04", "-p", "nope", "1,2"], "sweep parameter 'nope'", "allowed: host"),
    ("sweep: no grid", ["sweep", "04"], "-p=", "a swept parameter"),
    (
        "sweep: timeout 0",
        ["sweep", "04", "-p", "mem_fraction_static", "0.55,0.6", "--timeout", "0"],
        "--timeout=0",
        "a positive number of seconds",
    ),
    ("sweep: points missing", ["sweep", "04", "--points", "missing.toml"], "points=", "a readable TOML file"),
    ("sweep: points binary", ["sweep", "04", "--points", "binary.toml"], "points=", "a readable TOML file"),
    ("sweep: no points", ["sweep", "04", "--points", "nopoints.toml"], "points=", "[[point]] tables"),
    ("sweep: empty point", ["sweep", "04", "--points", "emptypoint.toml"], "points=", "[[point]] tables"),
    # lab
    ("lab: port", ["lab", "--port", "70000"], "--port=70000", "a TCP port"),
    ("lab: folder", ["lab", "--notebooks", "nowhere"], "--notebooks='nowhere'", "an existing folder"),
]


@pytest.mark.parametrize(("argv", "names", "allows"), [r[1:] for r in CLI_ROWS], ids=[r[0] for r in CLI_ROWS])
def test_cli_refuses_with_one_line_naming_what_and_what_is_allowed(
    workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], names: str, allows: str
) -> None:
    before, procs = _tree(workdir), _children()
    status = cli.main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, (status, out, err)
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert names in lines[0] and allows in lines[0], lines[0]
    assert "Traceback" not in err and not out.strip()
    assert _tree(workdir) == before, "something was written"
    assert _children() <= procs, "a process was started"


# -- library entry points: the same rules, as ConfigError (or the documented LogError/BenchError) ---------------------


def _row(fn: Callable[[], Any], field: str, allows: str) -> tuple[Callable[[], Any], str, str]:
    return fn, field, allows


LIBRARY_ROWS: dict[str, tuple[Callable[[], Any], str, str]] = {
    # notebook parameters as a kernel sees them
    "notebook: time scale text": _row(
        lambda: Experiment.from_namespace({"pace": "fast"}, notebook="nb"), "pace", "a number"
    ),
    "notebook: concurrency text": _row(
        lambda: Experiment.from_namespace({"concurrency": "1,x"}, notebook="nb"), "parameter concurrency", ">= 1"
    ),
    "notebook: target": _row(lambda: Experiment.from_namespace({"target": 3}), "parameter target", "a string"),
    "notebook: overrides": _row(
        lambda: Experiment.from_namespace({"overrides": "tp"}, notebook="nb"), "parameter overrides", "field=value"
    ),
    # config files and values
    "config: tp 3 in code": _row(lambda: config_a().replace(tp=3), "tp", "divides the 128 attention heads"),
    "config: dp attention": _row(
        lambda: config_a().replace(tp=8, dp=8, extra_args=("--enable-dp-attention",)).replace(tp=24, dp=8),
        "tp",
        "tp / dp",
    ),
    "config: preflight with the model named": _row(
        lambda: preflight(ServerConfig(model_path="/data/weights", tp=6), "rtx-pro-6000-x8", "deepseek-v4-flash"),
        "tp",
        "divides the 128",
    ),
    "config: load missing": _row(lambda: load("missing.toml"), "path", "a readable .toml or .json file"),
    "config: load binary": _row(lambda: load("binary.toml"), "path", "a readable .toml or .json file"),
    "config: load list": _row(lambda: load("list.json"), "config", "a table/object"),
    "config: load wrong type": _row(lambda: load("wrongtype.toml"), "tp", "an integer"),
    "config: from_dict NaN": _row(
        lambda: ServerConfig.from_dict({"model_path": "m", "mem_fraction_static": float("nan")}),
        "mem_fraction_static",
        "strictly between 0 and 1",
    ),
    "config: bool for int": _row(lambda: ServerConfig(model_path="m", tp=True), "tp", "an integer"),
    "config: newline in path": _row(
        lambda: ServerConfig(model_path="m\n; rm -rf ~"), "model_path", "without NUL, CR or LF"
    ),
    # campaign and sweep files
    "campaign: not TOML": _row(lambda: load_campaign("notoml.toml"), "campaign", "valid TOML"),
    "campaign: no steps": _row(lambda: load_campaign("campaign-nosteps.toml"), "campaign.step", "[[step]]"),
    "sweep points: none": _row(lambda: load_points("nopoints.toml"), "points", "[[point]] tables"),
    "sweep points: binary": _row(lambda: load_points("binary.toml"), "points", "a readable TOML file"),
}


@pytest.mark.parametrize("name", list(LIBRARY_ROWS))
def test_library_entry_points_raise_config_error_naming_the_field(workdir: Path, name: str) -> None:
    fn, field, allows = LIBRARY_ROWS[name]
    before = _tree(workdir)
    with pytest.raises(ConfigError) as info:
        fn()
    assert field in info.value.field and allows in info.value.allowed, str(info.value)
    assert _tree(workdir) == before


def test_logs_and_datasets_raise_their_documented_errors(workdir: Path) -> None:
    with pytest.raises(LogError, match="binary"):
        list(parse_log("binary.log"))
    with pytest.raises(LogError, match="does not exist"):
        list(parse_log("missing.log"))
    assert list(parse_log("garbage.log")) is not None  # text that is no server log is read, not refused
    for name, why in (
        ("notjson.json", "cannot read"),
        ("binary.log", "cannot read"),
        ("empty.json", "no usable"),
        ("shape.json", "JSON list"),
    ):
        with pytest.raises(BenchError, match=why):
            sharegpt_workload(name, 4)


def test_garbage_and_huge_lines_are_diagnosed_not_refused(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A text file that is no server log, or one 5 MB line, is read (each line capped) and said to be unknown."""
    (workdir / "huge.log").write_text("x" * 5_000_000, encoding="utf-8")
    for name in ("garbage.log", "huge.log"):
        assert cli.main(["diagnose", name, "--json"]) == 0
        verdict = json.loads(capsys.readouterr().out)
        assert verdict["outcome"] == "unknown" and "No SGLang or vLLM log lines" in verdict["cause"]


# -- hosts: connected to before a run dir or a kernel (exit 3, or 4 for a host key) ------------------------------------


@pytest.fixture
def ssh_home(sshd: SSHD, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's ~/.ssh (outside the working folder): ``gpubox`` is the sshd fixture with its key known,
    ``newbox`` the same server under a name whose key is not known yet, ``down`` a closed port,
    ``wrongkey`` a key the server refuses; ``nosuchgpubox`` is in neither the config nor any resolver."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    other = home / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    entry = f"  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {sshd.key_path}\n"
    (home / ".ssh" / "config").write_text(
        f"Host gpubox\n  HostName 127.0.0.1\n{entry}Host newbox\n  HostName localhost\n{entry}"
        f"Host down\n  HostName 127.0.0.1\n  Port {free_port()}\n  User {sshd.user}\n  IdentityFile {sshd.key_path}\n"
        f"Host wrongkey\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {other}\n"
    )
    (home / ".ssh" / "known_hosts").write_text(sshd.host_key_line + "\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def _new_processes(before: set[int], sshd: SSHD) -> set[int]:
    """Children of this process started since ``before``, other than the sshd's own per-connection ones."""
    try:
        server = {p.pid for p in psutil.Process(sshd.proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        server = set()
    return _children() - before - server


_SWEEP = ["sweep", "04", "-p", "mem_fraction_static", "0.55,0.6"]
_RUN01 = "parameter host of 01_config_a_baseline="

#: (argv, exit status, what the one line names, what it says to do or what failed)
HOST_ROWS: list[tuple[str, list[str], int, str, str]] = [
    (
        "run: an alias that is nowhere",
        ["run", "01_config_a_baseline", "-p", "host", "nosuchgpubox"],
        3,
        f"{_RUN01}'nosuchgpubox'",
        "'nosuchgpubox' is neither a Host in ~/.ssh/config nor a host name that resolves",
    ),
    ("run: host down", ["run", "01", "-p", "host", "down"], 3, f"{_RUN01}'down'", "cannot connect to"),
    ("run: key refused", ["run", "01", "-p", "host", "wrongkey"], 3, f"{_RUN01}'wrongkey'", "IdentityFile"),
    ("run: host key unknown", ["run", "01", "-p", "host", "newbox"], 4, f"{_RUN01}'newbox'", "--trust-host-key"),
    (
        "sweep: host down",
        [*_SWEEP, "-p", "host", "down"],
        3,
        "sweep parameter host of 04_config_b_fixed='down'",
        "cannot connect to",
    ),
    (
        "sweep: host key unknown",
        [*_SWEEP, "-p", "host", "newbox"],
        4,
        "sweep parameter host of 04_config_b_fixed='newbox'",
        "is not known (fingerprint SHA256:",
    ),
    (
        "campaign: an alias that is nowhere",
        ["campaign", "-p", "host", "nosuchgpubox"],
        3,
        "campaign parameter host='nosuchgpubox'",
        "neither a Host in ~/.ssh/config",
    ),
    ("campaign: host key unknown", ["campaign", "-p", "host", "newbox"], 4, "campaign parameter host=", "--trust-host"),
]


@pytest.mark.parametrize(("argv", "status", "names", "says"), [r[1:] for r in HOST_ROWS], ids=[r[0] for r in HOST_ROWS])
def test_a_host_that_cannot_be_used_is_one_line_before_a_run_dir_or_a_kernel(
    workdir: Path,
    ssh_home: Path,
    sshd: SSHD,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    status: int,
    names: str,
    says: str,
) -> None:
    before, procs = _tree(workdir), _children()
    known = (ssh_home / ".ssh" / "known_hosts").read_text()
    got = cli.main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == status, (got, out, err)
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert names in lines[0] and says in lines[0], lines[0]
    assert "Traceback" not in err and not out.strip()
    assert _tree(workdir) == before, "a run dir or a report folder was made"
    assert not _new_processes(procs, sshd), "a kernel or a server was started"
    assert (ssh_home / ".ssh" / "known_hosts").read_text() == known, "a host key was recorded without the opt-in"


def test_the_library_checks_the_host_first_and_records_a_key_only_when_asked(
    workdir: Path, ssh_home: Path, sshd: SSHD
) -> None:
    procs = _children()
    with pytest.raises(HostConnectionError, match=r"parameter host of 01_config_a_baseline='nosuchgpubox'"):
        run_notebook("01", {"host": "nosuchgpubox"}, reports_root="reports")
    with pytest.raises(HostKeyError, match=r"sweep parameter host of 04_config_b_fixed='newbox'.*is not known") as info:
        run_sweep("04", {"mem_fraction_static": [0.55, 0.6]}, parameters={"host": "newbox"}, reports_root="reports")
    assert info.value.exit_code == 4 and not info.value.changed
    assert not (workdir / "reports").exists() and not _new_processes(procs, sshd)
    check_hosts({"gpubox": "host"})  # known, reachable, accepted: nothing to say
    # The opt-in records the unknown key where the notebook's session looks (~/.ssh/known_hosts), then it is known.
    check_hosts({"newbox": "host"}, trust_host_key=True)
    assert f"[localhost]:{sshd.port}" in (ssh_home / ".ssh" / "known_hosts").read_text()
    check_hosts({"newbox": "host"})


def test_trust_host_key_on_the_command_line_records_the_key_before_the_run(
    workdir: Path, ssh_home: Path, sshd: SSHD, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--trust-host-key`` is the fix the unknown-key error names: the key is recorded, then the run goes on
    (a sweep whose points the model says cannot fit: nothing is launched, so no kernel is needed here)."""
    argv = ["sweep", "04", "-p", "host", "newbox", "-p", "mem_fraction_static", "0.9,0.95", "-p", "cuda_graph_max_bs"]
    assert cli.main([*argv, "64"]) == 4 and "--trust-host-key" in capsys.readouterr().err
    assert cli.main([*argv, "64", "--trust-host-key", "--reports", "reports"]) == 0, capsys.readouterr().err
    assert f"[localhost]:{sshd.port}" in (ssh_home / ".ssh" / "known_hosts").read_text()
    sweep = json.loads(next((workdir / "reports").glob("*/sweep.json")).read_text())
    assert [p["status"] for p in sweep["points"]] == ["skipped", "skipped"]


# -- lab.launch_ab: every argument checked before a server starts ------------------------------------------------------

#: (keyword arguments of lab.launch_ab, the field the ConfigError names, its value as typed, what it allows)
COMPARE_ROWS: dict[str, tuple[dict[str, Any], str, Any, str]] = {
    "unknown second preset": ({"b": "config_bb"}, "b", "config_bb", "did you mean 'config_b'"),
    "unknown first preset": (
        {"a": "config_z", "b": "config_a"},
        "a",
        "config_z",
        "(allowed: config_a, config_b, config_b_fixed",
    ),
    "levels where b goes": ({"b": [16], "cuda_graph_max_bs": 8}, "b", [16], "levels go in concurrency="),
    "the same config twice": ({"b": "config_a"}, "b", "config_a", "a config that differs from A (config_a)"),
    "A with nothing changed": ({}, "b", "config_a", "give B a change, e.g. lab.launch_ab('config_a', cuda_graph"),
    "a change that is no change": ({"tp": 8}, "b", "config_a+tp=8", "differs from A"),
    "only the port changed": ({"port": 31555}, "b", "config_a+port=31555", "differs from A"),
    "an override of the wrong type": ({"cuda_graph_max_bs": "lots"}, "cuda_graph_max_bs", "lots", "an integer"),
    "an unknown field": ({"mem_fractio": 0.6}, "mem_fractio", 0.6, "a config field to change in B (model_path"),
    "a typo of a keyword": ({"repeat": 1, "tp": 4}, "repeat", 1, "or one of launch_ab's keywords (names, a_overrides"),
    "an a_override out of range": (
        {"a_overrides": {"mem_fraction_static": 1.5}, "b": "config_b_fixed"},
        "mem_fraction_static",
        1.5,
        "strictly between 0 and 1",
    ),
    "b_overrides not a mapping": (
        {"b_overrides": "cuda_graph_max_bs=8"},
        "b_overrides",
        "cuda_graph_max_bs=8",
        "a mapping",
    ),
    "a change given twice": (
        {"b_overrides": {"cuda_graph_max_bs": 8}, "cuda_graph_max_bs": 4},
        "cuda_graph_max_bs",
        4,
        "in b_overrides or as a keyword, not both",
    ),
    "names the same": ({"names": ("A", "A"), "cuda_graph_max_bs": 8}, "names", ("A", "A"), "two different names"),
    "one name": ({"names": ("A",), "cuda_graph_max_bs": 8}, "names", ("A",), "two different names"),
    "names a string": ({"names": "AB", "cuda_graph_max_bs": 8}, "names", "AB", "two different names"),
    "a name on two lines": ({"names": ("A", "B\nC"), "cuda_graph_max_bs": 8}, "names", ("A", "B\nC"), "one line each"),
    "concurrency 0": ({"concurrency": [1, 0], "cuda_graph_max_bs": 8}, "concurrency", [1, 0], "integers >= 1"),
    "concurrency text": ({"concurrency": "1,x", "cuda_graph_max_bs": 8}, "concurrency", "1,x", "integers >= 1"),
    "repeats 0": ({"repeats": 0, "cuda_graph_max_bs": 8}, "repeats", 0, "an integer >= 1"),
    "prompts 0": ({"prompts": 0, "cuda_graph_max_bs": 8}, "prompts", 0, "an integer >= 1"),
    "input_len text": ({"input_len": "8k", "cuda_graph_max_bs": 8}, "input_len", "8k", "an integer >= 1"),
    "together text": ({"together": "yes", "cuda_graph_max_bs": 8}, "together", "yes", "True (both servers at once)"),
    "timeout 0": ({"timeout_s": 0, "cuda_graph_max_bs": 8}, "timeout_s", 0, "a positive number of seconds"),
}


@pytest.mark.parametrize("name", list(COMPARE_ROWS))
def test_compare_refuses_bad_input_before_a_server_starts(workdir: Path, name: str) -> None:
    kwargs, field, value, allows = COMPARE_ROWS[name]
    procs = _children()
    lab = Lab(run_root=workdir / "runs", pace=0.02, progress=False)
    with lab, pytest.raises(ConfigError) as info:
        lab.launch_ab(**{"a": "config_a", **kwargs})
    assert info.value.field == field and info.value.value == value and allows in info.value.allowed, str(info.value)
    assert lab.servers == [] and not (workdir / "runs").exists(), "a server was launched, or its folder made"
    assert _children() <= procs, "a process was started"


# -- widget fields: shown at the control, never raised ---------------------------------------------------------------

WIDGET_ROWS: list[tuple[str, str, Any, str]] = [
    ("tp 3", "tp", 3, "divides the 128 attention heads"),
    ("tp 16", "tp", 16, "at most 8 GPUs"),
    ("empty model", "model_path", "   ", "a non-empty Hugging Face id"),
    ("context text", "context_length", "lots", "an integer"),
    ("batch sizes descending", "cuda_graph_bs", "16, 8", "strictly ascending"),
    ("env without =", "env", "HF_TOKEN", "NAME=value lines"),
    ("env bad name", "env", "1BAD=x", "variable names"),
    ("extra args owned flag", "extra_args", "--tp-size 8", "set tp instead"),
    ("dist addr", "dist_init_addr", "node0", "HOST:PORT"),
    ("name on two lines", "served_model_name", "a\nb", "a single line"),
]


@pytest.mark.parametrize(("control", "value", "allows"), [r[1:] for r in WIDGET_ROWS], ids=[r[0] for r in WIDGET_ROWS])
def test_widget_fields_show_the_error_at_the_control(control: str, value: Any, allows: str) -> None:
    from dsv4lab.notebook.widgets import ConfigPanel

    p = ConfigPanel(preset="config_b_fixed", debounce_s=0, charts=False)
    widget = p.controls[control]
    if widget.toggle is not None:
        widget.toggle.value = True
    widget.input.value = value  # what a front end does; must not raise
    errors = p.errors()
    assert control in errors and allows in errors[control], errors
    assert p.verdict == "invalid" and p.buttons["launch"].disabled and p.server is None


def test_rows_cover_every_entry_point() -> None:
    verbs = {r[1][0] for r in CLI_ROWS}
    assert verbs >= {"config", "preflight", "launch", "watch", "stop", "bench", "diagnose", "run", "campaign", "sweep"}
    assert {r[1][0] for r in HOST_ROWS} == {"run", "sweep", "campaign"}
    assert len(CLI_ROWS) + len(LIBRARY_ROWS) + len(WIDGET_ROWS) + len(HOST_ROWS) + len(COMPARE_ROWS) >= 130
