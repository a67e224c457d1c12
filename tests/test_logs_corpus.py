"""The labelled logs: never confidently wrong, right wherever the log can say.

Three sets, one contract: the corpus (tests/data/logs/corpus), excerpts from public SGLang / vLLM threads
with a label file written from what the thread says; the live logs of a real vLLM 0.32 on CPU
(tests/data/logs/vllm_live); and the twin run once per fault it supports (tests/data/logs/twin_faults, made
by tools/twin_fault_logs.py). The scoring lives in tools/diagnosis_accuracy.py (docs/diagnosis.md's accuracy
table); these tests hold the contract per case, so a rule change that makes one answer confidently wrong
fails here by name, and the frozen held-out rounds keep their targets.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dsv4lab.logs import Outcome, Phase, classify_line, diagnose, parse_log

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "logs" / "corpus"
LIVE = ROOT / "tests" / "data" / "logs" / "vllm_live"
TWIN = ROOT / "tests" / "data" / "logs" / "twin_faults"
#: Per set: its splits, how its ``source`` starts, and how large its logs may be (excerpts vs whole logs).
SETS: dict[Path, tuple[set[str], str, int]] = {
    CORPUS: ({"dev", "heldout", "heldout2", "heldout3"}, "https://github.com/", 8192),
    LIVE: ({"live"}, "captured locally with tools/vllm_cpu_venv.sh", 64 * 1024),
    TWIN: ({"twin"}, "tools/twin_fault_logs.py: ", 64 * 1024),
}
LABELS = [p for folder in SETS for p in sorted(folder.glob("*.json"))]
HELDOUT = ("heldout", "heldout2", "heldout3")
OUTCOMES = {"ready", "oom", "crash", None}
PHASES = {p.value for p in Phase} | {None}
KEYS = {
    "source",
    "engine",
    "engine_version",
    "kind",
    "outcome",
    "phase",
    "runner",
    "gpu",
    "tried_gib",
    "free_gib",
    "total_gib",
    "decisive_line",
    "decisive_line_present",
    "cause",
    "split",
    "notes",
}


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diagnosis_accuracy", ROOT / "tools" / "diagnosis_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["diagnosis_accuracy"] = module
    spec.loader.exec_module(module)
    return module


TOOL = _tool()


def _label(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_corpus_size_and_coverage() -> None:
    labels = [_label(p) for p in sorted(CORPUS.glob("*.json"))]
    assert len(labels) >= 60
    assert {lab["engine"] for lab in labels} == {"sglang", "vllm"}
    assert {lab["split"] for lab in labels} == SETS[CORPUS][0]
    phases = {lab["phase"] for lab in labels}
    assert phases >= {p.value for p in Phase}, "every phase has at least one real case"
    assert sum(not lab["decisive_line_present"] for lab in labels) >= 15, "cut-off excerpts of each kind"
    live = [_label(p) for p in sorted(LIVE.glob("*.json"))]
    assert len(live) >= 6 and {lab["engine"] for lab in live} == {"vllm"}
    twin = [_label(p) for p in sorted(TWIN.glob("*.json"))]
    assert len(twin) >= 10 and {lab["engine"] for lab in twin} == {"sglang"}
    from dsv4lab.twin.faults import FAULTS

    faults = {m.group(1) for lab in twin if (m := re.search(r"DSV4LAB_TWIN_FAULT=(\w+)", lab["source"]))}
    assert faults == set(FAULTS), "every fault the twin supports has a log"


@pytest.mark.parametrize("label", LABELS, ids=[p.stem for p in LABELS])
def test_label_file_is_well_formed(label: Path) -> None:
    data = _label(label)
    splits, source, max_bytes = SETS[label.parent]
    assert set(data) == KEYS
    assert data["source"].startswith(source)
    assert data["outcome"] in OUTCOMES and data["phase"] in PHASES
    assert data["split"] in splits
    assert isinstance(data["decisive_line_present"], bool)
    assert (data["decisive_line"] is not None) == data["decisive_line_present"]
    assert data["gpu"] is None or isinstance(data["gpu"], int)
    assert data["cause"].strip()
    log = label.with_suffix(".log")
    assert log.is_file() and 0 < log.stat().st_size < max_bytes, "short logs: the lines that matter"


@pytest.mark.parametrize("label", LABELS, ids=[p.stem for p in LABELS])
def test_never_confidently_wrong(label: Path) -> None:
    data = _label(label)
    log = label.with_suffix(".log")
    d = diagnose(log)
    got = d.to_dict()
    wrong_outcome = data["outcome"] is not None and got["outcome"] != data["outcome"]
    wrong_phase = data["phase"] is not None and got["phase"] != data["phase"]
    if wrong_outcome or wrong_phase:
        assert d.confidence < 0.5, f"confidently wrong: {got['outcome']}/{got['phase']} at {d.confidence}: {d.cause}"
    if data["decisive_line_present"] and data["outcome"] is not None:
        assert got["outcome"] == data["outcome"], d.cause
    if not data["decisive_line_present"] and d.outcome in (Outcome.OOM, Outcome.CRASH) and d.confidence < 0.5:
        assert "not in the log" in d.cause or "guess" in d.cause, "a guess says it is one"
    if data["gpu"] is not None and data["decisive_line_present"]:
        assert got["gpu"] == data["gpu"]
    assert got["cause"].endswith(".") and 0.0 <= got["confidence"] <= 1.0
    json.dumps(got)
    for line in log.read_text(encoding="utf-8").splitlines():
        classify_line(line)
    list(parse_log(log))


def test_accuracy_targets() -> None:
    cases = TOOL.load_cases(CORPUS, None, (LIVE, TWIN))
    assert {c.group for c in cases} == {s for splits, _, _ in SETS.values() for s in splits}
    answers = TOOL.diagnose_cases(cases)
    scores = [TOOL.score(c, answers[c.name]) for c in cases]
    phase = [s.phase_right for s in scores if s.phase_right is not None]
    assert sum(phase) >= 0.9 * len(phase), TOOL.case_lines(scores)
    assert not [s.case.name for s in scores if s.confident_wrong]
    assert all(s.outcome_right for s in scores if s.case.decisive and s.outcome_right is not None)
    # The frozen held-out rounds, each on its own: phase >= 90 %, the failing GPU wherever the log names it.
    for split in HELDOUT:
        sel = [s for s in scores if s.case.group == split]
        phase = [s.phase_right for s in sel if s.phase_right is not None]
        assert phase and sum(phase) >= 0.9 * len(phase), (split, TOOL.case_lines(sel))
        gpu = [s.gpu_right for s in sel if s.gpu_right is not None]
        assert all(gpu), (split, TOOL.case_lines(sel))
    table = TOOL.table(scores, list(TOOL.GROUPS))
    assert "confident wrong" in table and "| all" in table and "| held-out" in table and "| twin" in table
    assert "Brier score" in TOOL.calibration(scores)
