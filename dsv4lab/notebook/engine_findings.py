"""What the real-engine campaign's notebooks record and say: the figures of a memory failure predicted and
then seen on a real server, and of the fix chosen for it.

The notebooks (``11_engine_baseline`` ... ``13_engine_fix_and_lever``) stay a few lines per cell; the
figures they hand to the next step and to the campaign's index are built here, under stable names, so a
test can read them and the index can quote them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsv4lab.bench.stats import ABComparison
from dsv4lab.counts import plural
from dsv4lab.logs import Diagnosis
from dsv4lab.model.vllm_fixes import VllmFix
from dsv4lab.notebook.experiment import overrides_text
from dsv4lab.notebook.findings import ab_figure
from dsv4lab.notebook.server import Server

__all__ = ["failure_figures", "fix_figures", "lever_figures", "lever_words", "prediction_words"]


def prediction_words(prediction: Any) -> str:
    """``fits`` or ``fails in kv_cache_alloc, short by 0.15 GiB``: a preflight's verdict in a few words."""
    if prediction.fits:
        return "fits"
    short = f", short by {prediction.short_by_gib:.2f} GiB" if prediction.short_by_gib else ""
    return f"fails in {prediction.fail_phase}{short}"


def failure_figures(server: Server, prediction: Any, diagnosis: Diagnosis) -> dict[str, Any]:
    """A launch predicted to fail, watched to its verdict and diagnosed from its own log: what the watcher
    saw and when (wall clock), what the model predicted, and what the log says went wrong."""
    r = server.readiness
    assert r is not None, "wait() for the verdict before recording it"
    return {
        "verdict": r.verdict.value,
        "detected_after_s": r.detected_after_s,
        "exit_status": r.exit_status,
        "elapsed_s": r.startup_s,
        "server_dir": str(server.local_dir),
        "predicted": prediction_words(prediction),
        "predicted_fail_phase": prediction.fail_phase,
        "predicted_short_by_gib": prediction.short_by_gib,
        "outcome": diagnosis.outcome.value,
        "phase": diagnosis.phase.value if diagnosis.phase else None,
        "cause": diagnosis.cause,
        "as_predicted": (not prediction.fits)
        and diagnosis.phase is not None
        and diagnosis.phase.value == prediction.fail_phase,
    }


def fix_figures(choice: VllmFix) -> dict[str, Any]:
    """The chosen fix under the names the next step reads (``chosen_fix_overrides``, as 03's SGLang fix)."""
    return {
        "chosen_fix": choice.flags,
        "chosen_fix_overrides": overrides_text(dict(choice.changes)),
        "chosen_fix_effect": choice.effect,
        "chosen_fix_headroom_gib": choice.headroom_gib,
        "chosen_fix_keeps_max_model_len": choice.keeps_max_model_len,
    }


def lever_figures(
    relaunched: Server, prediction: Any, comparison: ABComparison, fix: Mapping[str, str], lever: str
) -> dict[str, Any]:
    """A fix relaunched as arm A of an A/B of one lever: how the relaunch came up (its verdict, not its state
    after the A/B stopped it), what the model predicted, and the lever's gain per level."""
    r = relaunched.readiness
    return {
        **{f"lever_gain_c{lv.concurrency}": ab_figure(comparison, lv.concurrency) for lv in comparison.levels},
        "fixed_verdict": r.verdict.value if r is not None else relaunched.state,
        "fixed_startup_s": r.startup_s if r is not None else None,
        "fixed_predicted": prediction_words(prediction),
        "fix": ", ".join(f"{k}={v}" for k, v in fix.items()),
        "lever": lever,
    }


def lever_words(figures: Mapping[str, Any]) -> str:
    """:func:`lever_figures` as the notebook's Markdown: the relaunch, then one line per level."""
    gains = [g for k, g in figures.items() if k.startswith("lever_gain_c")]
    per_arm = [plural(g["repeats"][0], "repeat per arm", "repeats per arm") for g in gains]
    lines = "\n".join(
        f"- concurrency **{g['concurrency']}**: {g['mean_a']:,.1f} → {g['mean_b']:,.1f} output tok/s, "
        f"**{g['rel']:+.1%}** (95% CI {g['ci'][0]:+.1%} to {g['ci'][1]:+.1%}, {n}) "
        f"→ **{g['verdict']}**"
        for g, n in zip(gains, per_arm, strict=True)
    )
    return (
        f"With the fix the model predicted **{figures['fixed_predicted']}**, and the relaunch came up "
        f"**{figures['fixed_verdict']}**. `{figures['lever']}` against it (wall clock):\n\n{lines}"
    )
