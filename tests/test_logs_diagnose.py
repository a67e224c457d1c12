"""Diagnosis on synthetic logs (our own, in each release's format) and on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4lab.logs import (
    Diagnosis,
    Engine,
    LogError,
    Outcome,
    Phase,
    detect_engine,
    diagnose,
    parse_log,
)

DATA = Path(__file__).parent / "data" / "logs"

_START_054 = [
    "[2026-03-02 09:00:00] server_args=ServerArgs(model_path='m', tp_size=2, mem_fraction_static=0.8, cuda_graph_max_bs=32)",  # noqa: E501
    "[2026-03-02 09:00:07 TP0] Load weight begin. avail mem=90.00 GB",
    "[2026-03-02 09:00:07 TP1] Load weight begin. avail mem=90.00 GB",
    "[2026-03-02 09:01:10 TP0] Load weight end. type=M, dtype=torch.bfloat16, avail mem=50.00 GB, mem usage=40.00 GB.",
    "[2026-03-02 09:01:10 TP1] Load weight end. type=M, dtype=torch.bfloat16, avail mem=50.00 GB, mem usage=40.00 GB.",
    "[2026-03-02 09:01:11 TP0] KV Cache is allocated. #tokens: 500000, KV size: 32.00 GB",
    "[2026-03-02 09:01:11 TP0] Memory pool end. avail mem=18.00 GB",
    "[2026-03-02 09:01:12 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=17.90 GB",
    "[2026-03-02 09:01:12 TP1] Capture cuda graph begin. This can take up to several minutes. avail mem=17.90 GB",
]


def _wrapped_capture_failure(message: str) -> list[str]:
    return [
        *_START_054,
        "[2026-03-02 09:01:20 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/p/sglang/srt/model_executor/model_runner.py", line 9, in init_cuda_graphs',
        "    self.cuda_graph_runner = CudaGraphRunner(self)",
        '  File "/p/sglang/srt/model_executor/cuda_graph_runner.py", line 9, in __init__',
        "    raise Exception(",
        f"Exception: Capture cuda graph failed: {message}",
        "Possible solutions:",
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
        "",
        "[2026-03-02 09:01:21] Received sigquit from a child process. It usually means the child failed.",
    ]


def test_capture_oom_story_with_arithmetic() -> None:
    d = diagnose(DATA / "sglang_0_5_4_tp2_eagle_capture_oom.log")
    assert (d.engine, d.outcome, d.phase) == (Engine.SGLANG, Outcome.OOM, Phase.CUDA_GRAPH_CAPTURE)
    assert (d.gpu, d.tried_to_allocate_gib, d.free_gib, d.total_gib) == (1, 2.5, 1.2, 94.97)
    first = d.fixes[0]
    assert first.change == "--mem-fraction-static 0.60"
    assert "(1 − 0.70) × 88.0 GiB" in first.why and "26.4 GiB" in first.why and "2.50 GiB" in first.why
    assert any(f.change == "--cuda-graph-max-bs 16" for f in d.fixes)
    assert d.confidence >= 0.9
    assert any("Capture cuda graph failed" in line for line in d.evidence)
    assert len(d.evidence) <= 60


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ("CUDA error: no kernel image is available for execution on the device", "architecture"),
        ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer", "gloo"),
        ("NCCL error in: /x/ProcessGroupNCCL.cpp:1, unhandled cuda error", "NCCL"),
        ("No module named 'sgl_kernel.flash_attn' (ImportError)", "import"),
        ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised", "compile"),
    ],
)
def test_wrapped_non_memory_capture_failures_are_crashes(message: str, needle: str) -> None:
    d = diagnose(_wrapped_capture_failure(message))
    assert d.outcome is Outcome.CRASH, d.cause
    assert d.phase is Phase.CUDA_GRAPH_CAPTURE
    assert needle.lower() in d.cause.lower()
    assert not any("mem-fraction" in f.change or "cuda-graph-max-bs" in f.change for f in d.fixes)


def test_kv_budget_0_5_23_raises_the_fraction() -> None:
    d = diagnose(DATA / "sglang_0_5_23_kv_budget.log")
    assert (d.outcome, d.phase) == (Outcome.OOM, Phase.KV_CACHE_ALLOC)
    assert d.fixes[0].change == "--mem-fraction-static 0.60"
    assert "1 − 20.0/44.0 = 0.545" in d.fixes[0].why
    assert d.figures["new_flags"] is True


def test_kv_budget_old_message() -> None:
    lines = [
        *_START_054[:5],
        "[2026-03-02 09:01:11 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/p/sglang/srt/model_executor/model_runner.py", line 9, in init_memory_pool',
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
        "self.server_args.mem_fraction_static=0.4",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.OOM, Phase.KV_CACHE_ALLOC)
    assert d.fixes[0].change.startswith("--mem-fraction-static 0.")
    assert float(d.fixes[0].change.split()[-1]) > 0.8


def test_vllm_no_cache_blocks() -> None:
    d = diagnose(DATA / "vllm_no_cache_blocks.log")
    assert (d.engine, d.outcome, d.phase) == (Engine.VLLM, Outcome.OOM, Phase.KV_CACHE_ALLOC)
    assert d.fixes[0].change == "--gpu-memory-utilization 0.55"
    assert detect_engine(DATA / "vllm_no_cache_blocks.log") == "vllm"


def test_vllm_capture_oom() -> None:
    lines = [
        "(EngineCore_DP0 pid=5) INFO 01-01 10:00:00 [gpu_model_runner.py:1] Model loading took 40.00 GiB memory and "
        "20.0 seconds",
        "(EngineCore_DP0 pid=5) INFO 01-01 10:00:30 [kv_cache_utils.py:1] GPU KV cache size: 100,000 tokens",
        "(EngineCore_DP0 pid=5) ERROR 01-01 10:00:40 [core.py:1] Traceback (most recent call last):",
        '(EngineCore_DP0 pid=5) ERROR 01-01 10:00:40 [core.py:1]   File "/v/vllm/v1/worker/gpu_model_runner.py", '
        "line 1, in capture_model",
        "(EngineCore_DP0 pid=5) ERROR 01-01 10:00:40 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 512.00 MiB. GPU 0 has a total capacity of 47.50 GiB of which 100.00 MiB is free.",
    ]
    d = diagnose(lines)
    assert (d.engine, d.outcome, d.phase, d.gpu) == (Engine.VLLM, Outcome.OOM, Phase.CUDA_GRAPH_CAPTURE, 0)
    assert d.tried_to_allocate_gib == 0.5 and d.free_gib == pytest.approx(100 / 1024)
    assert d.fixes[0].change.startswith("--gpu-memory-utilization")


def test_a_log_that_just_ends_is_unknown_not_stalled() -> None:
    # A file cannot say the process is alive: STALLED is the watcher's verdict, never the file's.
    lines = [*_START_054, "Capturing batches (bs=32 avail_mem=17.80 GB):   0%|          | 0/10 [00:00<?, ?it/s]"]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.UNKNOWN, Phase.CUDA_GRAPH_CAPTURE)
    assert "0/10" in d.cause and "cannot tell" in d.cause
    assert d.confidence < 0.5


def test_ready_line_and_serving() -> None:
    lines = [
        *_START_054,
        "[2026-03-02 09:01:40 TP0] Capture cuda graph end. Time elapsed: 28.00 s. mem usage=2.00 GB. avail mem=15.90 GB.",  # noqa: E501
        "[2026-03-02 09:01:41 TP0] max_total_num_tokens=500000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=256, context_len=32768, available_gpu_mem=15.90 GB",
        "[2026-03-02 09:01:42] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
        "[2026-03-02 09:01:43 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, ",
        "[2026-03-02 09:01:44] The server is fired up and ready to roll!",
    ]
    # Up with no request served after the ready line (the prefill above is the warmup request): warmup.
    d = diagnose(lines)
    assert (d.outcome, d.phase, d.confidence) == (Outcome.READY, Phase.WARMUP, 0.9) and "no request" in d.cause
    access = '[2026-03-02 09:01:45] INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    probe = '[2026-03-02 09:01:45] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK'
    assert diagnose([*lines, probe]).phase is Phase.WARMUP  # a health probe is no traffic
    served = diagnose([*lines, probe, access])
    assert (served.outcome, served.phase, served.confidence) == (Outcome.READY, Phase.SERVING, 0.98)
    batch = "[2026-03-02 09:01:46 TP0] Decode batch, #running-req: 3, #token: 900, token usage: 0.01, #queue-req: 0"
    assert diagnose([*lines, batch]).phase is Phase.SERVING
    d2 = diagnose(lines[:-2])
    assert (d2.outcome, d2.phase) == (Outcome.READY, Phase.WARMUP)
    d3 = diagnose(lines[:-3])
    assert (d3.outcome, d3.phase) == (Outcome.READY, Phase.WARMUP) and d3.confidence <= d2.confidence < 0.5


def test_runtime_errors_survived_do_not_fail_the_run() -> None:
    lines = [
        "[2026-03-02 09:01:44] The server is fired up and ready to roll!",
        "[2026-03-02 09:02:00] Traceback (most recent call last):",
        '  File "/p/sglang/srt/entrypoints/http_server.py", line 1, in generate_request',
        "ValueError: The input (40000 tokens) is longer than the model's context length (32768 tokens).",
        "[2026-03-02 09:02:05 TP0] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): 50.00, #queue-req: 0",
    ]
    assert diagnose(lines).outcome is Outcome.READY


def test_a_batch_line_racing_the_traceback_out_is_not_survival() -> None:
    # The scheduler's batch logger can print once more in the instant its rank dies: the same millisecond
    # is not a server that lived on (seen in a CI run: "the failing process's own error is not in the log").
    crash = [
        "[2026-11-30 15:06:25.173] The server is fired up and ready to roll!",
        "[2026-11-30 15:06:27.168 TP0] Decode batch, #running-req: 2, #token: 846, token usage: 0.00, "
        "cuda graph: True, gen throughput (token/s): 14107.86, #queue-req: 0",
        "[2026-11-30 15:06:27.174 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/p/sglang/srt/managers/scheduler.py", line 1102, in event_loop_overlap',
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "[2026-11-30 15:06:27.174 TP0] Decode batch, #running-req: 2, #token: 926, token usage: 0.00, "
        "cuda graph: True, gen throughput (token/s): 14170.78, #queue-req: 0",
        "[2026-11-30 15:06:27.174] SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
    ]
    d = diagnose(crash)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.SERVING) and "illegal memory access" in d.cause
    # The same within one second of a log without milliseconds.
    coarse = [line.replace(line[20:24], "", 1) if line.startswith("[2026") else line for line in crash]
    assert coarse[2].startswith("[2026-11-30 15:06:27 TP0]")
    assert "illegal memory access" in diagnose(coarse).cause
    # A batch a moment later is: the server lived through that error.
    later = [*crash[:5], crash[5].replace("15:06:27.174", "15:06:28.001")]
    assert diagnose(later).outcome is Outcome.READY


def test_runtime_oom_while_serving() -> None:
    lines = [
        "[2026-03-02 09:01:44] The server is fired up and ready to roll!",
        "[2026-03-02 09:03:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/p/sglang/srt/managers/scheduler.py", line 1, in event_loop_overlap',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.00 GiB is free.",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase, d.gpu) == (Outcome.OOM, Phase.SERVING, 0)


def test_host_kill_is_not_gpu_oom() -> None:
    lines = [
        *_START_054[:3],
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a "
        "common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
    ]
    d = diagnose(lines)
    assert d.outcome is Outcome.CRASH and "SIGKILL" in d.cause
    assert any("dmesg" in f.change for f in d.fixes)


def test_to_dict_contract_and_html() -> None:
    d = diagnose(DATA / "sglang_0_5_4_tp2_eagle_capture_oom.log")
    data = d.to_dict()
    for key in (
        "engine",
        "outcome",
        "phase",
        "gpu",
        "tried_to_allocate_gib",
        "free_gib",
        "total_gib",
        "cause",
        "evidence",
        "fixes",
        "confidence",
    ):
        assert key in data
    assert data["engine"] == "sglang" and data["outcome"] == "oom" and isinstance(data["evidence"], list)
    assert json.loads(json.dumps(data)) == data
    html = d._repr_html_()
    assert "OOM" in html and "&lt;" not in d.cause and "--mem-fraction-static" in html


# -- bad input -----------------------------------------------------------------------------------------------


def _assert_unknown(d: Diagnosis, needle: str) -> None:
    assert d.outcome is Outcome.UNKNOWN and d.phase is None
    assert needle in d.cause.lower(), d.cause
    json.dumps(d.to_dict())


def test_empty_inputs(tmp_path: Path) -> None:
    p = tmp_path / "empty.log"
    p.write_bytes(b"")
    _assert_unknown(diagnose(p), "empty")
    _assert_unknown(diagnose([]), "empty")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    _assert_unknown(diagnose(tmp_path / "nope.log"), "does not exist")
    _assert_unknown(diagnose(tmp_path), "directory")
    with pytest.raises(LogError):
        list(parse_log(tmp_path / "nope.log"))


def test_binary_file(tmp_path: Path) -> None:
    p = tmp_path / "core.bin"
    p.write_bytes(bytes(range(256)) * 64)
    _assert_unknown(diagnose(p), "binary")
    assert detect_engine(p) is None
    _assert_unknown(diagnose([b"\x00\x01\x02garbage"]), "binary")


def test_foreign_file(tmp_path: Path) -> None:
    p = tmp_path / "nginx.log"
    p.write_text('127.0.0.1 - - [10/Oct/2025:13:55:36 +0000] "GET / HTTP/1.1" 200 612\n' * 50, encoding="utf-8")
    _assert_unknown(diagnose(p), "no sglang or vllm")
    _assert_unknown(diagnose(["def f():", "    return 1", "print('hello')"]), "no sglang or vllm")
    assert detect_engine(p) is None


def test_mixed_engines() -> None:
    sg = _START_054[1:6]
    vl = [
        "(EngineCore_DP0 pid=5) INFO 01-01 10:00:00 [gpu_model_runner.py:1] Model loading took 40.00 GiB memory",
        "(EngineCore_DP0 pid=5) INFO 01-01 10:00:30 [kv_cache_utils.py:1] GPU KV cache size: 100,000 tokens",
        "(EngineCore_DP0 pid=5) INFO 01-01 10:00:30 [gpu_worker.py:1] Available KV cache memory: 3.00 GiB",
        "(EngineCore_DP0 pid=5) INFO 01-01 10:00:31 [gpu_model_runner.py:1] Graph capturing finished in 5 secs, took 0.50 GiB",  # noqa: E501
    ]
    d = diagnose(sg + vl)
    _assert_unknown(d, "mixes")
    assert detect_engine(sg + vl) is None


def test_huge_line_and_many_lines(tmp_path: Path) -> None:
    p = tmp_path / "huge.log"
    with p.open("w", encoding="utf-8") as f:
        f.write("[2026-01-01 00:00:00] " + "x" * 3_000_000 + "\n")
        for _ in range(20_000):
            f.write('[2026-01-01 00:00:01] INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n')
        f.write("[2026-01-01 00:00:02] The server is fired up and ready to roll!\n")
    d = diagnose(p)
    assert d.outcome is Outcome.READY and d.lines_read == 20_002


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    p = tmp_path / "latin1.log"
    p.write_bytes(
        b"[2026-01-01 00:00:00] caf\xe9 \xff\n[2026-01-01 00:00:01] The server is fired up and ready to roll!\n"
    )
    assert diagnose(p).outcome is Outcome.READY


def test_unsupported_source_type() -> None:
    _assert_unknown(diagnose(12345), "cannot")  # type: ignore[arg-type]
