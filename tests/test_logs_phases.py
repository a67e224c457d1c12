"""Phase from evidence: traceback frames, engine step lines and time order, not the last line of the file.

Synthetic lines in each engine's documented format (shared/reference), one rule per test, so a failure
names the rule that broke. The real-log corpus (test_logs_corpus.py) checks the same rules on the world.
"""

from __future__ import annotations

import pytest

from dsv4lab.logs import Engine, Outcome, Phase, diagnose
from dsv4lab.logs.steps import frame_phase, frame_step, import_time

V1 = "(EngineCore_DP0 pid=7) ERROR 05-16 23:42:10 [core.py:700]"


def _v1_traceback(*frames: tuple[str, str], exc: str | None = None) -> list[str]:
    lines = [f"{V1} EngineCore failed to start.", f"{V1} Traceback (most recent call last):"]
    for path, func in frames:
        lines.append(f'{V1}   File "/usr/lib/python3/dist-packages/vllm/{path}", line 1, in {func}')
        lines.append(f"{V1}     x = y()")
    if exc is not None:
        lines.append(f"{V1} {exc}")
    return lines


@pytest.mark.parametrize(
    ("frames", "phase"),
    [
        ((("v1/worker/gpu_model_runner.py", "load_model"),), Phase.WEIGHT_LOADING),
        ((("model_executor/model_loader/base_loader.py", "load_model"),), Phase.WEIGHT_LOADING),
        ((("v1/worker/gpu_worker.py", "determine_available_memory"),), Phase.KV_CACHE_ALLOC),
        (
            (("v1/engine/core.py", "_initialize_kv_caches"), ("v1/worker/gpu_model_runner.py", "profile_run")),
            Phase.KV_CACHE_ALLOC,
        ),
        (
            (
                ("v1/worker/gpu_worker.py", "compile_or_warm_up_model"),
                ("v1/worker/gpu_model_runner.py", "capture_model"),
            ),
            Phase.CUDA_GRAPH_CAPTURE,
        ),
        (
            (("v1/worker/gpu_worker.py", "compile_or_warm_up_model"), ("v1/worker/gpu_model_runner.py", "_dummy_run")),
            Phase.WARMUP,
        ),
        (
            (("v1/engine/core.py", "run_busy_loop"), ("v1/worker/gpu_model_runner.py", "execute_model")),
            Phase.SERVING,
        ),
        ((("v1/worker/gpu_worker.py", "init_device"),), Phase.STARTUP_OTHER),
    ],
)
def test_vllm_frames_name_the_step_when_the_exception_line_is_missing(
    frames: tuple[tuple[str, str], ...], phase: Phase
) -> None:
    d = diagnose(_v1_traceback(*frames))
    assert d.engine is Engine.VLLM
    assert d.phase is phase, d.cause
    assert "not in the log" in d.cause and d.confidence < 0.5


def test_initialize_kv_caches_alone_names_no_step_so_the_last_step_line_does() -> None:
    # EngineCore._initialize_kv_caches wraps profiling, sizing, warmup and capture.
    lines = [
        "(EngineCore_DP0 pid=7) INFO 05-16 23:42:00 [monitor.py:34] torch.compile takes 19.69 s in total",
        *_v1_traceback(("v1/engine/core.py", "_initialize_kv_caches")),
    ]
    assert diagnose(lines).phase is Phase.KV_CACHE_ALLOC


def test_frame_precedence_and_wrappers() -> None:
    capture_in_warmup = ("gpu_worker.py:compile_or_warm_up_model", "gpu_model_runner.py:capture_model")
    assert frame_phase(capture_in_warmup) is Phase.CUDA_GRAPH_CAPTURE
    v0_profile = ("llm_engine.py:_initialize_kv_caches", "worker.py:determine_num_available_blocks")
    assert frame_phase((*v0_profile, "model_runner.py:execute_model")) is Phase.KV_CACHE_ALLOC
    draft = ("full_cuda_graph_backend.py:capture_one", "eagle_draft_cuda_graph_runner.py:run_once")
    assert frame_phase(draft) is Phase.DRAFT_CUDA_GRAPH_CAPTURE
    assert frame_phase(("model_runner.py:__init__", "model_runner.py:initialize")) is None
    assert frame_phase(("parallel_state.py:initialize_model_parallel",)) is Phase.STARTUP_OTHER
    cut = frame_step(("model_runner.py:initialize", "cut:init_cu"))
    assert cut is not None and (cut.phase, cut.guessed) == (Phase.CUDA_GRAPH_CAPTURE, True)
    assert frame_step(("model_runner.py:initialize", "cut:init")) is None  # too short to narrow
    assert import_time(("runpy.py:_run_module_as_main", "launch_server.py:<module>"))
    assert not import_time(("launch_server.py:<module>", "model_runner.py:load_model"))


def test_sglang_code_line_cut_mid_call_is_a_guessed_step() -> None:
    lines = [
        "[2025-03-17 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 166, in __init__',
        "    self.initialize(min_per_gpu_memory)",
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 207, in initialize',
        "    self.init_cu",
    ]
    d = diagnose(lines)
    assert d.phase is Phase.CUDA_GRAPH_CAPTURE and d.confidence < 0.5
    assert any("cut off mid-word" in n for n in d.notes)


def test_faulthandler_dump_frames_are_read() -> None:
    lines = [
        "Fatal Python error: Aborted",
        "",
        "Thread 0x00007ee43d7fe640 (most recent call first):",
        '  File "/sgl/python/sglang/srt/managers/tp_worker_overlap_thread.py", line 114 in forward_thread_func',
        '  File "/usr/lib/python3.10/threading.py", line 953 in run',
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.SERVING)


def test_interleaved_workers_are_ordered_by_time_not_by_line() -> None:
    # Ray prints deduplicated lines seconds late: the last lines of the file are older steps.
    lines = [
        "(EngineCore_DP0 pid=1) INFO 06-10 11:10:40 [gpu_worker.py:480] Available KV cache memory: 25.94 GiB",
        "(RayWorkerProc pid=3) (Worker_DP0_TP0 pid=3) INFO 06-10 11:11:10 [custom_all_reduce.py:211] Registering "
        "5590 cuda graph addresses",
        "(RayWorkerProc pid=4, ip=10.0.0.2) (Worker_DP1_TP1 pid=4) INFO 06-10 11:10:49 [gpu_model_runner.py:6517] "
        "Estimated CUDA graph memory: 1.47 GiB total [repeated 7x across cluster]",
        "(RayWorkerProc pid=4, ip=10.0.0.2) (Worker_DP1_TP1 pid=4) INFO 06-10 11:10:49 [gpu_worker.py:480] "
        "Available KV cache memory: 25.94 GiB [repeated 3x across cluster]",
    ]
    d = diagnose(lines)
    assert d.phase is Phase.WARMUP, d.cause
    assert "[repeated" not in " ".join(d.evidence)


def test_vllm_v1_clean_startup_is_ready() -> None:
    lines = [
        "(EngineCore_DP0 pid=441) INFO 12-31 14:54:54 [gpu_model_runner.py:3341] Model loading took 2.0513 GiB "
        "memory and 27.200487 seconds",
        "(EngineCore_DP0 pid=441) INFO 12-31 14:55:17 [gpu_worker.py:348] Available KV cache memory: 33.31 GiB",
        "(EngineCore_DP0 pid=441) INFO 12-31 14:55:18 [kv_cache_utils.py:1234] GPU KV cache size: 1,587,648 tokens",
        "Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:01<00:00, 33.86it/s]",
        "(EngineCore_DP0 pid=441) INFO 12-31 14:55:21 [gpu_model_runner.py:4000] Graph capturing finished in 3 secs, "
        "took 0.55 GiB",
        "(EngineCore_DP0 pid=441) INFO 12-31 14:55:22 [core.py:250] init engine (profile, create kv cache, warmup "
        "model) took 30.1 seconds",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.READY, Phase.WARMUP)
    d2 = diagnose(
        [
            *lines,
            "(APIServer pid=1) INFO 12-31 14:55:25 [launcher.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000",
        ]
    )
    # Up, no request yet: warmup; vLLM's uvicorn access lines carry no prefix.
    assert (d2.outcome, d2.phase, d2.confidence) == (Outcome.READY, Phase.WARMUP, 0.9)
    d3 = diagnose(
        [
            *lines,
            "(APIServer pid=1) INFO 12-31 14:55:25 [launcher.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000",
            'INFO:     127.0.0.1:40112 - "POST /v1/completions HTTP/1.1" 200 OK',
        ]
    )
    assert (d3.outcome, d3.phase, d3.confidence) == (Outcome.READY, Phase.SERVING, 0.98)


def test_vllm_step_lines_move_the_phase() -> None:
    base = "(EngineCore_DP0 pid=9) INFO 01-01 10:00:{s:02d} [x.py:1] {m}"
    steps = [
        ("Initializing a V1 LLM engine (v0.11.0) with config: model='m'", Phase.STARTUP_OTHER),
        ("Starting to load model m...", Phase.WEIGHT_LOADING),
        ("Dynamo bytecode transform time: 6.07 s", Phase.KV_CACHE_ALLOC),
        ("Compile and warming up model for size 512", Phase.WARMUP),
    ]
    lines: list[str] = []
    for i, (msg, phase) in enumerate(steps):
        lines.append(base.format(s=i, m=msg))
        d = diagnose(lines)
        assert (d.outcome, d.phase) == (Outcome.UNKNOWN, phase), msg
        assert d.confidence < 0.5


@pytest.mark.parametrize(
    ("free", "outcome"),
    [("2.80", Outcome.OOM), ("18.60", Outcome.CRASH)],
)
def test_free_memory_at_the_failing_step_moves_the_oom_guess(free: str, outcome: Outcome) -> None:
    lines = [
        "[2026-03-02 09:01:11 TP0] Load weight end. type=M, dtype=torch.bfloat16, avail mem=50.00 GB, "
        "mem usage=40.00 GB.",
        f"[2026-03-02 09:01:12 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem={free} GB",
        "[2026-03-02 09:01:20 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/p/sglang/srt/model_executor/cuda_graph_runner.py", line 9, in capture',
        "    self.capture_one_batch_size(bs, forward)",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (outcome, Phase.CUDA_GRAPH_CAPTURE)
    assert d.confidence < 0.5 and free[:-1] in d.cause
    assert "not in the log" in d.cause


def test_old_sglang_prefixes_are_read() -> None:
    lines = [
        "[23:17:01 TP7] Load weight end. type=DeepseekV2ForCausalLM, dtype=torch.bfloat16, avail mem=22.01 GB",
        "[23:17:01 TP7] Memory pool end. avail mem=18.61 GB",
        "[gpu_id=0] Capture cuda graph begin. This can take up to several minutes.",
    ]
    d = diagnose(lines)
    assert (d.engine, d.phase) == (Engine.SGLANG, Phase.CUDA_GRAPH_CAPTURE)
    assert d.figures["slack_now"] == pytest.approx(18.61)


def test_a_capture_failure_in_the_draft_runner_is_the_draft_phase() -> None:
    lines = [
        "[2026-07-22 15:49:00 TP0] Capture cuda graph end. Time elapsed: 12.11 s. mem usage=0.54 GB. "
        "avail mem=16.74 GB.",
        "[2026-07-22 15:49:08 DP0 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/speculative/eagle_draft_cuda_graph_runner.py", line 446, in run_once',
        "    ret = self.eagle_worker.draft_forward(forward_batch)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
        "79.11 GiB of which 1.00 GiB is free.",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase, d.gpu) == (Outcome.OOM, Phase.DRAFT_CUDA_GRAPH_CAPTURE, 3)
    assert d.confidence >= 0.9


def test_stream_capture_errors_are_capture_crashes_not_nccl_or_watchdog() -> None:
    line = (
        "[rank0]:[E1030 15:32:32.970893361 ProcessGroupNCCL.cpp:2055] [PG ID 5 PG GUID 51 Rank 0] Process group "
        "watchdog thread terminated with exception: CUDA error: operation not permitted when stream is capturing"
    )
    d = diagnose([line])
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.CUDA_GRAPH_CAPTURE)
    assert not any("mem" in f.change for f in d.fixes)


def test_oom_advice_is_not_an_oom() -> None:
    lines = [
        "(VllmWorkerProcess pid=9) INFO 08-19 07:51:12 model_runner.py:1024] Capturing the model for CUDA graphs.",
        "(VllmWorkerProcess pid=9) INFO 08-19 07:51:12 model_runner.py:1028] CUDA graphs can take additional 1~3 GiB "
        "memory per GPU. If you are running out of memory, consider decreasing `gpu_memory_utilization`.",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.UNKNOWN, Phase.CUDA_GRAPH_CAPTURE)


def test_a_bare_oom_line_names_no_phase_and_stays_below_half() -> None:
    d = diagnose(
        [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 72.00 MiB. GPU 0 has a total capacity of "
            "39.56 GiB of which 60.81 MiB is free."
        ]
    )
    assert (d.outcome, d.phase, d.gpu) == (Outcome.OOM, None, 0)
    assert d.confidence < 0.5 and "a step the log does not show" in d.cause


def test_free_memory_on_startup_is_a_memory_failure_before_weights() -> None:
    line = (
        "(EngineCore_DP0 pid=17) ERROR 09-28 15:47:24 [core.py:718] ValueError: Free memory on device (3.22/4.0 GiB) "
        "on startup is less than desired GPU memory utilization (0.9, 3.6 GiB). Decrease GPU memory utilization or "
        "reduce GPU memory used by other processes."
    )
    d = diagnose([line])
    assert (d.outcome, d.phase, d.free_gib, d.total_gib) == (Outcome.OOM, Phase.STARTUP_OTHER, 3.22, 4.0)
    assert d.fixes[0].change == "--gpu-memory-utilization 0.79"


def test_old_torch_capacity_typo_is_read() -> None:
    d = diagnose(
        [
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty "
            "of 6.00 GiB of which 0 bytes is free."
        ]
    )
    assert (d.tried_to_allocate_gib, d.total_gib, d.free_gib) == (1.7, 6.0, 0.0)


@pytest.mark.parametrize(
    ("line", "phase"),
    [
        (
            "(VllmWorkerProcess pid=9) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] Exception in worker "
            "VllmWorkerProcess while processing method determine_num_available_blocks.",
            Phase.KV_CACHE_ALLOC,
        ),
        (
            "(RayWorkerWrapper pid=38526, ip=10.244.1.95) ERROR 04-17 15:12:32 [worker_base.py:620] Error executing "
            "method 'load_model'. This might cause deadlock in distributed execution.",
            Phase.WEIGHT_LOADING,
        ),
    ],
)
def test_a_wrapper_that_names_the_worker_method_gives_the_step_not_the_cause(line: str, phase: Phase) -> None:
    d = diagnose([line])
    assert d.phase is phase
    assert d.confidence < 0.5 and "not in the log" in d.cause


_PCG = "[2026-06-10 13:08:34 TP7] Piecewise CUDA Graph failed with error: 'Ctx' object has no attribute 'num_tokens'"
_SCHED = "[2026-06-10 13:08:34 TP7] Scheduler hit an exception: Traceback (most recent call last):"


def test_a_graph_wrapper_line_is_capture_unless_the_traceback_is_the_serving_loop() -> None:
    frame = '  File "/sgl/srt/managers/scheduler.py", line 1, in __init__'
    init = [_PCG, _SCHED, frame, "    self.init_model_worker()"]
    d = diagnose(init)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.CUDA_GRAPH_CAPTURE)
    serving = [_PCG, _SCHED, '  File "/sgl/srt/managers/scheduler.py", line 1, in event_loop_overlap', "    x()"]
    assert diagnose(serving).phase is Phase.SERVING


def test_vllm_compilation_files_name_their_own_steps() -> None:
    assert frame_phase(("compilation/backends.py:call_module",)) is Phase.KV_CACHE_ALLOC
    assert frame_phase(("compilation/cuda_graph.py:__call__", "graphs.py:capture_end")) is Phase.CUDA_GRAPH_CAPTURE
    assert frame_phase(("llama.py:__init__", "compilation/decorators.py:__init__", "llama.py:make_layers")) is (
        Phase.WEIGHT_LOADING
    )
    assert frame_phase(("custom_all_reduce.py:register_graph_buffers",)) is Phase.CUDA_GRAPH_CAPTURE


def test_torch_compile_frames_in_sglang_point_at_capture_as_a_guess() -> None:
    lines = [
        "[2025-12-20 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/x/torch/_dynamo/eval_frame.py", line 1044, in _fn',
        "    return fn(*args, **kwargs)",
        '  File "/x/torch/fx/graph_module.py", line 837, in call_wrapped',
        "    return self._wrapped_call(self, *args, **kwargs)",
    ]
    d = diagnose(lines)
    assert d.phase is Phase.CUDA_GRAPH_CAPTURE and d.confidence < 0.5


def test_host_memory_is_not_a_gpu_oom() -> None:
    line = (
        "Failed to load model with Error: unable to mmap 4965799096 bytes from file <m/model-00001-of-00002"
        ".safetensors>: Cannot allocate memory ("
    )
    d = diagnose([line])
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.WEIGHT_LOADING)
    assert "not GPU memory" in d.cause and d.fixes and "host RAM" in d.fixes[0].change
