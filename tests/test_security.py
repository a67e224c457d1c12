"""Security: secrets stay out of what people read, files are private, servers listen on loopback, reports run
no script and show no home paths, host keys are checked, remote commands cannot be injected.

Real parts throughout: the twin as real processes (the tiny profile), the real sshd, a real Jupyter kernel
running a notebook through ``dsv4lab.notebook.nbrun``, JupyterLab started by ``dsv4lab lab``, chromium for the report.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import stat
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4lab import cli
from dsv4lab.config.server_config import ServerConfig, load, save
from dsv4lab.errors import ConfigError
from dsv4lab.hosts import LocalHost, SSHHost
from dsv4lab.notebook.nbrun import run_notebook
from dsv4lab.notebook.report import defang_html, scrub_home
from dsv4lab.secrets import REDACTED, collect_secrets, is_secret_name, redact_argv, redact_data, redact_text
from dsv4lab.serving.launch import attach, launch
from dsv4lab.serving.watch import wait_ready
from tests.sshd import SSHD, free_port

ROOT = Path(__file__).resolve().parents[1]
SECRET = "hf_secretvalue123"
TWIN_ENV = {"DSV4LAB_TWIN_HARDWARE": "tiny", "DSV4LAB_TWIN_PACE": "0.02"}


def tiny(**changes: Any) -> ServerConfig:
    base = ServerConfig(model_path="dsv4lab/tiny-moe", tp=2, mem_fraction_static=0.8, port=free_port())
    return base.replace(**changes) if changes else base


def files_holding(root: Path, needle: str) -> list[Path]:
    """Every file under ``root`` whose bytes contain ``needle``."""
    raw = needle.encode()
    return sorted(p for p in root.rglob("*") if p.is_file() and raw in p.read_bytes())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by these processes."""
    out = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out += [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def tree(pid: int) -> list[int]:
    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


# -- the redaction rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("HUGGING_FACE_HUB_TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("WANDB_API_KEY", True),
        ("DB_PASSWORD", True),
        ("api_key", True),
        ("--api-key", True),
        ("--admin-api-key", True),
        ("apiKey", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("max_new_tokens", False),
        ("NCCL_PROTO", False),
        ("key", False),
        ("api_key_set", False),
        ("header_names", False),
    ],
)
def test_what_counts_as_a_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name.lstrip("-")) is secret


def test_redaction_keeps_names_and_masks_values_wherever_they_appear() -> None:
    text = (
        f"export HF_TOKEN={SECRET}\n"
        "server_args=ServerArgs(model_path='m', api_key='s3cr3t-value', admin_api_key=None, tp_size=8)\n"
        "python -m sglang.launch_server --api-key s3cr3t-value --tp 8\n"
        '{"OPENAI_API_KEY": "sk-abcdefghijklmnopqrstu", "kv_bytes_per_token": 7705}\n'
        "Authorization: Bearer abcdef123456\n"
        "Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.00\n"
        "TOKENIZERS_PARALLELISM=false\n"
    )
    out = redact_text(text)
    for gone in (SECRET, "s3cr3t-value", "sk-abcdefghijklmnopqrstu", "abcdef123456"):
        assert gone not in out
    for kept in ("HF_TOKEN=", "api_key=", "--api-key", "admin_api_key=None", "#new-token: 8192", "kv_bytes_per_token"):
        assert kept in out
    assert "TOKENIZERS_PARALLELISM=false" in out
    # known values are masked on their own too (a token printed by itself)
    assert redact_text("the token is abc123xyz", ["abc123xyz"]) == f"the token is {REDACTED}"
    assert redact_argv(["--api-key", "k1234567", "--tp", "8"]) == ["--api-key", REDACTED, "--tp", "8"]
    data = redact_data({"env": {"HF_TOKEN": "x", "NCCL_PROTO": "LL"}, "n": 7705, "kv_bytes_per_token": 7705})
    assert data == {"env": {"HF_TOKEN": REDACTED, "NCCL_PROTO": "LL"}, "n": 7705, "kv_bytes_per_token": 7705}
    assert SECRET in collect_secrets(f"env.HF_TOKEN={SECRET} cuda_graph_max_bs=16", environ={})


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=8, max_size=40))
def test_any_secret_env_value_is_masked_in_every_written_form(value: str) -> None:
    """Whatever the token looks like, the config's redacted forms never hold it (unless it is a plain word the
    redaction cannot tell from text, which a 6+ character value under a secret name is not)."""
    config = tiny(env={"MY_SERVICE_TOKEN": value})
    for form in (config.to_toml(redact=True), config.to_json(redact=True), json.dumps(config.to_dict(redact=True))):
        assert value not in form or value in REDACTED
    assert config.to_dict(redact=True)["env"]["MY_SERVICE_TOKEN"] == REDACTED


def test_a_redacted_config_cannot_be_launched_as_if_it_held_the_token(tmp_path: Path) -> None:
    config = tiny(env={"HF_TOKEN": SECRET})
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml(redact=True))
    with pytest.raises(ConfigError, match=r"env\.HF_TOKEN=.*the real value"):
        launch(LocalHost(), load(path), str(tmp_path / "run"), target="twin", twin_env=TWIN_ENV)
    assert not (tmp_path / "run").exists()
    save(config, tmp_path / "mine.toml")  # the user's own save keeps the token, privately
    assert SECRET in (tmp_path / "mine.toml").read_text() and mode(tmp_path / "mine.toml") == 0o600


# -- end to end: a launch and a notebook carrying HF_TOKEN ------------------------------------------------------------

NOTEBOOK_CELLS = [
    (
        "parameters",
        'hardware: str = "tiny"\npace: float = 0.02\nserver_env: str = ""  # the server environment\n'
        'run_dir: str = ""\n',
    ),
    (
        "",
        "import os\n"
        "from IPython.display import HTML, display\n"
        "from dsv4lab import Lab\n"
        "from dsv4lab.config.server_config import ServerConfig\n"
        "from dsv4lab.atomicfile import write_json_atomic\nfrom dsv4lab.notebook.experiment import parse_overrides\n"
        "lab = Lab('local', target='twin', hardware=hardware, pace=pace, run_root=run_dir,\n"
        "          progress=False)\n"
        "env = {k.removeprefix('env.'): v for k, v in parse_overrides(server_env).items()}\n"
        "cfg = ServerConfig(model_path='dsv4lab/tiny-moe', tp=2, mem_fraction_static=0.8, port={port}, env=env)\n"
        "s = lab.launch(cfg, name='tiny').wait(timeout_s=90)\n"
        "print('careless print of the token:', cfg.env['HF_TOKEN'])\n"
        "write_json_atomic(lab.run_root / 'mine.json', {'token': cfg.env['HF_TOKEN'], 'note': 'kept?'})\n"
        "print('state', s.state)",
    ),
    (
        "",
        "with open(s.handle.log_path, 'a') as f:\n"
        "    f.write('<script>alert(1)</script> injected into the server log\\n')\n"
        "s.log(3)",
    ),
    (
        "",
        "print(os.path.expanduser('~/private/notes.txt'), os.getcwd())\n"
        "display(HTML('<b onclick=\"alert(2)\">bold</b><script>alert(3)</script><img src=x onerror=alert(4)>'))",
    ),
    ("", "s.stop()\nlab.close()"),
]


@pytest.fixture(scope="module")
def notebook_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One real notebook run whose parameter carries HF_TOKEN, into a reports folder (shared by the checks)."""
    root = tmp_path_factory.mktemp("security")
    nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    port = free_port()
    for tag, source in NOTEBOOK_CELLS:
        cell = nbformat.v4.new_code_cell(source.replace("{port}", str(port)))  # type: ignore[no-untyped-call]
        if tag:
            cell.metadata["tags"] = [tag]
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = root / "secret_probe.ipynb"
    nbformat.write(nb, str(path))  # type: ignore[no-untyped-call]
    run = run_notebook(
        path,
        {"server_env": f"env.HF_TOKEN={SECRET} env.NCCL_PROTO=LL"},
        reports_root=root / "reports",
        execution_timeout_s=180,
    )
    return run


def test_the_token_reaches_the_server_and_only_env_sh_keeps_it(notebook_run: Any) -> None:
    run = notebook_run
    assert run.ok, run.error
    reports = run.run_dir.parent
    holding = files_holding(reports, SECRET)
    assert [p.name for p in holding] == ["env.sh"], holding
    env_sh = holding[0]
    assert mode(env_sh) == 0o600 and mode(env_sh.parent) == 0o700
    for name in ("config.toml", "handle.json", "server.json"):
        text = (env_sh.parent / name).read_text()
        assert f'"HF_TOKEN": "{REDACTED}"' in text or f'HF_TOKEN = "{REDACTED}"' in text, name
    params = json.loads((run.run_dir / "params.json").read_text())
    assert params["server_env"] == f"env.HF_TOKEN={REDACTED} env.NCCL_PROTO=LL"
    assert json.loads((run.run_dir / "mine.json").read_text()) == {"token": REDACTED, "note": "kept?"}
    nb_text = (run.run_dir / "notebook.ipynb").read_text()
    assert "careless print of the token: [redacted]" in nb_text


@pytest.mark.slow
def test_run_files_are_private_and_the_report_still_opens(notebook_run: Any, tmp_path: Path) -> None:
    run = notebook_run
    assert mode(run.run_dir) == 0o700
    for name in ("report.html", "results.json", "params.json", "env.json", "notebook.ipynb"):
        assert mode(run.run_dir / name) == 0o600, name
    server_dir = run.run_dir / "tiny"
    assert mode(server_dir) == 0o700
    for name in ("config.toml", "handle.json", "server.log", "server.pid", "launcher.pid", "server.json"):
        assert mode(server_dir / name) == 0o600, name
    assert mode(server_dir / "launch.sh") == 0o700
    from tests.browser import open_offline

    check = open_offline(run.report, screenshot=tmp_path / "report.png")  # the owner opens it as before
    # the one error: the notebook's own <img src=x> (its onerror handler is gone, see below)
    assert check.console_errors == ["Failed to load resource: net::ERR_FILE_NOT_FOUND"], check.console_errors
    assert "careless print" in check.text and check.requests[1:] == [run.report.parent.as_uri() + "/x"]


@pytest.mark.slow
def test_the_report_shows_log_html_as_text_runs_no_script_and_no_home_paths(notebook_run: Any) -> None:
    from tests.browser import launch_chromium

    run = notebook_run
    html = run.report.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; injected into the server log" in html
    assert not re.search(r"<script", html, re.IGNORECASE)
    assert not re.search(r"<[a-zA-Z][^>]*\son[a-z]+\s*=", html), "an element kept an on* handler"
    home = os.path.expanduser("~")
    assert "~/private/notes.txt" in html and f"{home}/private" not in html
    assert str(run.run_dir) in html  # the run dir may say where it is
    dialogs: list[str] = []
    with launch_chromium() as browser:
        page = browser.new_context(offline=True).new_page()

        def dismiss(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", dismiss)
        page.goto(run.report.resolve().as_uri(), wait_until="load")
        page.wait_for_timeout(300)
        scripts = page.evaluate("document.querySelectorAll('script').length")
        body = page.inner_text("body")
        page.click(".jp-RenderedHTML b", timeout=5000)  # the output's <b>, not the folded code
    assert dialogs == [] and scripts == 0
    assert "<script>alert(1)</script> injected into the server log" in body


@pytest.mark.slow
def test_the_cli_launch_of_the_issue_keeps_the_token_in_env_sh_only(tmp_path: Path) -> None:
    """`dsv4lab launch --set env.HF_TOKEN=hf_... --twin --run-dir D`: config.toml, handle.json and the printed
    handle are redacted, env.sh holds the token 0600, the run dir is 0700, the twin listens on 127.0.0.1 only."""
    config = tmp_path / "tiny.toml"
    save(tiny(), config)
    run_dir = tmp_path / "run"
    argv = ["--file", str(config), "--set", f"env.HF_TOKEN={SECRET}", "--twin", "--hardware", "tiny"]
    assert cli.main(["launch", *argv, "--pace", "0.02", "--run-dir", str(run_dir), "--json"]) == 0
    handle = attach(LocalHost(), str(run_dir))
    try:
        assert wait_ready(handle, 60, progress=False).ready
        assert [p.name for p in files_holding(tmp_path, SECRET)] == ["env.sh"]
        assert mode(run_dir) == 0o700 and mode(run_dir / "env.sh") == 0o600
        assert all(mode(p) == 0o600 for p in run_dir.iterdir() if p.name != "launch.sh")
        server_pid = handle.server_pid()
        assert server_pid is not None
        sockets = listening(tree(server_pid))
        assert sockets and {ip for ip, _ in sockets} == {"127.0.0.1"}, sockets
        assert handle.port in {port for _, port in sockets}
    finally:
        handle.stop(grace_s=2.0)


@pytest.mark.slow
def test_the_copies_a_server_fetches_from_a_remote_host_are_redacted(sshd: SSHD, tmp_path: Path) -> None:
    """Over SSH: the remote run dir is 0700 with 0600 files (env.sh too), and the local copies hold no token."""
    from dsv4lab.notebook.lab import Lab

    remote_root = tmp_path / "remote"
    with Lab(
        sshd.connect(),
        target="twin",
        hardware="tiny",
        pace=0.02,
        python=sys.executable,
        run_root=tmp_path / "local",
        remote_root=str(remote_root),
        progress=False,
    ) as lab:
        s = lab.launch(tiny(env={"HF_TOKEN": SECRET}), name="remote", sample_gpus=False).wait(timeout_s=90)
        assert s.ready, s.readiness
        s.stop(grace_s=2.0)
        remote_dir = Path(s.run_dir)
    assert mode(remote_dir) == 0o700
    for p in remote_dir.iterdir():
        assert mode(p) == (0o700 if p.name == "launch.sh" or p.is_dir() else 0o600), p
    assert [p.name for p in files_holding(remote_dir, SECRET)] == ["env.sh"]
    local = tmp_path / "local"
    assert (local / "remote" / "env.sh").exists() or any(local.rglob("env.sh"))
    assert files_holding(local, SECRET) == []


# -- loopback only ---------------------------------------------------------------------------------------------------


def test_ssh_port_forwards_listen_on_loopback_only(ssh_host: SSHHost) -> None:
    with ssh_host.forward(9) as fwd:
        sockets = [s for s in listening([os.getpid()]) if s[1] == fwd.local_port]
        assert sockets == [("127.0.0.1", fwd.local_port)]


@pytest.mark.slow
def test_dsv4lab_lab_binds_loopback_with_a_token(tmp_path: Path) -> None:
    from dsv4lab.notebook.labserver import start_lab

    env = {
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
    }
    (tmp_path / "nb").mkdir()
    server = start_lab(None, tmp_path / "nb", env=env)
    try:
        assert server.url.startswith("http://127.0.0.1:") and len(server.token) >= 32
        assert server.token not in " ".join(psutil.Process(server.process.pid).cmdline())  # not shown by ps
        deadline = time.monotonic() + 60
        sockets: list[tuple[str, int]] = []
        while time.monotonic() < deadline and not sockets:
            sockets = listening(tree(server.process.pid))
            time.sleep(0.2)
        assert sockets and {ip for ip, _ in sockets} == {"127.0.0.1"}, sockets
        api = f"http://127.0.0.1:{server.port}/api/contents"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(api, timeout=10)
        assert refused.value.code == 403
        with urllib.request.urlopen(f"{api}?token={server.token}", timeout=10) as ok:  # noqa: S310
            assert ok.status == 200
    finally:
        server.stop()
    assert server.process.poll() is not None


def test_every_server_in_the_code_binds_loopback_by_default() -> None:
    """The twin's --host default is SGLang's (127.0.0.1), the config's too; no code (or test fake server) binds a
    wildcard address, and the test JupyterLab is started on 127.0.0.1."""
    from dsv4lab.config.versions import resolve_release
    from dsv4lab.twin.args import parse_args

    assert ServerConfig(model_path="m").host == "127.0.0.1"
    parsed = parse_args(["--model-path", "dsv4lab/tiny-moe"], resolve_release("0.5.23"))
    assert parsed.config.host == "127.0.0.1"
    wildcard = re.compile(r"""(bind|TCPSite|start_server|create_server|HTTPServer)\(.*["'](0\.0\.0\.0|::|)["']""")
    for path in [*ROOT.glob("dsv4lab/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not wildcard.search(line), f"{path}:{n}: {line.strip()}"
    assert '"--ip=127.0.0.1"' in (ROOT / "tests" / "browser.py").read_text()


# -- host keys and remote commands ------------------------------------------------------------------------------------


def test_host_keys_are_checked_by_default() -> None:
    """Unknown keys are refused unless the caller opts in; tests/test_hosts.py shows the refusal, the opt-in and
    the changed key against the real sshd. Here: no entry point opts in by default."""
    from dsv4lab.cli.bench_args import build_parser
    from dsv4lab.hosts import open_host
    from dsv4lab.notebook.lab import Lab

    assert inspect.signature(SSHHost).parameters["trust_unknown_host"].default is False
    assert inspect.signature(open_host).parameters["trust_unknown_host"].default is False
    assert cli.build_parser().parse_args(["launch", "--run-dir", "x"]).trust_host_key is False
    assert build_parser().parse_args(["--url", "http://127.0.0.1:1"]).trust_host_key is False
    assert inspect.signature(Lab).parameters["trust_host_key"].default is False


def test_unknown_host_key_stops_before_any_command(sshd: SSHD, tmp_path: Path) -> None:
    from dsv4lab.errors import HostKeyError

    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError, match="SHA256:"):  # at connect: no host object, so no command can run
        sshd.connect(known_hosts=str(empty))
    assert empty.read_text() == ""  # and nothing was recorded


_HOSTILE = st.lists(
    st.sampled_from([*"ab '\"`$;&|<>*?![]{}#~\\\t\n", "$(touch PWNED)", "; touch PWNED", "`touch PWNED`", "é"]),
    max_size=10,
).map("".join)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(_HOSTILE, min_size=1, max_size=3))
@pytest.mark.slow
def test_remote_commands_are_argv_lists_quoted_byte_for_byte(
    ssh_host: SSHHost, tmp_path: Path, words: list[str]
) -> None:
    out = ssh_host.run(["printf", "%s\\0", *words], timeout_s=15, input_text=None).check()
    assert out.stdout.split("\0")[:-1] == words
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def test_no_shell_strings_are_built_from_values() -> None:
    """No subprocess with shell=True, os.system or os.popen anywhere in dsv4lab: every command is an argv list
    (or a constant bash script with the values as its arguments)."""
    for path in ROOT.glob("dsv4lab/**/*.py"):
        tree_ = ast.parse(path.read_text())
        for node in ast.walk(tree_):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg == "shell":
                        assert isinstance(kw.value, ast.Constant) and kw.value.value is False, f"{path}:{node.lineno}"
                func = node.func
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "os":
                    assert func.attr not in ("system", "popen"), f"{path}:{node.lineno}"


# -- reports: no script, no home --------------------------------------------------------------------------------------


def test_defang_keeps_markup_and_drops_what_runs() -> None:
    page = (
        "<!DOCTYPE html><html><head><style>a > b { color: red }</style></head><body>"
        "<div style='x' onclick=\"alert(1)\">a &amp; &lt;script&gt;</div><script>alert(2)</script>"
        '<a href=" javascript:alert(3)">x</a><img src="data:image/png;base64,AA"><iframe src=x>y</iframe>'
        "<svg><script>alert(4)</script><circle r='1'/></svg><details><summary>s</summary>kept</details></body></html>"
    )
    out = defang_html(page)
    assert "alert" not in out and "<script" not in out and "<iframe" not in out
    for kept in ("a > b { color: red }", "&lt;script&gt;", 'style="x"', "data:image/png;base64,AA", "<circle r='1'/>"):
        assert kept in out
    assert "<details><summary>s</summary>kept</details>" in out


def test_home_paths_outside_the_run_dir_are_written_with_a_tilde() -> None:
    text = "/home/ana/models/x and /home/ana/reports/run-1/server.log and /home/anathema/y and /home/ana"
    out = scrub_home(text, ["/home/ana/reports/run-1"], home="/home/ana")
    assert out == "~/models/x and /home/ana/reports/run-1/server.log and /home/anathema/y and ~"


def test_configs_and_diffs_shown_in_a_notebook_hide_the_token() -> None:
    """A token with no tell-tale shape set in a cell: the config card and the diff a notebook shows mask it."""
    from dsv4lab.config.presets import config_a
    from dsv4lab.config.server_config import diff

    a = config_a()
    b = a.with_overrides({"env.HF_TOKEN": "plainvalue42"})
    assert "plainvalue42" not in b._repr_html_() and "env.HF_TOKEN" in b._repr_html_()
    assert str(diff(a, b)) == f"env.HF_TOKEN: (unset) -> {REDACTED}"
    assert "plainvalue42" not in diff(a, b)._repr_html_()
    assert diff(a, b).as_dict()["env.HF_TOKEN"]["after"] == "plainvalue42"  # the data itself is not changed
