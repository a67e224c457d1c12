"""The twin's fault logs, captured now: what tools/twin_fault_logs.py committed is what the twin does today.

Each scenario runs the twin as real processes (tiny TP2 model, 127.0.0.1) into ``tmp_path`` and checks the
fresh log against the committed label and the diagnosis contract of tests/test_logs_corpus.py: right
outcome where the decisive line is there, right phase, right GPU, never confidently wrong.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dsv4lab.logs import diagnose

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "tests" / "data" / "logs" / "twin_faults"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("twin_fault_logs", ROOT / "tools" / "twin_fault_logs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["twin_fault_logs"] = module
    spec.loader.exec_module(module)
    return module


TOOL = _tool()
NAMES = [sc.name for sc in TOOL.SCENARIOS]
STABLE = ("engine", "kind", "outcome", "phase", "runner", "gpu", "decisive_line_present", "split", "cause")


def test_every_scenario_is_committed() -> None:
    committed = sorted(p.stem.removeprefix("twin-") for p in COMMITTED.glob("twin-*.json"))
    assert committed == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_fresh_twin_log_matches_its_label_and_the_diagnosis(tmp_path: Path, name: str) -> None:
    sc = next(s for s in TOOL.SCENARIOS if s.name == name)
    text, status = TOOL.run(sc, tmp_path)
    fresh = TOOL.label(sc, text, status)
    kept = json.loads((COMMITTED / f"twin-{name}.json").read_text(encoding="utf-8"))
    assert {k: fresh[k] for k in STABLE} == {k: kept[k] for k in STABLE}
    if sc.end == "exit":
        assert status is not None and status != 0
    d = diagnose(text.splitlines())
    wrong = (fresh["outcome"] is not None and d.outcome.value != fresh["outcome"]) or (
        fresh["phase"] is not None and (d.phase.value if d.phase else None) != fresh["phase"]
    )
    assert not (wrong and d.confidence >= 0.5), d.cause
    if fresh["decisive_line_present"] and fresh["outcome"] is not None:
        assert d.outcome.value == fresh["outcome"], d.cause
    assert (d.phase.value if d.phase else None) == fresh["phase"], d.cause
    if fresh["gpu"] is not None:
        assert d.gpu == fresh["gpu"], d.cause
