"""Parser and classifier on synthetic lines in each release's format (our own lines, shaped by the reference)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from dsv4lab.logs import (
    Capacity,
    DecodeBatch,
    DistInit,
    Engine,
    ErrorEvent,
    ErrorKind,
    Event,
    GraphCapture,
    GraphProgress,
    KernelConfig,
    KVCache,
    LineKind,
    LogParser,
    MemoryPoolEnd,
    Phase,
    PhaseChange,
    PrefillBatch,
    RunStart,
    ServerArgs,
    VllmMemoryProfile,
    WeightLoad,
    classify_line,
    decode_frame,
    events_frame,
    iter_lines,
    memory_frame,
    parse_line,
    parse_log,
    parse_server_args,
)

DATA = Path(__file__).parent / "data" / "logs"


def _one(line: str) -> Event:
    ev = parse_line(line)
    assert ev is not None, line
    return ev


# -- SGLang 0.4.10 / 0.5.4 (old style) ----------------------------------------------------------------------


def test_old_weight_lines_with_ranks() -> None:
    begin = _one("[2025-09-01 10:00:00 DP1 TP3] Load weight begin. avail mem=93.25 GB")
    assert isinstance(begin, WeightLoad)
    assert (begin.stage, begin.avail_gib, begin.rank, begin.dp) == ("begin", 93.25, 3, 1)
    end = _one(
        "[2025-09-01 10:01:00 TP3] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=21.96 GB, mem usage=8.81 GB."
    )
    assert isinstance(end, WeightLoad)
    assert (end.stage, end.model_class, end.dtype, end.avail_gib, end.usage_gib) == (
        "end",
        "Qwen3ForCausalLM",
        "torch.bfloat16",
        21.96,
        8.81,
    )
    assert end.engine is Engine.SGLANG


def test_old_kv_pool_mha_and_mla() -> None:
    mha = _one("[2025-09-01 10:01:01 TP0] KV Cache is allocated. #tokens: 413000, K size: 9.45 GB, V size: 9.45 GB")
    assert isinstance(mha, KVCache)
    assert (mha.tokens, mha.k_gib, mha.v_gib) == (413000, 9.45, 9.45)
    assert mha.size_gib == pytest.approx(18.9)
    mla = _one("[2025-09-01 10:01:01 TP0] KV Cache is allocated. #tokens: 900000, KV size: 30.10 GB")
    assert isinstance(mla, KVCache)
    assert mla.kv_gib == 30.10 and mla.size_gib == 30.10


def test_old_capture_lines_target_and_draft() -> None:
    b = _one(
        "[2025-09-01 10:01:02 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=12.50 GB"
    )
    assert isinstance(b, GraphCapture)
    assert (b.stage, b.role, b.graph, b.avail_gib) == ("begin", "target", "decode", 12.5)
    e = _one(
        "[2025-09-01 10:01:30 TP0] Capture cuda graph end. Time elapsed: 27.50 s. mem usage=1.44 GB. avail mem=11.06 GB."  # noqa: E501
    )
    assert isinstance(e, GraphCapture)
    assert (e.stage, e.elapsed_s, e.usage_gib, e.avail_gib) == ("end", 27.5, 1.44, 11.06)
    d = _one(
        "[2025-09-01 10:02:00 TP1] Capture draft extend cuda graph end. Time elapsed: 3.00 s. mem usage=0.21 GB. avail mem=9.00 GB."  # noqa: E501
    )
    assert isinstance(d, GraphCapture)
    assert (d.role, d.graph, d.usage_gib, d.rank) == ("draft", "extend", 0.21, 1)
    plan = _one("[2025-09-01 10:01:02 TP0] Capture cuda graph bs [1, 2, 4, 8, 16]")
    assert isinstance(plan, GraphCapture)
    assert plan.stage == "plan" and plan.bs == (1, 2, 4, 8, 16)
    bare = _one("[2025-04-15 17:51:46 TP4] Capture cuda graph end. Time elapsed: 1334.38 s")
    assert isinstance(bare, GraphCapture) and bare.elapsed_s == 1334.38 and bare.usage_gib is None


def test_old_batch_lines_0_4_10_and_0_5_4() -> None:
    d = _one(
        "[2025-09-01 11:00:00 TP0] Decode batch. #running-req: 8, #token: 37217, token usage: 0.13, accept len: 2.90, "
        "cuda graph: True, gen throughput (token/s): 171.01, #queue-req: 0, "
    )
    assert isinstance(d, DecodeBatch)
    assert (d.running, d.tokens, d.token_usage, d.accept_len, d.cuda_graph, d.gen_throughput, d.queue) == (
        8,
        37217,
        0.13,
        2.90,
        True,
        171.01,
        0,
    )
    d2 = _one(
        "[2025-10-06 20:05:22 DP0 TP0] Decode batch, #running-req: 3, #token: 900, token usage: 0.01, "
        "accept len: 1.80, accept rate: 0.90, cuda graph: False, gen throughput (token/s): 55.50, #queue-req: 2, "
    )
    assert isinstance(d2, DecodeBatch)
    assert (d2.accept_rate, d2.cuda_graph, d2.queue) == (0.90, False, 2)
    p = _one(
        "[2025-10-06 20:05:20 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, "
    )
    assert isinstance(p, PrefillBatch)
    assert (p.new_seq, p.new_tokens, p.cached_tokens, p.running, p.queue) == (1, 7, 0, 0, 0)


def test_capacity_summary_and_pool_end() -> None:
    c = _one(
        "[2025-09-01 10:02:05 TP0] max_total_num_tokens=2261377, chunked_prefill_size=16384, max_prefill_tokens=16384,"
        " max_running_requests=4096, context_len=128000, available_gpu_mem=37.06 GB"
    )
    assert isinstance(c, Capacity)
    assert (c.max_total_num_tokens, c.chunked_prefill_size, c.context_len, c.available_gib) == (
        2261377,
        16384,
        128000,
        37.06,
    )
    m = _one("[2025-09-01 10:01:01 TP2] Memory pool end. avail mem=14.00 GB")
    assert isinstance(m, MemoryPoolEnd) and m.avail_gib == 14.0


# -- SGLang 0.5.16 / 0.5.23 (new style) ---------------------------------------------------------------------


def test_new_weight_and_kv_lines() -> None:
    w = _one(
        "[2026-02-01 08:00:10 TP1] Load weight end. elapsed=41.20 s, type=DeepseekV4ForCausalLM, quant=fp8, "
        "avail mem=60.50 GB, mem usage=33.10 GB."
    )
    assert isinstance(w, WeightLoad)
    assert (w.elapsed_s, w.model_class, w.quant, w.avail_gib, w.usage_gib) == (
        41.2,
        "DeepseekV4ForCausalLM",
        "fp8",
        60.5,
        33.1,
    )
    kv = _one(
        "[2026-02-01 08:00:11 TP1] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 500000, KV size: 20.00 GB"
    )
    assert isinstance(kv, KVCache) and kv.dtype == "torch.bfloat16" and kv.tokens == 500000
    swa = _one(
        "[2026-02-01 08:00:11] SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 4096, K size: 0.10 GB, "
        "V size: 0.10 GB"
    )
    assert isinstance(swa, KVCache) and swa.label == "SWA" and swa.rank is None
    va = _one(
        "[2026-02-01 08:00:11] Full KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 800000, KV size: 31.00 GB"
    )
    assert isinstance(va, KVCache) and va.upper_bound and va.label == "Full"


def test_0_5_16_capture_bs_on_begin_and_0_5_23_on_end() -> None:
    b16 = _one(
        "[2026-01-10 12:00:00 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
        "bs=[1, 2, 4, 8], avail mem=20.00 GB"
    )
    assert isinstance(b16, GraphCapture)
    assert (b16.role, b16.graph, b16.stage, b16.bs, b16.backend, b16.avail_gib) == (
        "target",
        "decode",
        "begin",
        (1, 2, 4, 8),
        "full",
        20.0,
    )
    e23 = _one(
        "[2026-04-01 12:00:30 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4, 8, 16], elapsed=12.30 s, "
        "mem usage=2.10 GB, avail mem=17.90 GB."
    )
    assert isinstance(e23, GraphCapture)
    assert (e23.graph, e23.bs, e23.elapsed_s, e23.usage_gib, e23.avail_gib) == (
        "verify",
        (1, 2, 4, 8, 16),
        12.3,
        2.1,
        17.9,
    )
    draft = _one(
        "[2026-04-01 12:00:40] Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=2, "
        "bs=[1, 2], avail mem=15.00 GB"
    )
    assert isinstance(draft, GraphCapture) and draft.is_draft and draft.graph == "extend"
    prefill = _one(
        "[2026-04-01 12:00:10 TP0] Capture target prefill CUDA graph end. elapsed=3.00 s, mem usage=0.50 GB, "
        "avail mem=19.50 GB."
    )
    assert isinstance(prefill, GraphCapture) and prefill.graph == "prefill"


def test_0_5_23_batch_line_without_trailing_comma_and_with_ms_timestamp() -> None:
    d = _one(
        "[2026-04-01 13:00:00.123 TP0] Decode batch, #running-req: 16, #token: 81234, token usage: 0.41, "
        "accept len: 1.93, accept rate: 0.93, cuda graph: True, gen throughput (token/s): 370.12, #queue-req: 5, "
        "est. decode TFLOPS/s (per GPU): 12.30"
    )
    assert isinstance(d, DecodeBatch)
    assert (d.ts, d.rank, d.queue, d.gen_throughput) == ("2026-04-01 13:00:00", 0, 5, 370.12)
    p = _one(
        "[2026-04-01 13:00:00] Prefill batch, #new-seq: 2, #new-token: 8192, #cached-token: 100, token usage: 0.40, "
        "#running-req: 14, #queue-req: 3, #pending-token: 0, cuda graph: False, input throughput (token/s): 9000.00"
    )
    assert isinstance(p, PrefillBatch)
    assert (p.input_throughput, p.cuda_graph, p.rank) == (9000.0, False, None)


def test_dist_init_old_and_new() -> None:
    old = _one("[2025-09-01 10:00:00 TP0] Init torch distributed ends. mem usage=0.61 GB")
    assert isinstance(old, DistInit) and old.stage == "end" and old.usage_gib == 0.61
    new = _one("[2026-04-01 10:00:00] Memory baseline taken. mem usage=0.52 GB")
    assert isinstance(new, DistInit) and new.stage == "baseline"


def test_fp8_kernel_config_tuned_vs_default() -> None:
    tuned = _one(
        "[2026-04-01 12:00:00 TP0] Using configuration from /cfg/N=512,K=7168,device_name=X,dtype=fp8_w8a8,"
        "block_shape=[128, 128].json for W8A8 Block FP8 kernel."
    )
    assert isinstance(tuned, KernelConfig) and tuned.tuned and tuned.path is not None
    assert tuned.path.endswith(".json") and tuned.kernel == "w8a8_block_fp8"
    default = _one(
        "[2026-04-01 12:00:00 TP0] Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "
        "Config file not found at /cfg/N=512,K=7168.json"
    )
    assert isinstance(default, KernelConfig) and not default.tuned


def test_ready_and_uvicorn_lines() -> None:
    ready = _one("[2026-04-01 12:01:00] The server is fired up and ready to roll!")
    assert isinstance(ready, PhaseChange) and ready.ready and ready.phase is Phase.SERVING
    up = _one("[2026-04-01 12:00:59] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)")
    assert isinstance(up, PhaseChange) and up.phase is Phase.WARMUP and not up.ready
    assert parse_line('[2026-04-01 12:01:01] INFO:     127.0.0.1:5555 - "POST /generate HTTP/1.1" 200 OK') is None


# -- server args -----------------------------------------------------------------------------------------------


def test_server_args_old_repr_and_new_dict() -> None:
    old = parse_server_args(
        "ServerArgs(model_path='/m/ds', tp_size=8, mem_fraction_static=0.835, cuda_graph_max_bs=None, "
        "speculative_algorithm='EAGLE', speculative_num_steps=3, speculative_eagle_topk=1, "
        "speculative_num_draft_tokens=4, max_running_requests=48, chunked_prefill_size=8192, context_length=None, "
        "kv_cache_dtype='auto', load_format=<LoadFormat.AUTO: 'auto'>, json_model_override_args='{}')"
    )
    assert old["model_path"] == "/m/ds" and old["tp_size"] == 8 and old["mem_fraction_static"] == 0.835
    assert old["speculative_algorithm"] == "EAGLE" and old["speculative_num_draft_tokens"] == 4
    assert old["cuda_graph_max_bs"] is None and old["kv_cache_dtype"] == "auto"
    new = parse_server_args(
        "{'model_path': 'x/y', 'tp_size': 2, 'cuda_graph_max_bs_decode': 16, 'context_length': 4096}"
    )
    assert new == {"model_path": "x/y", "tp_size": 2, "cuda_graph_max_bs_decode": 16, "context_length": 4096}


def test_server_args_truncated_line_keeps_what_it_has() -> None:
    cut = parse_server_args("ServerArgs(model_path='/m', tp_size=4, mem_fraction_static=0.7, cuda_graph_max")
    assert cut == {"model_path": "/m", "tp_size": 4, "mem_fraction_static": 0.7}
    assert parse_server_args("garbage ((( [") == {}


def test_server_args_event_from_log_line() -> None:
    ev = _one("[2026-04-01 10:00:00] server_args={'model_path': 'm', 'mem_fraction_static': 0.6, 'tp_size': 8}")
    assert isinstance(ev, ServerArgs)
    assert ev.args["mem_fraction_static"] == 0.6 and ev.get("tp_size") == 8


# -- robustness: TP=1, tqdm, ANSI, truncation, interleaving ---------------------------------------------------


def test_tp1_lines_have_no_rank() -> None:
    ev = _one(
        "[2025-06-19 15:12:27] Load weight end. type=LlamaForCausalLM, dtype=torch.float16, avail mem=10.00 GB, mem usage=5.00 GB."  # noqa: E501
    )
    assert isinstance(ev, WeightLoad) and ev.rank is None and ev.dp is None


def test_tqdm_carriage_returns_split_into_updates() -> None:
    raw = (
        "Capturing batches (bs=16 avail_mem=10.50 GB):   0%|          | 0/4 [00:00<?, ?it/s]\r"
        "Capturing batches (bs=8 avail_mem=10.20 GB):  25%|##5       | 1/4 [00:01<00:03,  1.00it/s]\r"
        "Capturing batches (bs=4 avail_mem=10.10 GB):  50%|#####     | 2/4 [00:02<00:02,  1.00it/s]\n"
    )
    events = list(parse_log([raw]))
    bars = [e for e in events if isinstance(e, GraphProgress)]
    assert [(b.bs, b.done, b.total, b.avail_gib) for b in bars] == [(16, 0, 4, 10.5), (8, 1, 4, 10.2), (4, 2, 4, 10.1)]
    assert all(classify_line(x) is LineKind.CUDA_GRAPH for x in raw.split("\r"))


def test_tqdm_in_a_file_with_cr(tmp_path: Path) -> None:
    p = tmp_path / "s.log"
    p.write_bytes(
        b"Capturing batches (bs=2 avail_mem=1.00 GB):  0%| | 0/2\rCapturing batches (bs=1 avail_mem=0.90 GB): 50%| | 1/2\n"  # noqa: E501
    )
    assert [e.done for e in parse_log(p) if isinstance(e, GraphProgress)] == [0, 1]


def test_ansi_colours_are_stripped() -> None:
    ev = _one("\x1b[32m[2026-01-01 00:00:00 TP0] Memory pool end. avail mem=5.00 GB\x1b[0m")
    assert isinstance(ev, MemoryPoolEnd) and ev.avail_gib == 5.0
    assert classify_line("\x1b[31mTraceback (most recent call last):\x1b[0m") is LineKind.FATAL


def test_truncated_lines_do_not_break_parsing() -> None:
    lines = [
        "[2025-07-07 21:42:25 DP4 TP4] Decod",
        "[2025-07-07 21:42:25 TP0] Decode batch, #running-req: 8, #token: 372",
        "[2025-07-07 21:42:25 TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=2",
        "[2025-07-0",
        "[2025-07-07 21:42:26 TP0] KV Cache is allocated. #tokens: 1000, KV si",
    ]
    events = list(parse_log(lines))
    decode = [e for e in events if isinstance(e, DecodeBatch)]
    assert len(decode) == 1 and decode[0].running == 8 and decode[0].tokens == 372 and decode[0].queue is None
    kv = [e for e in events if isinstance(e, KVCache)]
    assert kv and kv[0].tokens == 1000 and kv[0].size_gib is None


def test_interleaved_rank_tracebacks_are_kept_apart_for_vllm() -> None:
    lines = [
        "(Worker_TP0 pid=1) ERROR 05-16 23:42:10 [x.py:1] Traceback (most recent call last):",
        "(Worker_TP1 pid=2) ERROR 05-16 23:42:10 [x.py:1] Traceback (most recent call last):",
        '(Worker_TP0 pid=1) ERROR 05-16 23:42:10 [x.py:1]   File "/v/vllm/worker/gpu_worker.py", line 1, in load_model',
        '(Worker_TP1 pid=2) ERROR 05-16 23:42:10 [x.py:1]   File "/v/vllm/dist/parallel_state.py", line 9, in init',
        "(Worker_TP0 pid=1) ERROR 05-16 23:42:10 [x.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "  # noqa: E501
        "1.00 GiB. GPU 0 has a total capacity of 23.50 GiB of which 512.00 MiB is free.",
        "(Worker_TP1 pid=2) ERROR 05-16 23:42:10 [x.py:1] RuntimeError: NCCL error: remote process exited",
        "(Worker_TP0 pid=1) INFO 05-16 23:42:11 [x.py:1] shutting down",
        "(Worker_TP1 pid=2) INFO 05-16 23:42:11 [x.py:1] shutting down",
    ]
    errors = [e for e in parse_log(lines) if isinstance(e, ErrorEvent)]
    by_rank = {e.rank: e for e in errors}
    assert by_rank[0].kind is ErrorKind.OOM and by_rank[0].oom is not None
    assert by_rank[0].oom.free_gib == pytest.approx(0.5) and by_rank[0].oom.gpu == 0
    assert by_rank[1].kind is ErrorKind.NCCL
    assert all(e.engine is Engine.VLLM for e in errors)


def test_sglang_traceback_block_collects_lines_and_frames() -> None:
    events = list(parse_log(DATA / "sglang_0_5_4_tp2_eagle_capture_oom.log"))
    errs = [e for e in events if isinstance(e, ErrorEvent)]
    oom = next(e for e in errs if e.kind is ErrorKind.OOM)
    assert oom.head == "Scheduler hit an exception" and oom.rank == 1
    assert any("cuda_graph_runner.py" in f for f in oom.frames)
    assert any(line.startswith("Possible solutions") for line in oom.traceback)
    assert oom.oom is not None
    assert (oom.oom.tried_gib, oom.oom.free_gib, oom.oom.total_gib, oom.oom.private_pools_gib) == (
        2.5,
        1.2,
        94.97,
        3.2,
    )
    assert "mem-fraction" not in oom.message, "the hint list is evidence, not the message"
    assert any(isinstance(e, ServerArgs) for e in events)


def test_parser_feed_is_incremental() -> None:
    p = LogParser()
    assert p.feed("[2026-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n") == ()
    assert p.feed('  File "/x/sglang/srt/model_executor/model_runner.py", line 1, in init_memory_pool\n') == ()
    assert (
        p.feed("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.8\n")
        == ()
    )
    out = p.feed("[2026-01-01 00:00:01] Received sigquit from a child process. It usually means the child failed.\n")
    kinds = [e.kind for e in out if isinstance(e, ErrorEvent)]
    assert kinds == [ErrorKind.KV_BUDGET, ErrorKind.TEARDOWN]
    assert p.close() == ()


def test_timestamp_rewind_starts_a_new_run() -> None:
    lines = [
        "[2026-01-02 10:00:00 TP0] Load weight begin. avail mem=80.00 GB",
        "[2026-01-02 09:59:59 TP1] Load weight begin. avail mem=80.00 GB",  # jitter, not a new run
        "[2026-01-01 08:00:00] server_args={'tp_size': 1}",
    ]
    starts = [e for e in parse_log(lines) if isinstance(e, RunStart)]
    assert len(starts) == 1 and starts[0].line_no == 3


# -- vLLM ------------------------------------------------------------------------------------------------------


def test_vllm_startup_lines() -> None:
    w = _one(
        "(EngineCore_DP0 pid=441) INFO 12-31 14:54:54 [gpu_model_runner.py:3341] Model loading took 2.0513 GiB memory and 27.200487 seconds"  # noqa: E501
    )
    assert isinstance(w, WeightLoad) and w.usage_gib == pytest.approx(2.0513) and w.engine is Engine.VLLM and w.dp == 0
    kv = _one(
        "(EngineCore_DP0 pid=441) INFO 12-31 14:55:18 [kv_cache_utils.py:1234] GPU KV cache size: 1,587,648 tokens"
    )
    assert isinstance(kv, KVCache) and kv.tokens == 1587648
    mem = _one("(EngineCore_DP0 pid=441) INFO 12-31 14:55:17 [gpu_worker.py:348] Available KV cache memory: 33.31 GiB")
    assert isinstance(mem, VllmMemoryProfile) and mem.kv_gib == 33.31
    old = _one("INFO 12-19 22:58:41 model_runner.py:1535] Graph capturing finished in 14 secs, took 0.21 GiB")
    assert isinstance(old, GraphCapture) and old.usage_gib == 0.21 and old.stage == "end"
    blocks = _one("INFO 03-21 20:15:46 [executor_base.py:111] # cuda blocks: 7191, # CPU blocks: 512")
    assert isinstance(blocks, KVCache) and blocks.blocks == 7191
    prof = _one(
        "INFO 03-21 20:15:45 [worker.py:267] the current vLLM instance can use total_gpu_memory (79.19GiB) x "
        "gpu_memory_utilization (0.90) = 71.27GiB"
    )
    assert isinstance(prof, VllmMemoryProfile) and prof.utilization == 0.9 and prof.total_gib == 79.19
    stats = _one(
        "(APIServer pid=1) INFO 01-01 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 10.0 tokens/s, "
        "Avg generation throughput: 35.2 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 4.5%"
    )
    assert isinstance(stats, DecodeBatch)
    assert (stats.running, stats.queue, stats.gen_throughput) == (3, 1, 35.2)
    assert stats.token_usage == pytest.approx(0.045)


def test_vllm_worker_prefix_ranks() -> None:
    ev = _one("(Worker_TP2 pid=99) ERROR 05-16 23:42:10 [multiproc_executor.py:949] WorkerProc hit an exception.")
    assert isinstance(ev, ErrorEvent) and ev.rank == 2 and ev.kind is ErrorKind.TEARDOWN


# -- classify_line ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("[2026-01-01 00:00:00] The server is fired up and ready to roll!", LineKind.READY),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has", LineKind.OOM),
        ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB", LineKind.OOM),
        ("Exception: Capture cuda graph failed: CUDA error: no kernel image is available", LineKind.FATAL),
        (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.8",
            LineKind.OOM,
        ),
        ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`", LineKind.OOM),
        ("[2026-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):", LineKind.FATAL),
        (
            "[2026-01-01 00:00:00] Received sigquit from a child process. It usually means the child failed.",
            LineKind.FATAL,
        ),
        (
            "[2026-01-01 00:00:00] SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
            LineKind.FATAL,
        ),
        ("[2026-01-01 00:00:00] kill_process_tree called: parent_pid=5, include_parent=True, pid=5", LineKind.FATAL),
        ("[2026-01-01 00:00:00] kill_process_tree called: parent_pid=5, include_parent=False, pid=5", LineKind.OTHER),
        ("Rank 3 scheduler is dead. Please check if there are relevant logs.", LineKind.FATAL),
        ("RuntimeError: Rank 0 scheduler died during initialization (exit code: -9).", LineKind.FATAL),
        ("RuntimeError: Initialization failed. Please see the error messages above.", LineKind.FATAL),
        ("RuntimeError: NCCL error: unhandled system error", LineKind.FATAL),
        ("[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=80.00 GB", LineKind.WEIGHTS),
        ("[2026-01-01 00:00:00 TP0] KV Cache is allocated. #tokens: 5, KV size: 1.00 GB", LineKind.KV_CACHE),
        (
            "[2026-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.",
            LineKind.CUDA_GRAPH,
        ),
        ("[2026-01-01 00:00:00 TP0] Capture draft cuda graph begin. avail mem=1.00 GB", LineKind.DRAFT_CUDA_GRAPH),
        ("[2026-01-01 00:00:00] INFO:     Uvicorn running on http://0.0.0.0:30000", LineKind.HTTP),
        ("[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 1, #token: 5", LineKind.SERVING),
        ("[2026-01-01 00:00:00 TP0] Init torch distributed begin.", LineKind.DIST_INIT),
        ("(APIServer pid=1) WARNING 01-01 00:00:00 [x.py:1] something odd", LineKind.WARNING),
        ("/x/y.py:12: UserWarning: this is only a warning", LineKind.WARNING),
        ('[2026-01-01 00:00:00] INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK', LineKind.OTHER),
        (
            "INFO 12-19 22:57:03 model_runner.py:1415] If out-of-memory error occurs during cudagraph capture, lower it",  # noqa: E501
            LineKind.OTHER,
        ),
    ],
)
def test_classify_line(line: str, kind: LineKind) -> None:
    assert classify_line(line) is kind


def test_line_kind_phase() -> None:
    assert LineKind.CUDA_GRAPH.phase is Phase.CUDA_GRAPH_CAPTURE and LineKind.CUDA_GRAPH.is_progress
    assert LineKind.FATAL.phase is None and not LineKind.FATAL.is_progress


# -- frames and sources ------------------------------------------------------------------------------------------


def test_frames() -> None:
    log = DATA / "sglang_0_5_4_tp2_eagle_capture_oom.log"
    ev = events_frame(log)
    assert {"type", "line_no", "ts", "rank"} <= set(ev.columns) and len(ev) > 10
    mem = memory_frame(list(parse_log(log)))
    assert set(mem["step"]) >= {"load_begin", "load_end", "kv", "pool_end", "capture_begin"}
    assert mem.loc[(mem["step"] == "load_begin") & (mem["rank"] == 1), "avail_gib"].iloc[0] == 88.0
    dec = decode_frame(
        [
            "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 4, #token: 10, token usage: 0.01, cuda graph: True, "
            "gen throughput (token/s): 100.00, #queue-req: 0",
        ]
    )
    assert list(dec["running"]) == [4] and list(dec["gen_throughput"]) == [100.0]
    assert decode_frame([]).empty


def test_iter_lines_sources(tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    p.write_text("one\ntwo\r\nthree", encoding="utf-8")
    assert list(iter_lines(p)) == ["one", "two", "three"]
    assert list(iter_lines(str(p))) == ["one", "two", "three"]
    assert list(iter_lines(io.BytesIO(b"x\ny\n"))) == ["x", "y"]
    assert list(iter_lines(io.StringIO("x\ny"))) == ["x", "y"]
    assert list(iter_lines([b"a\n", b"b\r\n"])) == ["a", "b"]
