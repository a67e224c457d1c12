"""Where a server died when no phase line says so: the frame -> phase map, the draft's code, no traffic yet.

Synthetic lines in each engine's own formats (frame names from SGLang's and vLLM's runner, loader and
worker sources), one rule per test, so a failure names the rule that broke. The corpus, the live vLLM logs
and the twin's fault logs (test_logs_corpus.py) check the same rules on real output.
"""

from __future__ import annotations

import pytest

from dsv4lab.logs import Outcome, Phase, diagnose
from dsv4lab.logs.steps import ambiguous_dummy_run, entry_step, frame_step

SG = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
VL = "/usr/local/lib/python3.12/dist-packages/vllm"
V1 = "(EngineCore_DP0 pid=7) ERROR 05-16 23:42:10 [core.py:700]"
W = "(Worker_TP0 pid=9) ERROR 05-16 23:42:10 [multiproc_executor.py:671]"


def _sglang_tb(frames: list[tuple[str, str, str]], exc: str | None, tag: str = "TP0") -> list[str]:
    lines = [f"[2026-05-16 23:42:10 {tag}] Scheduler hit an exception: Traceback (most recent call last):"]
    for path, func, code in frames:
        lines += [f'  File "{SG}/{path}", line 1, in {func}', f"    {code}"]
    return [*lines, exc] if exc else lines


def _vllm_tb(frames: list[tuple[str, str, str]], exc: str | None, prefix: str = V1) -> list[str]:
    lines = [f"{prefix} Traceback (most recent call last):"]
    for path, func, code in frames:
        lines += [f'{prefix}   File "{VL}/{path}", line 1, in {func}', f"{prefix}     {code}"]
    return [*lines, f"{prefix} {exc}"] if exc else lines


_SCHED = ("managers/scheduler.py", "run_scheduler_process", "scheduler = Scheduler(")


# -- frames -> phase --------------------------------------------------------------------------------------


def test_weight_loader_folders_name_the_step_without_a_load_line() -> None:
    # Both engines keep their loaders in a model_loader/ folder; the function names vary by release.
    sg = _sglang_tb([_SCHED, ("model_loader/loader.py", "load_weights_and_postprocess", "model.load_weights(w)")], None)
    assert diagnose(sg).phase is Phase.WEIGHT_LOADING
    vl = _vllm_tb([("model_executor/model_loader/default_loader.py", "_get_all_weights", "yield from w")], None)
    assert diagnose(vl).phase is Phase.WEIGHT_LOADING
    # Without the folder the same basename names nothing.
    assert frame_step(("loader.py:_get_all_weights",)) is None


@pytest.mark.parametrize(
    "frames",
    [
        ("argparse.py:parse_known_args", "argparse.py:error"),
        ("main.py:main", "utils.py:parse_args"),
        ("launch_server.py:<module>", "server_args.py:prepare_server_args", "server_args.py:__post_init__"),
        ("engine.py:_launch_subprocesses", "engine.py:_set_envs_and_config", "utils.py:assert_pkg_version"),
        ("api_server.py:run_server", "arg_utils.py:create_engine_config"),
        ("api_server.py:setup_server", "api_server.py:create_server_socket"),
    ],
)
def test_argument_and_environment_frames_are_startup(frames: tuple[str, ...]) -> None:
    ev = frame_step(frames)
    assert ev is not None and ev.phase is Phase.STARTUP_OTHER and not ev.guessed


def test_cli_refusal_traceback_is_startup() -> None:
    lines = [
        "$ vllm serve --model m",
        "Traceback (most recent call last):",
        f'  File "{VL}/entrypoints/cli/main.py", line 48, in main',
        "    args = parser.parse_args()",
        f'  File "{VL}/utils.py", line 1391, in parse_args',
        "    raise ValueError(",
        "ValueError: With `vllm serve`, you should provide the model as a positional argument.",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.STARTUP_OTHER)


def test_argparse_usage_block_cut_before_its_error_line() -> None:
    usage = [
        "usage: launch_server.py [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH] [--host HOST]",
        "                        [--port PORT] [--tp-size TP_SIZE]",
    ]
    d = diagnose(usage)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.STARTUP_OTHER) and d.confidence < 0.5
    assert "not in the log" in d.cause and "usage" in d.cause
    full = diagnose([*usage, "launch_server.py: error: unrecognized arguments: --enable-reasoning"])
    assert (full.outcome, full.phase) == (Outcome.CRASH, Phase.STARTUP_OTHER) and full.confidence >= 0.9
    assert "unrecognized arguments" in full.cause


def test_exception_raised_in_the_process_entry_is_setup() -> None:
    lines = [
        "Process Process-6:",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.10/multiprocessing/process.py", line 314, in _bootstrap',
        "    self.run()",
        f'  File "{SG}/managers/scheduler.py", line 1984, in run_scheduler_process',
        "    faulthandler.enable()",
        "OSError: [Errno 12] Cannot allocate memory",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.STARTUP_OTHER)
    assert any("process's own setup" in n for n in d.notes)
    # Only a complete block says so: a cut one stops wherever the cut fell.
    assert diagnose(lines[:-1]).phase is None
    assert entry_step(("process.py:_bootstrap", "scheduler.py:run_scheduler_process", "call:enable")) is not None
    assert entry_step(("scheduler.py:run_scheduler_process", "scheduler.py:event_loop_overlap")) is None


def test_vllm_sampler_warmup_called_by_the_worker_is_warmup() -> None:
    # gpu_worker.compile_or_warm_up_model is the only caller of self.model_runner._dummy_sampler_run; the
    # profiling pass calls self._dummy_sampler_run from inside the runner.
    cut = [
        f"{W}     self.model_runner._dummy_sampler_run(",
        f"{W}         hidden_states=last_hidden_states)",
        f'{W}   File "{VL}/v1/worker/gpu_model_runner.py", line 3221, in _dummy_sampler_run',
        f"{W}     raise RuntimeError(",
        f"{W} RuntimeError: CUDA out of",
    ]
    assert diagnose(cut).phase is Phase.WARMUP
    profile = _vllm_tb(
        [
            ("v1/worker/gpu_model_runner.py", "profile_run", "output = self._dummy_sampler_run(h)"),
            ("v1/worker/gpu_model_runner.py", "_dummy_sampler_run", "raise RuntimeError("),
        ],
        None,
    )
    assert diagnose(profile).phase is Phase.KV_CACHE_ALLOC


def test_bare_dummy_run_frame_is_warmup_only_after_the_kv_cache_exists() -> None:
    frames = _vllm_tb([("v1/worker/gpu_model_runner.py", "_dummy_sampler_run", "x = self.sampler(l)")], None)
    assert ambiguous_dummy_run(("gpu_model_runner.py:_dummy_sampler_run",))
    assert diagnose(frames).phase is None  # profiling pass or warm-up: the frame alone cannot say
    after = [
        "(EngineCore_DP0 pid=7) INFO 05-16 23:42:00 [kv_cache_utils.py:1234] GPU KV cache size: 1,587,648 tokens",
        "(EngineCore_DP0 pid=7) INFO 05-16 23:42:09 [gpu_model_runner.py:4000] Graph capturing finished in 3 secs, "
        "took 0.55 GiB",
        *frames,
    ]
    d = diagnose(after)
    assert d.phase is Phase.WARMUP and any("dummy-run" in n for n in d.notes)


# -- the draft's capture --------------------------------------------------------------------------------------


def test_sglang_capture_inside_the_draft_worker_is_the_drafts() -> None:
    # 0.5.x: the scheduler builds the draft worker, whose own init_cuda_graphs captures the draft's graphs.
    draft = _sglang_tb(
        [
            _SCHED,
            ("managers/scheduler.py", "maybe_init_draft_worker", "self.draft_worker = DraftWorkerClass(**kw)"),
            ("speculative/eagle_worker_v2.py", "__init__", "self.init_cuda_graphs()"),
            ("speculative/eagle_worker_v2.py", "init_cuda_graphs", "self.cuda_graph_runner = Device2Draft[d](self)"),
        ],
        None,
    )
    assert diagnose(draft).phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE
    # 0.5.23: init_all_cuda_graphs captures the target through tp_worker, then the draft through its worker.
    ev = frame_step(("scheduler.py:init_all_cuda_graphs", "speculative/eagle_worker_v2.py:init_cuda_graphs"))
    assert ev is not None and ev.phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE
    target = frame_step(
        ("scheduler.py:init_all_cuda_graphs", "tp_worker.py:init_cuda_graphs", "cuda_graph_runner.py:capture")
    )
    assert target is not None and target.phase is Phase.CUDA_GRAPH_CAPTURE
    # Speculative helpers the target's verify graph calls are not the draft's code.
    verify = frame_step(("cuda_graph_runner.py:capture_one_batch_size", "speculative/eagle_utils.py:generate_attn_arg"))
    assert verify is not None and verify.phase is Phase.CUDA_GRAPH_CAPTURE


@pytest.mark.parametrize(
    "runner",
    [
        "speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py",
        "speculative/frozen_kv_mtp_cuda_graph_runner.py",
        "speculative/uno_cuda_graph_runner.py",
    ],
)
def test_every_sglang_draft_runner_file_is_draft_capture(runner: str) -> None:
    ev = frame_step((f"{runner}:capture",))
    assert ev is not None and ev.phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE


def test_vllm_drafter_inside_the_capture_pass_is_the_drafts() -> None:
    # The target's _dummy_run captures the drafter's graph through drafter.dummy_run (spec_decode/).
    tb = _vllm_tb(
        [
            ("v1/worker/gpu_model_runner.py", "capture_model", "self._capture_cudagraphs("),
            ("v1/worker/gpu_model_runner.py", "_dummy_run", "self.drafter.dummy_run(n)"),
            ("v1/spec_decode/eagle.py", "dummy_run", "self.model(input_ids=x)"),
        ],
        "RuntimeError: shape mismatch",
    )
    d = diagnose(tb)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.DRAFT_CUDA_GRAPH_CAPTURE)
    helper = frame_step(("gpu_model_runner.py:capture_model", "spec_decode/utils.py:prepare_inputs"))
    assert helper is not None and helper.phase is Phase.CUDA_GRAPH_CAPTURE
    oom = diagnose([*tb[:-1], f"{V1} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB."])
    assert (oom.outcome, oom.phase) == (Outcome.OOM, Phase.DRAFT_CUDA_GRAPH_CAPTURE)
    assert '"enforce_eager": true' in oom.fixes[0].change  # the drafter's own switch, not the target's


def test_draft_capture_line_and_its_progress() -> None:
    lines = [
        "[2026-05-16 23:40:00 TP0] Capture Frozen-KV MTP draft cuda graph begin.",
        "Capturing batches (bs=8 avail_mem=3.00 GB):  50%|█████     | 2/4 [00:01<00:01,  1.2it/s]",
    ]
    assert diagnose(lines).phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE


def test_draft_capture_cut_before_its_exception_guesses_crash_and_fixes_the_drafts_sizes() -> None:
    cut = _sglang_tb(
        [
            ("speculative/eagle_draft_extend_cuda_graph_runner.py", "capture", "CudaGraphRunner.capture(self)"),
            ("speculative/eagle_draft_extend_cuda_graph_runner.py", "run_once", "ret = self.model.forward(b)"),
        ],
        None,
    )
    d = diagnose(cut)
    assert (d.outcome, d.phase) == (Outcome.CRASH, Phase.DRAFT_CUDA_GRAPH_CAPTURE) and d.confidence < 0.5
    oom = diagnose(
        [
            "[2026-05-16 23:40:00] server_args=ServerArgs(model_path='m', tp_size=2, mem_fraction_static=0.8, "
            "speculative_num_steps=3, speculative_eagle_topk=4, speculative_num_draft_tokens=8)",
            *cut,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.20 MiB. GPU 0 has a total capacity "
            "of 24.00 GiB of which 2.37 MiB is free.",
        ]
    )
    assert (oom.outcome, oom.phase) == (Outcome.OOM, Phase.DRAFT_CUDA_GRAPH_CAPTURE)
    changes = [f.change for f in oom.fixes]
    assert changes[:2] == ["--speculative-num-steps 2", "--speculative-eagle-topk 1"], changes
    assert changes.index("--speculative-num-steps 2") < next(i for i, c in enumerate(changes) if "fraction" in c)
    assert "3.2 MiB" in oom.cause  # a small allocation reads in MiB, not "0.00 GiB"


# -- up, with no traffic yet ----------------------------------------------------------------------------------


def test_sglang_health_probe_after_ready_is_no_traffic() -> None:
    ready = [
        "[2026-05-16 23:41:00 TP0] max_total_num_tokens=1000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=256, context_len=32768, available_gpu_mem=15.90 GB",
        "[2026-05-16 23:41:02] The server is fired up and ready to roll!",
    ]
    # /health runs a one-token generation of input_ids=[0]: one sequence, one new token.
    probe = (
        "[2026-05-16 23:41:03 TP0] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, "
    )
    real = probe.replace("#new-token: 1,", "#new-token: 37,")
    assert diagnose([*ready, probe]).phase is Phase.WARMUP
    assert diagnose([*ready, probe, real]).phase is Phase.SERVING


def test_vllm_route_list_is_ready_and_no_traffic_is_warmup() -> None:
    lines = [
        "(APIServer pid=1) INFO 07-21 04:58:58 [launcher.py:37] Available routes are:",
        "(APIServer pid=1) INFO 07-21 04:58:58 [launcher.py:46] Route: /openapi.json, Methods: HEAD, GET",
        "(APIServer pid=1) INFO 07-21 04:58:58 [launcher.py:46] Route: /v1/completions, Methods: POST",
    ]
    d = diagnose(lines)
    assert (d.outcome, d.phase) == (Outcome.READY, Phase.WARMUP) and d.confidence >= 0.9
    stats = (
        "(APIServer pid=1) INFO 07-21 04:59:08 [loggers.py:335] Engine 000: Avg prompt throughput: 120.0 tokens/s, "
        "Avg generation throughput: 40.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%"
    )
    assert diagnose([*lines, stats]).phase is Phase.SERVING  # logged at INFO only when the engine is not idle
