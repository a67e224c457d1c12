"""Engine lines behind wrappers nobody configured for, and excerpts that stop where they cannot say more.

Users paste what their tooling printed: journald, a log viewer's borders, a cloud export, a site logging
format, a rank tag without its timestamp. The engine's own line is inside; the reader finds it.
"""

from __future__ import annotations

from dsv4lab.logs import Engine, Outcome, Phase, diagnose

_TRACEBACK_CORE = [
    'File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 507, in '
    "compile_or_warm_up_model",
    "self.model_runner._dummy_sampler_run(hidden_states=last_hidden_states)",
    'File "/usr/local/lib/python3.12/dist-packages/torch/utils/_contextlib.py", line 120, in decorate_context',
    "return func(*args, **kwargs)",
]


def test_journald_prefix() -> None:
    line = (
        "Aug 18 14:15:04 llm python3[28059]: (EngineCore pid=28059) INFO 08-18 14:15:04 [gpu_model_runner.py:1] "
        "Starting to load model /models/m..."
    )
    d = diagnose([line])
    assert (d.engine, d.phase, d.outcome) == (Engine.VLLM, Phase.WEIGHT_LOADING, Outcome.UNKNOWN)


def test_log_viewer_borders() -> None:
    lines = [
        "│ INFO 03-21 20:15:45 [worker.py:267] Memory profiling takes 34.26 seconds            │",
        "│ INFO 03-21 20:15:46 [executor_base.py:111] # cuda blocks: 7191, # CPU blocks: 512   │",
    ]
    d = diagnose(lines)
    assert (d.engine, d.phase) == (Engine.VLLM, Phase.KV_CACHE_ALLOC)


def test_cloud_export_wrapper_with_a_flattened_traceback() -> None:
    wrap = (
        "INFO 2025-11-19T20:16:36.0966{i:05d}Z [resource.labels.containerName: vllm] (EngineCore_DP0 pid=270) "
        "ERROR 11-19 12:16:36 [v1/engine/core.py:842] {m}"
    )
    d = diagnose([wrap.format(i=i, m=m) for i, m in enumerate(_TRACEBACK_CORE)])
    assert d.phase is Phase.WARMUP and d.confidence < 0.5
    assert "not in the log" in d.cause


def test_site_logging_format_traceback() -> None:
    wrap = "2025-06-18 13:43:34 ERROR 31423 [ TP6 PP0 scheduler.py:2547] {m}^M"
    msgs = [
        "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/home/SGLang/python/sglang/srt/managers/scheduler.py", line 2528, in run_scheduler_process',
        "    scheduler.event_loop_pp()",
        '  File "/home/SGLang/python/sglang/srt/managers/scheduler.py", line 735, in event_loop_pp',
        "    mbs[mb_id] = sel",
    ]
    d = diagnose([wrap.format(m=m) for m in msgs])
    assert d.phase is Phase.SERVING and d.confidence < 0.5


def test_rank_tag_without_timestamp() -> None:
    lines = [
        "[TP3] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 1, in event_loop_overlap',
        "    batch = self.get_next_batch_to_run()",
        "RuntimeError: Prefill out of memory. Try to lower your batch size.",
    ]
    d = diagnose(lines)
    assert (d.engine, d.rank, d.outcome, d.phase) == (Engine.SGLANG, 3, Outcome.OOM, Phase.SERVING)


def test_an_unknown_exception_on_the_last_line_may_be_cut() -> None:
    lines = [
        "(Worker pid=7) ERROR 10-25 13:12:42 [multiproc_executor.py:671] Traceback (most recent call last):",
        "(Worker pid=7) ERROR 10-25 13:12:42 [multiproc_executor.py:671]   "
        'File "/x/vllm/v1/worker/gpu_model_runner.py", line 3221, in _dummy_sampler_run',
        "(Worker pid=7) ERROR 10-25 13:12:42 [multiproc_executor.py:671]     raise RuntimeError(",
        "(Worker pid=7) ERROR 10-25 13:12:42 [multiproc_executor.py:671] RuntimeError: CUDA out of",
    ]
    d = diagnose(lines)
    assert d.outcome is Outcome.CRASH and d.confidence < 0.5
    assert "may not be in the log" in d.cause
    # The sampler warmup runs in profiling and after capture: its frame alone names no step.
    assert d.phase is None


def test_serving_excerpts_and_a_live_http_server_do_not_prove_health() -> None:
    decode = (
        "[2025-12-12 08:43:59 TP0] Decode batch, #running-req: 6, #token: 1920, token usage: 0.94, cuda graph: "
        "True, gen throughput (token/s): 446.45, #queue-req: 5,"
    )
    d = diagnose([decode] * 3)
    assert (d.outcome, d.phase) == (Outcome.READY, Phase.SERVING) and d.confidence < 0.5
    served = [
        "[2024-12-09 16:10:09] INFO:     Uvicorn running on http://0.0.0.0:8008 (Press CTRL+C to quit)",
        "[2024-12-09 16:10:51 TP0] Prefill batch. #new-seq: 1, #new-token: 25, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0",
        "[2024-12-09 16:10:56 TP0] Decode batch. #running-req: 1, #token: 66, token usage: 0.00, gen throughput "
        "(token/s) 12.00, #queue-req: 0",
    ]
    d2 = diagnose(served)
    assert (d2.outcome, d2.phase) == (Outcome.READY, Phase.SERVING) and d2.confidence < 0.5
    d3 = diagnose(served[:1])
    assert (d3.outcome, d3.phase) == (Outcome.READY, Phase.WARMUP) and "warmup request may still fail" in d3.cause


def test_sglang_0_1_serving_lines() -> None:
    lines = [
        "new fill batch. #seq: 1. #cached_token: 478. #new_token: 254. #remaining_req: 0. #running_req: 4.",
        "#running-req: 3, #token: 1442, token usage: 0.18, #queue-req: 0",
    ]
    d = diagnose(lines)
    assert (d.engine, d.outcome, d.phase) == (Engine.SGLANG, Outcome.READY, Phase.SERVING)
