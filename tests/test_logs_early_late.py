"""Deaths before the first engine line (imports, ABI) and after the schedulers (the HTTP port) are read too.

Both used to surface as "exited without logging an error": the lines are not in any engine's format, so
neither the classifier nor the diagnosis looked at them. The twin's own ``port_in_use`` fault is checked
end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4lab.logs import LineKind, Outcome, Phase, classify_line, diagnose
from tests.test_twin_support import free_port, running_twin, twin_env

EXIT_TIMEOUT_S = 30.0

_NO_SPEC = (
    "/usr/bin/python3: Error while finding module specification for 'sglang.launch_server' "
    "(ModuleNotFoundError: No module named 'sglang')"
)
_UNDEFINED = (
    "ImportError: /usr/local/lib/python3.11/dist-packages/sgl_kernel/common_ops.abi3.so: undefined symbol: "
    "_ZN5torch3jit17parseSchemaOrNameERKSsb"
)
_IMPORT_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.10/runpy.py", line 196, in _run_module_as_main',
    "    return _run_code(code, main_globals, None,",
    '  File "/usr/local/lib/python3.10/dist-packages/sglang/launch_server.py", line 6, in <module>',
    "    from sglang.srt.entrypoints.http_server import launch_server",
    "ModuleNotFoundError: No module named 'sgl_kernel'",
]


@pytest.mark.parametrize("lines", [[_NO_SPEC], [_UNDEFINED], _IMPORT_TRACEBACK], ids=["runpy", "abi", "traceback"])
def test_an_import_failure_before_any_engine_line_is_the_cause(lines: list[str]) -> None:
    assert any(classify_line(line) is LineKind.FATAL for line in lines)
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.STARTUP_OTHER), d.cause
    assert "import failed" in d.cause and d.confidence >= 0.5
    assert d.fixes and "environment" in d.fixes[0].change


@pytest.mark.parametrize(
    "line",
    [
        "WARNING 09-04 04:55:04 _core_ext.py:180] Failed to import from vllm._core_C with ImportError("
        "'/opt/conda/lib/python3.10/site-packages/vllm/_core_C.abi3.so: undefined symbol: _ZN5torch6detail')",
        "[2025-03-07 10:00:00] Ignore import error when loading sglang.srt.models.mllama: No module named 'x'",
        "[rank0]:[W1030 15:32:32.970893361 socket.cpp:464] [c10d] The server socket has failed to bind to "
        "[::]:29500 (errno: 98 - Address already in use).",
    ],
)
def test_a_warning_that_mentions_an_import_or_a_port_is_not_fatal(line: str) -> None:
    assert classify_line(line) is LineKind.WARNING


def test_uvicorn_bind_error_after_startup_is_a_crash_not_ready() -> None:
    lines = [
        "[2026-03-02 09:01:41 TP0] max_total_num_tokens=500000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=256, context_len=32768, available_gpu_mem=15.90 GB",
        "[2026-03-02 09:01:42] INFO:     Started server process [4242]",
        "[2026-03-02 09:01:42] INFO:     Application startup complete.",
        "[2026-03-02 09:01:42] ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): "
        "address already in use",
        "[2026-03-02 09:01:42] INFO:     Waiting for application shutdown.",
    ]
    assert classify_line(lines[3]) is LineKind.FATAL
    d = diagnose(lines)
    assert d.outcome is Outcome.CRASH and "port" in d.cause and "30000" in d.cause
    assert d.fixes and "--port" in d.fixes[0].change


def test_twin_port_in_use_is_diagnosed_as_the_port(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    argv = ["--model-path", "dsv4lab/tiny-moe", "--tp-size", "2", "--port", str(port)]
    with running_twin(argv, twin_env(tmp_path, DSV4LAB_TWIN_FAULT="port_in_use"), log) as proc:
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == 1
    text = log.read_text()
    fatal = [line for line in text.splitlines() if classify_line(line) is LineKind.FATAL]
    assert fatal and "error while attempting to bind" in fatal[0]
    d = diagnose(log)
    assert d.outcome is Outcome.CRASH, d.cause
    assert "port" in d.cause and str(port) in d.cause and d.confidence >= 0.5


def test_a_shutdown_signal_line_is_told_apart() -> None:
    """vLLM stopped during start-up logs the signal, then its workers' initialisation failing: the watcher
    calls that STOPPED (the marker says so) only when the signal line came first."""
    from dsv4lab.logs.patterns import SHUTDOWN_SIGNAL

    line = (
        "(EngineCore pid=1195) INFO 12-01 20:21:24 [core.py:1454] [shutdown] EngineCore: trigger received "
        "signal=SIGTERM"
    )
    assert SHUTDOWN_SIGNAL.search(line)
    assert SHUTDOWN_SIGNAL.search("received signal SIGINT")
    for other in ("received signal=SIGKILL", "Exception: WorkerProc initialization failed", "signal handler set"):
        assert not SHUTDOWN_SIGNAL.search(other), other
