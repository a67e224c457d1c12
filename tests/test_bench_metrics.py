"""Metric formulas on hand-computed request records, and the workload builders."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path

import pytest

from dsv4lab.bench import SLO, BenchError, LoadSpec, RequestRecord, summarize
from dsv4lab.bench.workload import (
    arrival_times,
    concurrency_levels,
    random_workload,
    shared_prefix_workload,
    sharegpt_workload,
)

# Request A: sent at once, 4 one-token chunks at 100, 150, 250, 300 ms; 10 prompt tokens.
A = RequestRecord(
    index=0,
    status="ok",
    scheduled_s=0.0,
    start_s=0.0,
    ttft_s=0.1,
    e2e_s=0.3,
    end_s=0.35,
    chunk_times_s=(0.1, 0.15, 0.25, 0.3),
    prompt_tokens=10,
    output_tokens=4,
    prompt_tokens_from_server=True,
    output_tokens_from_server=True,
)
# Request B: scheduled at 0, waited 900 ms for a slot; 2 chunks at 200 and 400 ms; 20 prompt tokens.
B = RequestRecord(
    index=1,
    status="ok",
    scheduled_s=0.0,
    start_s=0.9,
    ttft_s=0.2,
    e2e_s=0.4,
    end_s=0.45,
    chunk_times_s=(0.2, 0.4),
    prompt_tokens=20,
    output_tokens=2,
    prompt_tokens_from_server=True,
    output_tokens_from_server=True,
)
# Request C: failed after 50 ms, overlapping A.
C = RequestRecord(index=2, status="failed", scheduled_s=0.1, start_s=0.1, end_s=0.05, prompt_tokens=7, error="HTTP 500")
D = RequestRecord(index=3, status="not_sent", scheduled_s=0.2, error="not sent")


def test_throughputs_and_counts() -> None:
    s = summarize([A, B, C, D], 2.0)
    assert (s.total, s.completed, s.failed, s.incomplete, s.not_sent) == (4, 2, 1, 0, 1)
    assert s.total_input_tokens == 30 and s.total_output_tokens == 6  # failed requests' tokens are not counted
    assert s.request_throughput == pytest.approx(1.0)
    assert s.input_throughput == pytest.approx(15.0)
    assert s.output_throughput == pytest.approx(3.0)
    assert s.total_throughput == pytest.approx(18.0)
    assert s.concurrency == pytest.approx((0.3 + 0.4) / 2.0)  # Little's law: sum of E2E / duration
    # Bucket [0, 1): A's 4 tokens; bucket [1, 2): B's 2 tokens (arrive at 1.1 and 1.3 s).
    assert s.peak_output_throughput == pytest.approx(4.0)
    assert s.peak_concurrent == 2  # A [0, 0.35) and C [0.1, 0.15) overlap
    assert s.output_tokens_from_server


def test_latency_distributions() -> None:
    s = summarize([A, B, C, D], 2.0)
    # TTFT [100, 200] ms
    assert s.ttft_ms.count == 2
    assert s.ttft_ms.mean == pytest.approx(150.0)
    assert s.ttft_ms.median == pytest.approx(150.0)
    assert s.ttft_ms.std == pytest.approx(50.0)  # population std, as numpy / SGLang
    assert s.ttft_ms.p99 == pytest.approx(199.0)  # linear interpolation
    # TPOT = (E2E - TTFT) / (out - 1): A (300-100)/3, B (400-200)/1
    assert s.tpot_ms.mean == pytest.approx((200 / 3 + 200) / 2)
    # ITL pools every chunk gap: A 50, 100, 50; B 200
    assert s.itl_ms.count == 4
    assert s.itl_ms.mean == pytest.approx(100.0)
    assert s.itl_ms.median == pytest.approx(75.0)
    assert s.itl_ms.p90 == pytest.approx(170.0)
    assert s.itl_ms.max == pytest.approx(200.0)
    assert s.e2e_ms.mean == pytest.approx(350.0)
    # queue = start - scheduled for every sent request: A 0, B 900, C 0; D was never sent
    assert s.queue_ms.count == 3
    assert s.queue_ms.max == pytest.approx(900.0)


def test_tpot_skips_single_token_requests_and_empty_runs_are_nan() -> None:
    one = RequestRecord(0, "ok", 0.0, 0.0, 0.1, 0.1, 0.1, (0.1,), None, 5, 1)
    s = summarize([one], 1.0)
    assert s.tpot_ms.count == 0 and math.isnan(s.tpot_ms.mean)
    assert s.itl_ms.count == 0
    empty = summarize([], 0.0)
    assert empty.completed == 0 and math.isnan(empty.output_throughput)
    assert empty.to_dict()["ttft_ms"]["mean"] is None  # JSON has no NaN


def test_goodput_requires_every_slo() -> None:
    assert summarize([A, B, C], 2.0, slo=SLO(ttft_ms=150)).goodput == pytest.approx(0.5)
    assert summarize([A, B, C], 2.0, slo=SLO(ttft_ms=250, tpot_ms=100)).good_requests == 1
    assert summarize([A, B, C], 2.0, slo=SLO(e2e_ms=1000)).good_requests == 2
    assert summarize([A, B, C], 2.0).goodput is None


def test_peak_uses_per_chunk_tokens_when_known() -> None:
    r = RequestRecord(0, "ok", 0.0, 0.0, 0.5, 1.5, 1.5, (0.5, 1.5), (5, 3), 1, 8, True, True)
    assert summarize([r], 2.0).peak_output_throughput == pytest.approx(5.0)


def test_fallback_token_count_is_flagged() -> None:
    r = RequestRecord(0, "ok", 0.0, 0.0, 0.1, 0.2, 0.2, (0.1, 0.2), None, 3, 2, False, False)
    assert not summarize([r], 1.0).output_tokens_from_server


def test_summary_round_trips_through_json() -> None:
    s = summarize([A, B, C, D], 2.0, slo=SLO(ttft_ms=150), accept_length=1.7)
    back = type(s).from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s


# -- workloads ---------------------------------------------------------------------------------------------


def test_random_workload_is_seeded_and_sized() -> None:
    a = random_workload(20, 64, 16, seed=3)
    b = random_workload(20, 64, 16, seed=3)
    assert a == b and a != random_workload(20, 64, 16, seed=4)
    assert all(r.prompt_len == 64 and len(r.prompt.split()) == 64 and r.output_len == 16 for r in a.requests)
    assert len({r.prompt for r in a.requests}) == 20
    ranged = random_workload(200, 100, 50, range_ratio=0.5, seed=1)
    assert all(50 <= r.prompt_len <= 100 and 25 <= r.output_len <= 50 for r in ranged.requests)
    ids = random_workload(3, 10, 4, token_ids=True)
    assert all(r.input_ids is not None and len(r.input_ids) == 10 for r in ids.requests)
    assert a.to_dict()["seed"] == 3 and a.to_dict()["num_prompts"] == 20
    with pytest.raises(BenchError):
        random_workload(0, 10, 10)


def test_shared_prefix_workload_shares_prefixes() -> None:
    wl = shared_prefix_workload(3, 4, prefix_len=20, suffix_len=5, output_len=8, seed=1)
    assert len(wl) == 12
    prefixes = {" ".join(r.prompt.split()[:20]) for r in wl.requests}
    assert len(prefixes) == 3
    assert all(r.prompt_len == 25 for r in wl.requests)


def test_sharegpt_workload(tmp_path: Path) -> None:
    data = [
        {"conversations": [{"from": "human", "value": "hello " * 10}, {"from": "gpt", "value": "x" * 400}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
        {"conversations": [{"from": "human", "value": "y" * 100_000}, {"from": "gpt", "value": "z"}]},
        {"conversations": [{"from": "human", "value": "short"}, {"from": "gpt", "value": "ok"}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    wl = sharegpt_workload(path, 10, seed=0)
    assert len(wl) == 2  # one-turn and over-long conversations are skipped
    assert sorted(r.output_len for r in wl.requests) == [1, 100]
    assert all(r.output_len == 7 for r in sharegpt_workload(path, 10, output_len=7).requests)
    with pytest.raises(BenchError):
        sharegpt_workload(tmp_path / "missing.json", 1)


def test_arrivals_and_levels() -> None:
    assert arrival_times(3, LoadSpec()) == [0.0, 0.0, 0.0]
    times = arrival_times(2000, LoadSpec(request_rate=10.0, seed=1))
    assert times == sorted(times) and times[0] == 0.0
    assert times[-1] / 1999 == pytest.approx(0.1, rel=0.1)  # mean gap 1/rate
    bursty = arrival_times(2000, LoadSpec(request_rate=10.0, burstiness=0.25, seed=1))

    def cv(ts: list[float]) -> float:
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    assert cv(times) == pytest.approx(1.0, abs=0.1)  # Poisson: exponential gaps, CV 1
    assert cv(bursty) == pytest.approx(2.0, abs=0.3)  # gamma shape k: CV 1/sqrt(k)
    assert concurrency_levels("1, 2,4,2") == [1, 2, 4]
    for bad in ("0", "a", ""):
        with pytest.raises(BenchError):
            concurrency_levels(bad)
    with pytest.raises(BenchError):
        LoadSpec(concurrency=0)
