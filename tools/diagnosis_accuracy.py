"""How well ``dsv4lab diagnose`` reads logs it was not written against: accuracy, confident errors, calibration.

The corpus is ``tests/data/logs/corpus/``: real excerpts from public GitHub threads, each with a label file
written from what the thread says. ``split`` says how a case was used: ``dev`` cases were read while the
rules were written; ``heldout``, ``heldout2`` and ``heldout3`` cases were collected and labelled only after
the rules were frozen (three rounds; commits named in docs/diagnosis.md), so their figures at those commits are
the honest generalisation estimate. Two more labelled sets are scored the same way: ``live``, whole logs of
a real vLLM 0.32 on CPU (``tests/data/logs/vllm_live/``: a clean start and five failures), and ``twin``, the
twin run once per fault it supports (``tests/data/logs/twin_faults/``, made by ``tools/twin_fault_logs.py``).
The ten shared cases (``../shared/logs``) are scored as their own group.

Scoring, per case, only for what the label states (``null`` = the thread does not say):

- outcome: right when it equals the label. On an excerpt cut before its decisive line, a low-confidence
  answer (< 0.5) also counts as acceptable: a file that stops early cannot say more.
- phase: right when equal to the label. GPU: the same, where the excerpt holds the line that names it.
- confident-wrong: confidence >= 0.5 and the outcome or the phase is wrong. The target is zero.
- calibration: per confidence bin, how many answers were fully right (outcome and phase where labelled).

    .venv/bin/python tools/diagnosis_accuracy.py             # the table (docs/diagnosis.md)
    .venv/bin/python tools/diagnosis_accuracy.py --cases     # plus one line per case
    .venv/bin/python tools/diagnosis_accuracy.py --rules-at <git-rev>   # score the rules of a commit
    .venv/bin/python tools/diagnosis_accuracy.py --before <git-rev>     # frozen rules before, then the tree's
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "logs" / "corpus"
LIVE = ROOT / "tests" / "data" / "logs" / "vllm_live"
TWIN = ROOT / "tests" / "data" / "logs" / "twin_faults"
SHARED = ROOT.parent / "shared" / "logs"
#: Scored groups in table order; the held-out rounds were labelled before the rules that score them.
GROUPS = ("dev", "heldout", "heldout2", "heldout3", "live", "twin", "shared")
HELDOUT = ("heldout", "heldout2", "heldout3")
CONFIDENT = 0.5
BINS = ((0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01))


@dataclass(frozen=True)
class Case:
    """One labelled log. ``decisive`` is None for the shared cases, whose labels do not say."""

    name: str
    log: Path
    group: str
    outcome: str | None
    phase: str | None
    gpu: int | None
    decisive: bool | None
    source: str


@dataclass(frozen=True)
class Answer:
    """The parts of a diagnosis that are scored."""

    outcome: str
    phase: str | None
    gpu: int | None
    confidence: float
    cause: str


@dataclass(frozen=True)
class Score:
    """One case's marks; ``None`` where the label does not say."""

    case: Case
    answer: Answer
    outcome_right: bool | None
    outcome_ok: bool | None  # right, or honest (low confidence) on an excerpt cut before its decisive line
    phase_right: bool | None
    gpu_right: bool | None

    @property
    def confident_wrong(self) -> bool:
        wrong = self.outcome_right is False or self.phase_right is False
        return wrong and self.answer.confidence >= CONFIDENT

    @property
    def fully_right(self) -> bool:
        return self.outcome_right is not False and self.phase_right is not False


def load_cases(corpus: Path = CORPUS, shared: Path | None = SHARED, extra: Sequence[Path] = (LIVE, TWIN)) -> list[Case]:
    """Every labelled log of the corpus and of the ``extra`` sets (and of the shared set, when present)."""
    cases: list[Case] = []
    labels = [p for folder in (corpus, *extra) if folder.is_dir() for p in sorted(folder.glob("*.json"))]
    for label in labels:
        data: dict[str, Any] = json.loads(label.read_text(encoding="utf-8"))
        cases.append(
            Case(
                name=label.stem,
                log=label.with_suffix(".log"),
                group=str(data["split"]),
                outcome=data.get("outcome"),
                phase=data.get("phase"),
                gpu=data.get("gpu"),
                decisive=bool(data.get("decisive_line_present")),
                source=str(data.get("source", "")),
            )
        )
    if shared is not None and shared.is_dir():
        for label in sorted(shared.glob("case_*.json")):
            data = json.loads(label.read_text(encoding="utf-8"))
            cases.append(
                Case(
                    name=label.stem,
                    log=label.with_suffix(".log"),
                    group="shared",
                    outcome=data.get("outcome"),
                    phase=data.get("phase"),
                    gpu=data.get("oom_gpu"),
                    decisive=None,
                    source=str(data.get("source", "")),
                )
            )
    return cases


def diagnose_cases(cases: Iterable[Case]) -> dict[str, Answer]:
    """Run the installed (or ``PYTHONPATH``-selected) ``dsv4lab.logs.diagnose`` on every case."""
    from dsv4lab.logs import diagnose

    out: dict[str, Answer] = {}
    for case in cases:
        d = diagnose(case.log).to_dict()
        out[case.name] = Answer(d["outcome"], d["phase"], d["gpu"], float(d["confidence"]), d["cause"])
    return out


def diagnose_at(rev: str, cases: Sequence[Case]) -> dict[str, Answer]:
    """Diagnose with the ``dsv4lab`` package as it was at git revision ``rev`` (frozen rules)."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "rules.tar"
        with archive.open("wb") as fh:
            subprocess.run(["git", "-C", str(ROOT), "archive", rev, "dsv4lab"], check=True, stdout=fh)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        env = {**os.environ, "PYTHONPATH": tmp}
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--emit-json"],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
        )
    raw: dict[str, list[Any]] = json.loads(done.stdout)
    return {k: Answer(v[0], v[1], v[2], float(v[3]), v[4]) for k, v in raw.items() if k in {c.name for c in cases}}


def score(case: Case, answer: Answer) -> Score:
    outcome_right = None if case.outcome is None else answer.outcome == case.outcome
    outcome_ok = outcome_right
    if outcome_right is False and case.decisive is False and answer.confidence < CONFIDENT:
        outcome_ok = True
    phase_right = None if case.phase is None else answer.phase == case.phase
    gpu_right = None if case.gpu is None or case.decisive is False else answer.gpu == case.gpu
    return Score(case, answer, outcome_right, outcome_ok, phase_right, gpu_right)


def _frac(flags: Iterable[bool | None]) -> str:
    vals = [f for f in flags if f is not None]
    if not vals:
        return "—"
    return f"{sum(vals)}/{len(vals)} ({100 * sum(vals) / len(vals):.0f}%)"


def table(scores: Sequence[Score], groups: Sequence[str]) -> str:
    """The accuracy table, one row per group, the held-out rounds together, plus ``all``."""
    head = (
        f"| {'cases':<9} | {'n':>3} | {'outcome (decisive line present)':<31} | {'outcome incl. honest cut-offs':<29} "
        f"| {'phase':<13} | {'GPU':<12} | {'confident wrong':<15} |"
    )
    rows = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    held = [g for g in groups if g in HELDOUT]
    for group in (*groups, *(["held-out"] if len(held) > 1 else []), "all"):
        members = held if group == "held-out" else [group]
        sel = [s for s in scores if group == "all" or s.case.group in members]
        if not sel:
            continue
        decisive = [s.outcome_right for s in sel if s.case.decisive is not False]
        rows.append(
            f"| {group:<9} | {len(sel):>3} | {_frac(decisive):<31} | {_frac(s.outcome_ok for s in sel):<29} "
            f"| {_frac(s.phase_right for s in sel):<13} | {_frac(s.gpu_right for s in sel):<12} "
            f"| {sum(s.confident_wrong for s in sel):<15} |"
        )
    return "\n".join(rows)


def calibration(scores: Sequence[Score]) -> str:
    """Per confidence bin: answers, mean confidence, share fully right; plus the Brier score."""
    rows = ["| confidence | answers | mean confidence | fully right |", "|---|---|---|---|"]
    for lo, hi in BINS:
        sel = [s for s in scores if lo <= s.answer.confidence < hi]
        if not sel:
            rows.append(f"| {lo:.1f}–{min(hi, 1.0):.1f} | 0 | — | — |")
            continue
        mean = sum(s.answer.confidence for s in sel) / len(sel)
        right = sum(s.fully_right for s in sel)
        rows.append(f"| {lo:.1f}–{min(hi, 1.0):.1f} | {len(sel)} | {mean:.2f} | {right}/{len(sel)} |")
    brier = sum((s.answer.confidence - float(s.fully_right)) ** 2 for s in scores) / max(1, len(scores))
    rows.append(f"\nBrier score (confidence vs fully right): {brier:.3f} over {len(scores)} answers")
    return "\n".join(rows)


def case_lines(scores: Sequence[Score]) -> str:
    def mark(flag: bool | None) -> str:
        return "·" if flag is None else ("✓" if flag else "✗")

    out = []
    for s in sorted(scores, key=lambda s: (s.case.group, s.case.name)):
        a = s.answer
        flag = "  CONFIDENT-WRONG" if s.confident_wrong else ""
        out.append(
            f"{s.case.group:<8} {s.case.name:<24} outcome {mark(s.outcome_right)} {a.outcome:<8} "
            f"(label {s.case.outcome}) phase {mark(s.phase_right)} {a.phase} (label {s.case.phase}) "
            f"conf {a.confidence:.2f}{flag}"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--cases", action="store_true", help="also print one line per case")
    ap.add_argument("--rules-at", metavar="REV", help="score the dsv4lab.logs rules of this git revision")
    ap.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--before", metavar="REV", help="first the table with the rules of this revision, then with --rules-at's"
    )
    ns = ap.parse_args(argv)
    cases = load_cases()
    if ns.emit_json:
        answers = diagnose_cases(cases)
        print(json.dumps({k: [a.outcome, a.phase, a.gpu, a.confidence, a.cause] for k, a in answers.items()}))
        return 0
    groups = [g for g in GROUPS if any(c.group == g for c in cases)]
    threads = len({c.source for c in cases if c.group not in ("live", "twin")})
    kept = len([c for c in cases if c.group not in ("live", "twin")])
    print(
        f"Diagnosis accuracy on {kept} real excerpts from {threads} threads, {sum(c.group == 'live' for c in cases)} "
        f"live vLLM logs and {sum(c.group == 'twin' for c in cases)} twin logs\n"
    )
    if ns.before:
        before = diagnose_at(ns.before, cases)
        print(f"Before: rules at {ns.before}\n")
        print(table([score(c, before[c.name]) for c in cases if c.name in before], groups))
        print()
    answers = diagnose_at(ns.rules_at, cases) if ns.rules_at else diagnose_cases(cases)
    scores = [score(c, answers[c.name]) for c in cases if c.name in answers]
    rules = f"rules at {ns.rules_at}" if ns.rules_at else "rules in the working tree"
    print(f"{'After: ' if ns.before else ''}{rules}\n")
    print(table(scores, groups))
    print()
    print(calibration(scores))
    if ns.cases:
        print()
        print(case_lines(scores))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
