"""Fit the graph-memory model to what a real server logged, and rebuild its config from the log.

The per-slot graph coefficients for DeepSeek-V4 on sm_120 are unpublished; the profile ships estimates.
Every successful capture line (``Capture ... graph end ... mem usage=X GB`` with its batch sizes) is a
measurement of ``a + b x max_bs x tokens_per_request`` for one runner, so a real log turns those
estimates into numbers that predict the next config on the same host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsv4lab.config.hardware import HARDWARE, HardwareProfile, ModelProfile, model_profile
from dsv4lab.config.server_config import ServerConfig, SpeculativeConfig
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError
from dsv4lab.logs import GraphCapture, ServerArgs, parse_log
from dsv4lab.logs.source import LogSource

__all__ = ["Calibration", "CapturePoint", "calibrate", "config_from_server_args", "hardware_for_total"]


@dataclass(frozen=True)
class CapturePoint:
    """One measured graph pool: ``runner`` captured up to ``max_bs`` with ``tokens`` per request."""

    role: str
    runner: str
    max_bs: int
    tokens: int
    usage_gib: float


@dataclass(frozen=True)
class Calibration:
    """Fitted coefficients, the points behind them, and the model profile that uses them."""

    model: ModelProfile
    points: tuple[CapturePoint, ...]
    fitted: tuple[str, ...]

    def describe(self) -> str:
        if not self.points:
            return "no completed graph capture in the log: the profile's estimates stay"
        g = self.model.graphs
        parts = []
        if "target" in self.fitted:
            parts.append(f"target graphs {g.target_a_gib:.2f} + {g.target_b_gib * 1024:.1f} MiB per bs x token")
        if "draft_extend" in self.fitted:
            parts.append(
                f"draft extend {g.draft_extend_a_gib:.2f} + {g.draft_extend_b_gib * 1024:.1f} MiB per bs x token"
            )
        return f"fitted from {plural(len(self.points), 'capture line')}: " + "; ".join(parts)

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        rows = [
            {"role": p.role, "runner": p.runner, "max bs": p.max_bs, "tokens/request": p.tokens, "GiB": p.usage_gib}
            for p in self.points
        ]
        state: hv.State = "ok" if self.points else "warn"
        return hv.card(
            f"graph-memory calibration ({self.model.name})", hv.p(self.describe()) + hv.table(rows), state=state
        )


def _first(args: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if args.get(k) is not None:
            return args[k]
    return None


def config_from_server_args(args: Mapping[str, Any]) -> ServerConfig:
    """The ServerConfig a logged ``server_args`` describes (the fields the memory model needs)."""
    model = _first(args, "model_path")
    if not isinstance(model, str) or not model:
        raise ConfigError("server_args.model_path", model, "a model path in the logged server arguments")
    spec = None
    algo = _first(args, "speculative_algorithm")
    if isinstance(algo, str) and algo and algo.upper() != "NONE":
        steps = _first(args, "speculative_num_steps")
        topk = _first(args, "speculative_eagle_topk")
        drafts = _first(args, "speculative_num_draft_tokens")
        if None in (steps, topk, drafts):
            steps = topk = drafts = None
        spec = SpeculativeConfig(algo.upper(), steps, topk, drafts)
    bs_list = _first(args, "cuda_graph_bs_decode", "cuda_graph_bs")
    max_bs = _first(args, "cuda_graph_max_bs_decode", "cuda_graph_max_bs")
    if isinstance(bs_list, list) and bs_list:
        max_bs = max(int(b) for b in bs_list)
    return ServerConfig(
        model_path=model,
        tp=int(_first(args, "tp_size") or 1),
        dp=int(_first(args, "dp_size") or 1),
        mem_fraction_static=_first(args, "mem_fraction_static"),
        cuda_graph_max_bs=int(max_bs) if max_bs else None,
        disable_cuda_graph=bool(_first(args, "disable_cuda_graph") or False) and not max_bs,
        max_running_requests=_first(args, "max_running_requests"),
        chunked_prefill_size=_first(args, "chunked_prefill_size"),
        trust_remote_code=bool(_first(args, "trust_remote_code") or False),
        speculative=spec,
    )


def hardware_for_total(total_gib: float | None, gpus: int) -> HardwareProfile | None:
    """The profile whose card capacity matches a logged ``total capacity`` (within 1 GiB)."""
    if total_gib is None:
        return None
    matches = [h for h in HARDWARE.values() if abs(h.gpu.total_gib - total_gib) < 1.0 and h.count >= gpus]
    return matches[0] if matches else None


def _tokens(runner: str, role: str, spec: SpeculativeConfig | None) -> int:
    """Tokens per request a runner's graphs are sized for (verify/extend: draft tokens; draft decode: topk)."""
    if spec is None:
        return 1
    if runner in ("verify", "extend"):
        return spec.num_draft_tokens or 2
    if runner == "decode" and role == "draft":
        return spec.eagle_topk or 1
    return 1


def calibrate(*logs: LogSource, model: ModelProfile | str | None = None) -> Calibration:
    """Fit graph coefficients from one or more logs (paths or line lists); TP rank 0's lines are used.

    With one point per runner the intercept stays at the profile's value and the slope is fitted; with
    points at two or more batch sizes both are fitted by least squares.
    """
    if not logs:
        raise ConfigError("logs", (), "at least one log path or list of lines")
    sources = list(logs)
    points: list[CapturePoint] = []
    model_path: str | None = None
    for source in sources:
        spec: SpeculativeConfig | None = None
        for event in parse_log(source):
            if isinstance(event, ServerArgs):
                try:
                    cfg = config_from_server_args(event.args)
                except ConfigError:
                    continue
                model_path = model_path or cfg.model_path
                spec = cfg.speculative
            elif (
                isinstance(event, GraphCapture)
                and event.stage == "end"
                and event.usage_gib is not None
                and event.bs
                and (event.rank in (None, 0))
                and event.graph in ("decode", "verify", "extend")
            ):
                role = event.role
                runner = "extend" if event.graph == "extend" else event.graph or "decode"
                points.append(
                    CapturePoint(role, runner, max(event.bs), _tokens(runner, role, spec), float(event.usage_gib))
                )
    if model is None:
        if model_path is None:
            raise ConfigError("model", None, "a model profile, or a log whose server_args name a known model")
        profile = model_profile(model_path)
    else:
        profile = model_profile(model) if isinstance(model, str) else model
    g = profile.graphs
    fitted: list[str] = []
    target = [p for p in points if p.role == "target"]
    extend = [p for p in points if p.role == "draft" and p.runner == "extend"]
    if target:
        # The first capture also carries the communication buffers (comm_gib) in its "mem usage".
        a, b = _fit([(p.max_bs * p.tokens, p.usage_gib - g.comm_gib) for p in target], g.target_a_gib)
        g = dataclasses.replace(g, target_a_gib=a, target_b_gib=b)
        fitted.append("target")
    if extend:
        a, b = _fit([(p.max_bs * p.tokens, p.usage_gib) for p in extend], g.draft_extend_a_gib)
        g = dataclasses.replace(g, draft_extend_a_gib=a, draft_extend_b_gib=b)
        fitted.append("draft_extend")
    return Calibration(profile.with_graphs(g) if fitted else profile, tuple(points), tuple(fitted))


def _fit(xy: list[tuple[int, float]], prior_a: float) -> tuple[float, float]:
    """Least squares for y = a + b x; with a single distinct x, keep ``a`` at the prior."""
    xs = {x for x, _ in xy}
    if len(xs) < 2:
        x = next(iter(xs))
        y = sum(v for _, v in xy) / len(xy)
        return prior_a, max(0.0, (y - prior_a) / x) if x else 0.0
    n = len(xy)
    mx = sum(x for x, _ in xy) / n
    my = sum(y for _, y in xy) / n
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    b = sum((x - mx) * (y - my) for x, y in xy) / sxx
    a = my - b * mx
    return max(0.0, a), max(0.0, b)
