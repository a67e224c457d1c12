"""Model-guided tuning: the fewest launches to the best config under an SLO (``lab.tune``, ``dsv4lab tune``).

A launch costs minutes of a GPU host; arithmetic costs nothing. So before any launch every point of the search
space goes through the memory model: the points predicted not to start are ruled out (each with the phase and
the GiB it is short by), and the rest are ordered by what the model says of them (:func:`model_order`). The
search over launches is Optuna's TPE sampler, its first trials the model's best points (enqueued), then its
own proposals; a proposal of a ruled-out point costs no launch (it is told as infeasible, a constraint the
sampler learns), a proposal of a point already run is told its result again. Each launch is an ordinary
server of the session (its run dir, readiness, benchmarks) benchmarked at every concurrency level; a server
that crashes anyway is an outcome (score 0, recorded with its verdict: a calibration point for the model),
never an abort. Stop keeps every finished trial.

The objective is one of:

- ``throughput``: output tok/s per GPU, the best level that meets every SLO;
- ``goodput``: requests per second per GPU that met every SLO on their own (needs an SLO);
- ``interactivity``: output tok/s per user (1000 / median TPOT) at the best level whose throughput per GPU is
  at least ``floor``.

On a Slurm placement ``max_parallel`` trials run at once: the sampler is asked for that many, their servers
start together (Slurm places and queues them) and their results are told when all have run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dsv4lab import htmlview as hv
from dsv4lab.atomicfile import write_json_atomic, write_text_atomic
from dsv4lab.bench.slo import LatencyLimit, parse_slo, slo_figures
from dsv4lab.bench.workload import check_load, parse_levels
from dsv4lab.config import AnyConfig
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError, Interrupted, UnknownNameError
from dsv4lab.notebook.server import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, Server, stop_soon

__all__ = [
    "OBJECTIVES",
    "Dimension",
    "Objective",
    "Trial",
    "TuneResult",
    "model_key",
    "model_order",
    "model_seeds",
    "parse_space",
    "run_tune",
]

#: What a tuning run can maximise (see the module doc).
OBJECTIVES = ("throughput", "goodput", "interactivity")
#: Proposals in a row that bring no new launch before the model's next untried point is enqueued instead.
_STALE_PROPOSALS = 25
#: How finely a range ``lo:hi`` is cut when no step is given: this many steps.
_RANGE_STEPS = 5


@dataclass(frozen=True)
class Dimension:
    """One config field of the search space and its candidate values, in order."""

    field: str
    values: tuple[Any, ...]

    @property
    def ordered(self) -> bool:
        """Numbers: the sampler searches them by position (ordinal), not as unrelated choices."""
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)

    def __str__(self) -> str:
        return f"{self.field} in {', '.join(_text(v) for v in self.values)}"


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _number(text: str) -> int | float | bool | str:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text.strip()


def _pair(text: Any) -> tuple[str | None, str]:
    """``FIELD=VALUES`` or ``FIELD VALUES``; (None, "") for anything else."""
    if not isinstance(text, str):
        return None, ""
    if "=" in text:
        key, _, value = text.partition("=")
    else:
        key, _, value = text.strip().partition(" ")
    return (key.strip() or None, value.strip()) if value.strip() else (None, "")


def _range(name: str, text: str) -> tuple[Any, ...]:
    parts = text.split(":")
    allowed = "lo:hi or lo:hi:step with numbers lo < hi (and step > 0), e.g. 0.50:0.75 or 2048:8192:2048"
    nums = [_number(p) for p in parts]
    if len(parts) not in (2, 3) or not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in nums):
        raise ConfigError(f"space {name}", text, allowed)
    lo, hi = float(nums[0]), float(nums[1])
    if not lo < hi:
        raise ConfigError(f"space {name}", text, allowed)
    integer = all(isinstance(n, int) for n in nums)
    step = float(nums[2]) if len(nums) == 3 else (hi - lo) / _RANGE_STEPS
    if step <= 0:
        raise ConfigError(f"space {name}", text, allowed)
    count = math.floor((hi - lo) / step + 1e-9) + 1
    values = [lo + i * step for i in range(count)]
    if integer:
        return tuple(sorted({round(v) for v in values}))
    return tuple(round(v, 6) for v in values)


def parse_space(spec: Mapping[str, Any] | Sequence[str] | str, fields: Sequence[str]) -> tuple[Dimension, ...]:
    """The space from ``["mem_fraction_static=0.50:0.75", "cuda_graph_max_bs=8,16,32,64"]`` (the CLI's
    ``--space``), ``{"mem_fraction_static": "0.50:0.75", "cuda_graph_max_bs": [8, 16, 32, 64]}``, or a notebook
    parameter's text ``"mem_fraction_static 0.50:0.75; cuda_graph_max_bs 8,16,32,64"`` (papermill cannot read a
    parameter whose value holds an equals sign): a range ``lo:hi[:step]`` (cut in five steps when no step is
    given) or a list of choices, for config fields (``fields``: the engine's names, nested ones dotted)."""
    items: list[tuple[str, Any]]
    if isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        texts = [part for part in spec.split(";") if part.strip()] if isinstance(spec, str) else list(spec)
        items = []
        for text in texts:
            key, value = _pair(text)
            if key is None:
                raise ConfigError(
                    "space", text, "FIELD=lo:hi[:step] or FIELD=v1,v2,..., e.g. cuda_graph_max_bs=8,16,32"
                )
            items.append((key, value))
    if not items:
        raise ConfigError("space", "", "at least one FIELD=lo:hi or FIELD=v1,v2 to search")
    dims: dict[str, Dimension] = {}
    for name, value in items:
        if name not in fields:
            raise UnknownNameError("config field", name, list(fields), field=f"space {name}")
        if name in dims:
            raise ConfigError(f"space {name}", value, "one range or list per field")
        if isinstance(value, str) and ":" in value:
            values = _range(name, value)
        elif isinstance(value, str):
            values = tuple(_number(v) for v in value.split(",") if v.strip())
        elif isinstance(value, (list, tuple)):
            values = tuple(value)
        else:
            raise ConfigError(f"space {name}", value, "a range lo:hi[:step] or a list of values")
        if len(set(values)) < 2:
            raise ConfigError(f"space {name}", value, "at least two different values to choose from")
        dims[name] = Dimension(name, tuple(dict.fromkeys(values)))
    return tuple(dims.values())


def grid(space: Sequence[Dimension]) -> list[dict[str, Any]]:
    """Every point of the space, the first dimension slowest."""
    import itertools

    return [
        dict(zip([d.field for d in space], combo, strict=True))
        for combo in itertools.product(*(d.values for d in space))
    ]


@dataclass(frozen=True)
class Objective:
    """What a trial is scored by (see the module doc), its SLOs, and the throughput floor of ``interactivity``."""

    kind: str = "throughput"
    slo: tuple[LatencyLimit, ...] = ()
    floor: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise ConfigError("objective", self.kind, ", ".join(OBJECTIVES))
        if self.kind == "goodput" and not self.slo:
            raise ConfigError("objective", self.kind, "goodput with an SLO (--slo tpot_p99_ms=400), or throughput")
        if self.floor is not None and (isinstance(self.floor, bool) or not self.floor >= 0):
            raise ConfigError("floor", self.floor, "a throughput per GPU in tok/s >= 0")

    @property
    def unit(self) -> str:
        return {"throughput": "tok/s per GPU", "goodput": "req/s per GPU", "interactivity": "tok/s per user"}[self.kind]

    @property
    def words(self) -> str:
        what = {
            "throughput": "output throughput per GPU",
            "goodput": "goodput per GPU (requests meeting every SLO)",
            "interactivity": "output tok/s per user"
            + (f" at >= {self.floor:g} tok/s per GPU" if self.floor is not None else ""),
        }[self.kind]
        return what + (f", under {', '.join(str(s) for s in self.slo)}" if self.slo else "")

    @property
    def tpot_limit_ms(self) -> float | None:
        """A TPOT SLO's limit (the frontier's cut), when one bounds the median or a higher percentile."""
        limits = [s.limit_ms for s in self.slo if s.latency == "tpot"]
        return min(limits) if limits else None

    def value(self, level: Mapping[str, Any]) -> float:
        """The objective's figure at one level, whatever its SLOs (0 when it cannot be read)."""
        key = {"throughput": "tok_s_per_gpu", "goodput": "goodput_per_gpu", "interactivity": "tok_s_per_user"}
        value = float(level.get(key[self.kind]) or 0.0)
        return value if math.isfinite(value) else 0.0

    def qualifies(self, level: Mapping[str, Any]) -> bool:
        """Whether a level counts: it meets every SLO (goodput counts its good requests anyway), and for
        ``interactivity`` it serves at least ``floor`` tok/s per GPU."""
        if self.kind == "goodput":
            return True
        if not level["meets_slo"]:
            return False
        return self.kind != "interactivity" or self.floor is None or float(level["tok_s_per_gpu"]) >= self.floor

    def score(self, levels: Sequence[Mapping[str, Any]]) -> float:
        """The trial's score: the best level that qualifies (0 when none does)."""
        return max((self.value(lv) for lv in levels if self.qualifies(lv)), default=0.0)

    def excess(self, levels: Sequence[Mapping[str, Any]]) -> float:
        """How far the trial's closest level is from qualifying (0 when one does): the largest relative overshoot
        of an SLO limit, or the shortfall under the floor. The sampler learns it as a constraint, so it moves
        toward configs that meet the SLO while it is told each config's raw :meth:`value`."""
        worst = []
        for lv in levels:
            if self.qualifies(lv):
                return 0.0
            over = [float(lv.get(s.name, math.inf)) / s.limit_ms - 1.0 for s in self.slo]
            if self.kind == "interactivity" and self.floor:
                over.append(1.0 - float(lv["tok_s_per_gpu"]) / self.floor)
            worst.append(max([o for o in over if math.isfinite(o)] or [1.0]))
        return max(0.0, min(worst, default=1.0))


@dataclass
class Trial:
    """One point of the space: ruled out by the model, or launched (with its run dir, verdict and figures)."""

    number: int
    values: dict[str, Any]
    predicted: str
    short_by_gib: float | None = None
    status: str = "ruled out"  # ruled out | ok | crashed | failed | interrupted
    server: str | None = None
    run_dir: str | None = None
    verdict: str | None = None
    reason: str | None = None
    levels: list[dict[str, Any]] = field(default_factory=list)
    score: float | None = None
    wall_s: float | None = None
    model_rank: int | None = None

    @property
    def label(self) -> str:
        return " ".join(f"{k}={_text(v)}" for k, v in self.values.items())


@dataclass
class TuneResult:
    """A tuning run: the base config, the space, every launched trial and every point the model ruled out."""

    base: str
    space: tuple[Dimension, ...]
    objective: Objective
    concurrency: tuple[int, ...]
    budget: int
    trials: list[Trial]
    ruled_out: list[Trial]
    folder: Path
    clock: Any = None
    seed: int = 0
    interrupted: bool = False

    @property
    def launches(self) -> int:
        return len(self.trials)

    @property
    def best(self) -> Trial | None:
        scored = [t for t in self.trials if t.status == "ok" and t.score]
        return max(scored, key=lambda t: t.score or 0.0) if scored else None

    @property
    def index(self) -> Path:
        return self.folder / "index.html"

    @property
    def grid_size(self) -> int:
        return math.prod(len(d.values) for d in self.space)

    def to_frame(self) -> pd.DataFrame:
        """One row per launched trial and concurrency level (the frontier's rows, with the SLO figures)."""
        rows = []
        for t in self.trials:
            base = {"trial": t.number, "config": f"trial {t.number}", "point": t.label, **t.values}
            base.update(status=t.status, score=t.score)
            if not t.levels:
                rows.append({**base, "concurrency": None})
            for level in t.levels:
                rows.append({**base, **level})
        frame: pd.DataFrame = pd.DataFrame(rows)
        return frame

    def frontier_frame(self) -> pd.DataFrame:
        frame = self.to_frame()
        if frame.empty or "tok_s_per_gpu" not in frame.columns:
            empty: pd.DataFrame = pd.DataFrame(
                columns=["config", "concurrency", "tok_s_per_user", "tok_s_per_gpu", "meets_slo"]
            )
            return empty
        kept: pd.DataFrame = frame.dropna(subset=["tok_s_per_gpu"])
        return kept

    def frontier(self) -> Any:
        """The Pareto chart of every launched config (:func:`~dsv4lab.plots.frontier.frontier_chart`)."""
        from dsv4lab.plots.frontier import frontier_chart

        best = self.best
        return frontier_chart(
            self.frontier_frame(),
            clock=self.clock,
            tpot_limit_ms=self.objective.tpot_limit_ms,
            chosen=f"trial {best.number}" if best is not None else None,
            title=f"{self.base}: every trial at every concurrency",
        )

    def calibration(self) -> Any:
        """The graph-memory model fitted to what every launched trial's server logged, a crash included
        (:func:`~dsv4lab.model.calibration.calibrate`): where the model's prediction was wrong, the next
        tuning run on this host starts from the measured coefficients (``calibration.model``)."""
        from dsv4lab.model.calibration import calibrate

        logs = [Path(t.run_dir) / "server.log" for t in self.trials if t.run_dir]
        return calibrate(*[log for log in logs if log.is_file()])

    def ruled_out_frame(self) -> pd.DataFrame:
        """The points the memory model ruled out before any launch, each with the phase and the GiB short."""
        rows = [
            {
                **t.values,
                "predicted": t.predicted,
                "short by (GiB)": None if t.short_by_gib is None else round(t.short_by_gib, 2),
            }
            for t in self.ruled_out
        ]
        columns = [*(d.field for d in self.space), "predicted", "short by (GiB)"]
        frame: pd.DataFrame = pd.DataFrame(rows, columns=columns)
        return frame

    def to_dict(self) -> dict[str, Any]:
        """What ``dsv4lab tune --json`` prints and ``tune.json`` holds."""
        best = self.best
        return {
            "base": self.base,
            "objective": {"kind": self.objective.kind, "unit": self.objective.unit, "words": self.objective.words},
            "slo": {s.name: s.limit_ms for s in self.objective.slo},
            "space": {d.field: list(d.values) for d in self.space},
            "concurrency": list(self.concurrency),
            "budget": self.budget,
            "seed": self.seed,
            "grid_size": self.grid_size,
            "launches": self.launches,
            "interrupted": self.interrupted,
            "best": None
            if best is None
            else {
                **best.values,
                "trial": best.number,
                "score": best.score,
                "run_dir": best.run_dir,
                "levels": best.levels,
            },
            "ruled_out": [
                {**t.values, "predicted": t.predicted, "short_by_gib": t.short_by_gib} for t in self.ruled_out
            ],
            "trials": [dataclasses.asdict(t) for t in self.trials],
            "clock": self.clock.to_dict() if self.clock is not None else None,
        }

    def table_rows(self) -> list[dict[str, Any]]:
        """The trials as a person reads them: one row each, the best level's figures."""
        rows = []
        unit = self.objective.unit
        for t in self.trials:
            top = max(t.levels, key=lambda lv: lv.get("tok_s_per_gpu") or 0.0) if t.levels else {}
            rows.append(
                {
                    "trial": t.number,
                    **{k: _text(v) for k, v in t.values.items()},
                    "model rank": "" if t.model_rank is None else t.model_rank,
                    "outcome": t.status if t.verdict in (None, "READY") else f"{t.status} ({t.verdict})",
                    f"score ({unit})": "" if t.score is None else f"{t.score:,.2f}",
                    "tok/s per GPU": _fmt(top.get("tok_s_per_gpu")),
                    "tok/s per user": _fmt(top.get("tok_s_per_user")),
                    "good requests": "" if not top else f"{top.get('good_requests', 0)}/{top.get('requests', 0)}",
                    "goodput (req/s per GPU)": _fmt(top.get("goodput_per_gpu"), 3),
                    "meets SLO": "" if not top else ("yes" if top.get("meets_slo") else "no"),
                }
            )
        return rows

    def _repr_html_(self) -> str:
        best = self.best
        head = (
            f"{plural(self.launches, 'launch', 'launches')} of a {self.grid_size}-point space "
            f"({len(self.ruled_out)} ruled out by the memory model before any launch); objective: "
            f"{self.objective.words}."
        )
        won = f" Best: trial {best.number}, {best.label}: {best.score:,.2f} {self.objective.unit}." if best else ""
        return hv.card(
            f"tune {self.base}", hv.p(head + won) + hv.table(self.table_rows()), state="ok" if best else "warn"
        )


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{float(value):,.{digits}f}"


def model_key(prediction: Any, load_tokens: int, top_bs: int) -> tuple[bool, bool, bool, float]:
    """What the memory model says of a point that fits, best first when sorted in reverse: a KV pool that holds
    the whole load (the largest concurrency's requests at full length) before one that does not; CUDA graphs
    that cover the largest concurrency; no risk of running out of activation room on the first big prefill;
    then, only for a pool that does not hold the load, the larger pool (a pool that holds it gains nothing
    from more room, so those points tie)."""
    kv = float(getattr(prediction, "kv_tokens", 0) or 0)
    settings = getattr(prediction, "settings", None)
    graph_bs = getattr(settings, "cuda_graph_max_bs", None)
    covers = graph_bs is None or graph_bs >= top_bs
    holds = kv >= load_tokens
    return (holds, covers, not bool(getattr(prediction, "runtime_risk", False)), 0.0 if holds else kv)


def model_order(predictions: Mapping[int, Any], load_tokens: int, top_bs: int) -> list[int]:
    """The points predicted to fit, best first by :func:`model_key` (ties keep the space's order)."""
    fitting = [i for i in predictions if getattr(predictions[i], "fits", False)]
    return sorted(fitting, key=lambda i: model_key(predictions[i], load_tokens, top_bs), reverse=True)


def _distance(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def model_seeds(
    order: Sequence[int],
    keys: Mapping[int, Any],
    points: Sequence[Mapping[str, Any]],
    space: Sequence[Dimension],
    n: int,
) -> list[int]:
    """The first ``n`` launches: the model's best point, then among the points the model ranks as high (a tie)
    the ones farthest from those already chosen (each dimension's position scaled to 0..1), so that what the
    model cannot tell apart is tried at its extremes; then the next ranks."""
    if not order:
        return []

    def position(i: int) -> list[float]:
        return [d.values.index(points[i][d.field]) / max(1, len(d.values) - 1) for d in space]

    chosen = [order[0]]
    for tier_key in dict.fromkeys(keys[i] for i in order):
        tier = [i for i in order if keys[i] == tier_key and i not in chosen]
        while tier and len(chosen) < n:
            far = max(tier, key=lambda i: min(_distance(position(i), position(j)) for j in chosen))
            chosen.append(far)
            tier.remove(far)
        if len(chosen) >= n:
            break
    return chosen[:n]


def _level_figures(run: Any, gpus: int, limits: Sequence[LatencyLimit]) -> dict[str, Any]:
    summary = run.on_hardware
    tpot = float(summary.tpot_ms.median)
    figures = slo_figures(run, limits)
    return {
        "concurrency": int(run.concurrency or 0),
        "requests": int(summary.total),
        "completed": int(summary.completed),
        "output_tok_s": float(summary.output_throughput),
        "tok_s_per_gpu": float(summary.output_throughput) / gpus,
        "tok_s_per_user": 1000.0 / tpot if tpot > 0 and math.isfinite(tpot) else float("nan"),
        "tpot_median_ms": tpot,
        "ttft_median_ms": float(summary.ttft_ms.median),
        **figures,
        "meets_slo": bool(figures["meets_slo"]) and run.outcome == "ok",
        "goodput_per_gpu": float(figures["goodput_req_s"]) / gpus,
    }


def run_tune(
    lab: Any,
    base: AnyConfig | str,
    space: Mapping[str, Any] | Sequence[str],
    *,
    objective: str = "throughput",
    concurrency: Sequence[int] | int = (16,),
    slo: Mapping[str, Any] | Sequence[str] | str | None = None,
    floor: float | None = None,
    budget: int = 8,
    seed: int = 0,
    input_len: int = DEFAULT_INPUT_LEN,
    output_len: int = DEFAULT_OUTPUT_LEN,
    prompts: int | None = None,
    max_parallel: int = 1,
    timeout_s: float = 900.0,
    folder: str | Path | None = None,
    name: str | None = None,
) -> TuneResult:
    """Search ``space`` around ``base`` for the best config in at most ``budget`` launches: the memory model
    rules out what cannot start and orders the rest, Optuna's sampler picks the launches (see the module doc).

    ``lab.tune(...)`` is this function with the :class:`~dsv4lab.notebook.lab.Lab` as ``lab`` (typed ``Any``:
    the Lab imports this module). ``space``: ``{"mem_fraction_static": "0.50:0.75", "cuda_graph_max_bs": [8,
    16, 32]}``; ``objective``: ``throughput``, ``goodput`` or ``interactivity``; ``slo``: ``{"tpot_p99_ms":
    400}``. ``tune.json`` and ``index.html`` go into ``folder`` (default: ``<run_root>/tune-<session>``) after
    each trial; ``name`` is the base's in the pages (default: the preset's). Everything is checked before the
    first launch; Stop keeps every finished trial (in the Interrupted's ``partial``)."""
    import optuna

    check_load(concurrency, 1, prompts, input_len, output_len, seed)
    levels = tuple(parse_levels(concurrency))
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigError("budget", budget, "a whole number of launches >= 1")
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise ConfigError("max_parallel", max_parallel, "a whole number >= 1")
    if max_parallel > 1 and lab.slurm is None:
        raise ConfigError(
            "max_parallel", max_parallel, "1 without a Slurm placement (trials on one host would share its GPUs)"
        )
    goal = Objective(objective, parse_slo(slo), floor)
    dims = parse_space(space, list(lab.engine.field_names()))
    base_config = lab.config(base)
    base_name = name or (base if isinstance(base, str) else "the base config")
    points = grid(dims)
    configs = [lab.config(base_config, **{k.replace(".", "__"): v for k, v in p.items()}) for p in points]
    predictions = {i: lab.preflight(c) for i, c in enumerate(configs)}
    load_tokens = max(levels) * (input_len + output_len)
    order = model_order(predictions, load_tokens, max(levels))
    keys = {i: model_key(predictions[i], load_tokens, max(levels)) for i in order}
    rank = {i: r + 1 for r, i in enumerate(order)}
    out = Path(folder) if folder is not None else Path(lab.run_root) / f"tune-{lab.session}"
    out.mkdir(parents=True, exist_ok=True)
    ruled_out = []
    for i, p in enumerate(predictions.values()):
        if not getattr(p, "fits", False):
            short = getattr(p, "short_by_gib", None)
            phase = getattr(p, "fail_phase", None) or "startup"
            words = f"OOM in {phase}" + (f", short by {short:.2f} GiB" if short is not None else "")
            ruled_out.append(Trial(i, dict(points[i]), words, short))
    result = TuneResult(base_name, dims, goal, levels, budget, [], ruled_out, out, lab.clock, seed)
    _write(result)
    if not order:
        return result

    def encode(i: int) -> dict[str, Any]:
        return {d.field: d.values.index(points[i][d.field]) if d.ordered else points[i][d.field] for d in dims}

    def decode(params: Mapping[str, Any]) -> int:
        values = {d.field: d.values[params[d.field]] if d.ordered else params[d.field] for d in dims}
        return points.index(values)

    distributions: dict[str, Any] = {
        d.field: optuna.distributions.IntDistribution(0, len(d.values) - 1)
        if d.ordered
        else optuna.distributions.CategoricalDistribution(list(d.values))
        for d in dims
    }
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeded = model_seeds(order, keys, points, dims, max(1, min(len(order), max(2, budget // 3))))
    with warnings.catch_warnings():  # constraints_func is marked experimental (since Optuna 3.0)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=len(seeded), constraints_func=lambda t: (t.user_attrs.get("short_by", 0.0),)
        )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for i in seeded:
        study.enqueue_trial(encode(i))
    done: dict[int, Trial] = {}
    gpus = _gpus(lab, base_config)
    started = time.monotonic()
    try:
        while len(result.trials) < budget and len(done) < len(order):
            batch: list[tuple[Any, int]] = []
            stale = 0
            while len(batch) < min(max_parallel, budget - len(result.trials)):
                trial = study.ask(distributions)
                i = decode(trial.params)
                if i not in rank:  # ruled out by the model: no launch, an infeasible point the sampler learns
                    trial.set_user_attr("short_by", float(predictions[i].short_by_gib or 1.0))
                    study.tell(trial, 0.0)
                elif i in done or any(i == j for _, j in batch):
                    if i in done:
                        known = done[i]
                        excess = goal.excess(known.levels) if known.status == "ok" else 1.0
                        trial.set_user_attr("short_by", excess)
                        study.tell(trial, max((goal.value(lv) for lv in known.levels), default=0.0))
                    else:
                        trial.set_user_attr("short_by", 0.0)
                        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    batch.append((trial, i))
                    continue
                stale += 1
                if stale >= _STALE_PROPOSALS:  # the sampler keeps proposing known points: the model's next
                    untried = [j for j in order if j not in done and all(j != k for _, k in batch)]
                    if not untried:
                        break
                    study.enqueue_trial(encode(untried[0]))
                    stale = 0
            if not batch:
                break
            ran = _launch_batch(
                lab,
                [(configs[i], points[i], i) for _, i in batch],
                result,
                rank,
                levels,
                gpus,
                goal,
                input_len,
                output_len,
                prompts,
                seed,
                timeout_s,
            )
            for (trial, i), t in zip(batch, ran, strict=True):
                done[i] = t
                excess = goal.excess(t.levels) if t.status == "ok" else 1.0
                trial.set_user_attr("short_by", excess)
                study.tell(trial, max((goal.value(lv) for lv in t.levels), default=0.0))
            _write(result)
    except KeyboardInterrupt:
        result.interrupted = True
        _write(result)
        raise Interrupted(
            f"tune {base_name}",
            result,
            after=f"after {plural(len(result.trials), 'launch', 'launches')} of {budget}",
            elapsed_s=time.monotonic() - started,
            note=f"every finished trial is kept; index: {result.index}",
        ) from None
    return result  # written after each batch


def _gpus(lab: Any, config: Any) -> int:
    return max(1, int(lab.engine.gpus_per_node(config)) * int(getattr(config, "nnodes", 1) or 1))


def _launch_batch(
    lab: Any,
    batch: Sequence[tuple[Any, Mapping[str, Any], int]],
    result: TuneResult,
    rank: Mapping[int, int],
    levels: Sequence[int],
    gpus: int,
    goal: Objective,
    input_len: int,
    output_len: int,
    prompts: int | None,
    seed: int,
    timeout_s: float,
) -> list[Trial]:
    """Launch the batch's configs together, benchmark each that comes up, stop them all; the trials, recorded
    in ``result`` as each ends (a Stop leaves the finished ones and marks the one it cut short)."""
    servers: list[tuple[Server, Trial, float]] = []
    trials: list[Trial] = []
    try:
        for config, values, i in batch:
            number = len(result.trials) + 1
            t = Trial(number, dict(values), "fits", status="failed", model_rank=rank.get(i))
            result.trials.append(t)
            trials.append(t)
            begun = time.monotonic()
            server = lab.launch(config, name=f"trial-{number:02d}", sample_gpus=False)
            t.server, t.run_dir = server.name, str(server.local_dir)
            servers.append((server, t, begun))
        for server, t, begun in servers:
            server.wait(timeout_s)
            t.verdict = server.state
            if not server.ready:
                t.status = "crashed"
                t.reason = server.readiness.reason if server.readiness is not None else "no verdict"
                t.score = 0.0
            else:
                runs = server.bench(
                    list(levels), prompts=prompts, input_len=input_len, output_len=output_len, seed=seed
                )
                t.levels = [_level_figures(r, gpus, goal.slo) for r in runs]
                failed = [r for r in runs if r.outcome in ("failed", "partial")]
                t.status = "failed" if failed else "ok"
                t.reason = failed[0].failure if failed else None
                t.score = goal.score(t.levels) if not failed else 0.0
            server.stop(grace_s=10.0)
            t.wall_s = time.monotonic() - begun
    except KeyboardInterrupt:  # Stop: the cut trials' servers end beside the reply, which comes at once
        cut = [(server, t) for server, t, _ in servers if server.stopped is None]
        for _, t in cut:
            t.status = "interrupted"
        stop_soon([server for server, _ in cut])
        raise
    return trials


def _write(result: TuneResult) -> Path:
    """``tune.json`` and ``index.html`` in the result's folder, for the trials so far."""
    from dsv4lab.notebook.report import public_html
    from dsv4lab.plots import to_svg

    write_json_atomic(result.folder / "tune.json", json.loads(json.dumps(result.to_dict(), default=str)))
    chart = ""
    if not result.frontier_frame().empty:
        chart = to_svg(result.frontier())
    best = result.best
    lines = [
        f"Objective: {result.objective.words}. Concurrency {', '.join(str(c) for c in result.concurrency)}.",
        f"{plural(result.launches, 'launch', 'launches')} of a budget of {result.budget}, over a space of "
        f"{plural(result.grid_size, 'point')}; {len(result.ruled_out)} ruled out by the memory model before any "
        "launch.",
    ]
    if best is not None:
        lines.append(f"Best: trial {best.number}, {best.label}: {best.score:,.2f} {result.objective.unit}.")
    if result.clock is not None and result.clock.is_twin:
        lines.append(result.clock.note())
    ruled = [{**{k: _text(v) for k, v in t.values.items()}, "predicted": t.predicted} for t in result.ruled_out]
    body = (
        "".join(hv.p(line) for line in lines)
        + (f'<div class="chart">{chart}</div>' if chart else "")
        + "<h2>Trials</h2>"
        + hv.table(result.table_rows())
        + "<h2>Ruled out before any launch</h2>"
        + (hv.table(ruled) if ruled else hv.p("none: the model predicts every point fits"))
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>tune {hv.esc(result.base)}</title>"
        "<style>body{font-family:system-ui,sans-serif;max-width:76rem;margin:1.5rem auto;padding:0 1rem}"
        "table{border-collapse:collapse;font-size:.9rem}th,td{text-align:left;padding:.2rem .8rem .2rem 0}"
        ".chart svg{max-width:100%;height:auto}</style></head><body>"
        f"<h1>Tuning {hv.esc(result.base)}</h1>{body}</body></html>"
    )
    return write_text_atomic(result.index, public_html(page, [result.folder]))
