"""The JSONL result store: append-only, never overwrites, concurrent appends never interleave."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from pathlib import Path

import pytest

from dsv4lab.bench import BenchError, BenchResult, RequestRecord, ResultStore, summarize
from dsv4lab.bench.results import Provenance, records_frame


def make_result(n_requests: int = 3, label: str = "") -> BenchResult:
    recs = [
        RequestRecord(i, "ok", 0.0, 0.0, 0.1, 0.3, 0.3, (0.1, 0.2, 0.3), None, 10, 3, True, True)
        for i in range(n_requests)
    ]
    recs.append(RequestRecord(n_requests, "failed", 0.0, 0.0, end_s=0.01, error="HTTP 500: 'quoted'\nnewline"))
    prov = Provenance(
        url="http://127.0.0.1:30000",
        backend="dsv4lab",
        api="completions",
        engine="sglang",
        engine_version="0.5.23",
        host="gpu-box",
        gpu_names=("NVIDIA RTX PRO 6000 Blackwell Server Edition",) * 2,
        workload={"name": "random", "seed": 7},
        config={"mem_fraction_static": 0.6},
    )
    return BenchResult(summarize(recs, 1.0), records_frame(recs), prov, 16, label=label, diagnosis={"cause": "x"})


def test_round_trip_keeps_summary_requests_and_provenance(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    r = make_result()
    store.append(r)
    (back,) = store.load(strict=True)
    assert back.id == r.id and back.summary == r.summary and back.concurrency == 16
    assert back.provenance == r.provenance and back.provenance.workload_seed == 7
    assert back.requests["status"].tolist() == r.requests["status"].tolist()
    assert back.requests["itl_ms"].tolist() == r.requests["itl_ms"].tolist()
    assert back.diagnosis == {"cause": "x"}
    assert store.path == tmp_path / "bench_results.jsonl"
    html = back._repr_html_()
    assert "TTFT" in html and "sglang" in html


def test_results_are_never_overwritten(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "x.jsonl")
    r = make_result()
    store.append(r)
    with pytest.raises(BenchError, match="never overwritten"):
        store.append(r)
    store.append(dataclasses.replace(r, id="other"))
    assert [x.id for x in store.load()] == [r.id, "other"]


def _append_many(path: str, worker: int, count: int) -> None:
    store = ResultStore(path)
    for i in range(count):
        store.append(make_result(n_requests=1000, label=f"w{worker}-{i}"))  # ~100 KB lines: far beyond PIPE_BUF


def test_concurrent_appends_from_processes_do_not_interleave(tmp_path: Path) -> None:
    path = str(tmp_path / "bench_results.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, w, 8)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    lines = Path(path).read_bytes().splitlines()
    assert len(lines) == 32
    labels = sorted(json.loads(line)["label"] for line in lines)  # every line is one whole JSON object
    assert labels == sorted(f"w{w}-{i}" for w in range(4) for i in range(8))
    assert len(lines[0]) > 65536


def test_torn_line_is_reported_not_silently_dropped(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.append(make_result())
    with store.path.open("ab") as f:
        f.write(b'{"id": "torn", "summ')
    with pytest.warns(UserWarning, match="torn"):
        assert len(store.load()) == 1
    with pytest.raises(BenchError, match="torn"):
        store.load(strict=True)
