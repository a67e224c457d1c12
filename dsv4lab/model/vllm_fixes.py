"""The changes that make a vLLM launch fit, each checked by the same memory model before anyone relaunches.

A failed prediction (:func:`~dsv4lab.model.vllm_memory.vllm_preflight`) names one fix in words; a campaign
has to choose between the real options and hand the chosen one to the next launch as config changes. The
options are what vLLM itself offers: a ``max_model_len`` its estimate says fits, or a KV space that serves the
asked length (on the CPU build ``VLLM_CPU_KVCACHE_SPACE``, whole GiB), or a KV space the host can hold. Each
candidate is predicted again; the one chosen keeps what the user asked for (the context length) when one
that keeps it fits, and leaves the most memory free otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsv4lab import htmlview as hv
from dsv4lab.errors import ConfigError
from dsv4lab.model.vllm_memory import GIB, VllmPreflight, vllm_preflight

__all__ = ["VllmFix", "VllmFixes", "choose_vllm_fix", "vllm_fix_candidates"]


@dataclass(frozen=True)
class VllmFix:
    """One change to a config vLLM would refuse, and the memory model's verdict on the changed config."""

    #: The config changes, field -> value as ``overrides`` text reads them (``env.VLLM_CPU_KVCACHE_SPACE``).
    changes: Mapping[str, str]
    #: What the change gives up or keeps, in a reader's words.
    effect: str
    #: The prediction for the changed config.
    prediction: VllmPreflight

    @property
    def fits(self) -> bool:
        return self.prediction.fits

    @property
    def keeps_max_model_len(self) -> bool:
        return "max_model_len" not in self.changes

    @property
    def flags(self) -> str:
        """``max_model_len=524160``: the changes as the ``overrides`` parameter's words."""
        return " ".join(f"{k}={v}" for k, v in self.changes.items())

    @property
    def headroom_gib(self) -> float:
        """Memory the changed config is predicted to leave on its tightest device (negative: short)."""
        d = min(self.prediction.split, key=lambda s: s.free_gib)
        used = d.non_torch_gib + d.weights_gib + d.kv_cache_gib + d.activation_gib + d.cuda_graph_gib
        return round(d.free_gib - used, 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": dict(self.changes),
            "flags": self.flags,
            "effect": self.effect,
            "fits": self.fits,
            "headroom_gib": self.headroom_gib,
            "keeps_max_model_len": self.keeps_max_model_len,
        }


@dataclass(frozen=True)
class VllmFixes(Sequence[VllmFix]):
    """The candidates for one failed prediction, best first; shows itself as a table."""

    candidates: tuple[VllmFix, ...]

    def __getitem__(self, i: int) -> VllmFix:  # type: ignore[override]
        return self.candidates[i]

    def __len__(self) -> int:
        return len(self.candidates)

    def _repr_html_(self) -> str:
        rows = [
            {
                "change": c.flags,
                "effect": c.effect,
                "predicted": "fits" if c.fits else f"fails in {c.prediction.fail_phase}",
                "left free (GiB)": f"{c.headroom_gib:.2f}",
            }
            for c in self.candidates
        ]
        note = "each change predicted again by vLLM's memory model; best first: fits, keeps max_model_len, most free"
        return hv.card("fixes, each checked by the memory model", hv.table(rows) + hv.p(note))


def vllm_fix_candidates(prediction: VllmPreflight) -> VllmFixes:
    """Every change vLLM's arithmetic offers for a prediction that does not fit, each predicted again, best
    first (:func:`choose_vllm_fix` takes the first that fits). A prediction that fits has none."""
    if prediction.fits:
        return VllmFixes(())
    found: list[VllmFix] = []
    for changes, effect in _options(prediction):
        try:
            changed = prediction.config.with_values(changes)
        except ConfigError:
            continue
        again = vllm_preflight(
            changed,
            prediction.host_memory,
            hardware=None if prediction.backend == "cpu" else prediction.where,
            model=prediction.model,
            vllm_version=prediction.vllm_version,
            model_from_path=False,
        )
        found.append(VllmFix(changes, effect, again))
    found.sort(key=lambda f: (not f.fits, not f.keeps_max_model_len, -f.headroom_gib))
    return VllmFixes(tuple(found))


def choose_vllm_fix(candidates: Sequence[VllmFix]) -> VllmFix:
    """The best candidate that fits: one that keeps the asked context when there is one, else the one that
    leaves the most memory free. None fitting is an error that says so (a bigger host is the fix then)."""
    for candidate in candidates:
        if candidate.fits:
            return candidate
    tried = "; ".join(c.flags for c in candidates) or "none"
    raise ConfigError(
        "fix",
        tried,
        "a change the memory model predicts to fit; none of vLLM's options does on this host (more memory, or a "
        "smaller model)",
    )


def _options(p: VllmPreflight) -> list[tuple[dict[str, str], str]]:
    """The candidate changes for ``p``'s failure: vLLM's estimate of the longest context, the KV space that
    serves the asked one, or (a KV space above the host) the whole GiB that fit."""
    out: list[tuple[dict[str, str], str]] = []
    kv = p.kv
    space_field = "env.VLLM_CPU_KVCACHE_SPACE" if p.backend == "cpu" else "kv_cache_memory_bytes"
    if p.kv_source == "kv_cache_memory_bytes":
        space_field = "kv_cache_memory_bytes"
    if kv is not None and not kv.fits:
        if kv.estimated_max_model_len > 0:
            est = kv.estimated_max_model_len
            out.append(({"max_model_len": str(est)}, f"context cut from {kv.max_model_len:,} to {est:,} tokens"))
        need = kv.bytes_for_max_model_len
        value = str(math.ceil(need / GIB)) if space_field.startswith("env.") else str(need)
        shown = f"{value} GiB" if space_field.startswith("env.") else f"{need / GIB:.2f} GiB"
        out.append(({space_field: value}, f"KV space {shown}: keeps max_model_len {kv.max_model_len:,}"))
    elif p.fail_phase in ("kv_cache_alloc", "startup_other") and p.backend == "cpu":
        d = p.split[0]
        fit = math.floor(d.free_gib - d.non_torch_gib - d.weights_gib)
        if fit >= 1:
            out.append(({"env.VLLM_CPU_KVCACHE_SPACE": str(fit)}, f"KV space {fit} GiB: what the host has left"))
    return out
