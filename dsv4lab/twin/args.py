"""SGLang's launch-flag surface per release, parsed the way SGLang parses it (argparse, abbreviations on).

The twin must reject what the emulated release rejects — 0.5.23 has ``--cuda-graph-max-bs-decode`` and
``--cuda-graph-max-bs-prefill`` but no ``--cuda-graph-max-bs``, so argparse's prefix matching makes the
old spelling *ambiguous* there (exit 2), while 0.5.16 still accepts it as a deprecated alias and 0.5.4 knows
only the old one. Flags the twin has no model for (attention backend, MoE runner, ...) are accepted and
echoed in ``server_args`` so that users' ``extra_args`` work unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsv4lab.config.server_config import ServerConfig, SpeculativeConfig
from dsv4lab.config.versions import SGLangRelease

__all__ = ["TwinArgs", "build_parser", "parse_args"]

PROG = "launch_server.py"


def _add_common(p: argparse.ArgumentParser, release: SGLangRelease) -> None:
    new = release.key >= (0, 5, 16)
    a = p.add_argument
    a("--model-path", "--model", dest="model_path", type=str, required=True, help="model weights path or HF id")
    a("--tokenizer-path", type=str, default=None)
    a("--served-model-name", type=str, default=None)
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    a("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--chunked-prefill-size", type=int, default=None)
    a("--context-length", type=int, default=None)
    a("--kv-cache-dtype", type=str, default="auto", choices=list(release.kv_cache_dtypes))
    a("--quantization", type=str, default=None)
    a("--dtype", type=str, default="auto")
    a("--load-format", type=str, default="auto")
    a("--trust-remote-code", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--speculative-algorithm", type=str, default=None, choices=list(release.speculative_algorithms))
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path", default=None)
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", type=str, default=None)
    a("--dist-timeout", type=int, default=None)
    a("--base-gpu-id", type=int, default=0)
    a("--disable-cuda-graph", action="store_true")
    a("--enable-torch-compile", action="store_true")
    # Pass-through flags users put in extra_args; the twin records them and uses the few it models.
    a("--attention-backend", type=str, default=None)
    a("--moe-runner-backend", type=str, default="auto")
    a("--log-level", type=str, default="info")
    a("--log-level-http", type=str, default=None)
    a("--decode-log-interval", type=int, default=40)
    a("--skip-server-warmup", action="store_true")
    a("--swa-full-tokens-ratio", type=float, default=0.8)
    a("--disable-radix-cache", action="store_true")
    a("--watchdog-timeout", type=float, default=300.0)
    a("--page-size", type=int, default=None)
    a("--enable-dp-attention", action="store_true")
    a("--api-key", type=str, default=None)
    a("--random-seed", type=int, default=None)
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--stream-interval", type=int, default=1)
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    a("--chat-template", type=str, default=None)
    a("--tool-call-parser", type=str, default=None)
    a("--reasoning-parser", type=str, default=None)
    a("--device", type=str, default="cuda")
    if new:
        a("--cuda-graph-max-bs-decode", type=int, default=None)
        a("--cuda-graph-max-bs-prefill", type=int, default=None)
        a("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
        a("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
        choices = ["full", "breakable", "disabled"]
        a("--cuda-graph-backend-decode", type=str, default=None, choices=choices)
        a("--cuda-graph-backend-prefill", type=str, default=None, choices=choices)
        a("--disable-decode-cuda-graph", action="store_true")
        a("--disable-prefill-cuda-graph", action="store_true")
        if release.key < (0, 5, 23):  # deprecated aliases, removed in 0.5.23 (then ambiguous prefixes)
            a("--cuda-graph-max-bs", dest="cuda_graph_max_bs_decode", type=int, default=None)
            a("--cuda-graph-bs", dest="cuda_graph_bs_decode", type=int, nargs="+", default=None)
        else:
            a("--attn-dp-size", type=int, default=None)
    else:
        a("--cuda-graph-max-bs", dest="cuda_graph_max_bs_decode", type=int, default=None)
        a("--cuda-graph-bs", dest="cuda_graph_bs_decode", type=int, nargs="+", default=None)
        a("--disable-cuda-graph-padding", action="store_true")
        if release.key >= (0, 5, 4):
            a("--enable-piecewise-cuda-graph", action="store_true")


def build_parser(release: SGLangRelease) -> argparse.ArgumentParser:
    """An argparse parser with the emulated release's flags (abbreviations allowed, as in SGLang)."""
    p = argparse.ArgumentParser(prog=PROG, allow_abbrev=True)
    _add_common(p, release)
    return p


@dataclass(frozen=True)
class TwinArgs:
    """The parsed command line: the ServerConfig it describes plus SGLang-only knobs the twin uses."""

    config: ServerConfig
    values: Mapping[str, Any] = field(repr=False)
    #: SGLang's early argument warnings, logged by the main process.
    warnings: tuple[str, ...] = ()

    @property
    def decode_log_interval(self) -> int:
        return max(1, int(self.values["decode_log_interval"]))

    @property
    def skip_server_warmup(self) -> bool:
        return bool(self.values["skip_server_warmup"])

    @property
    def api_key(self) -> str | None:
        key = self.values.get("api_key")
        return str(key) if key else None

    @property
    def max_prefill_tokens(self) -> int:
        return int(self.values["max_prefill_tokens"])

    @property
    def max_total_tokens(self) -> int | None:
        v = self.values.get("max_total_tokens")
        return int(v) if v is not None else None

    @property
    def log_level(self) -> str:
        return str(self.values["log_level"]).lower()

    @property
    def disable_radix_cache(self) -> bool:
        return bool(self.values["disable_radix_cache"])


def _speculative(ns: argparse.Namespace, warnings: list[str]) -> SpeculativeConfig | None:
    if ns.speculative_algorithm is None:
        return None
    steps, topk, drafts = ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens
    if steps is None and topk is None and drafts is None:
        steps, topk, drafts = 3, 1, 4  # SGLang's automatic choice for DeepSeek-family models
    steps = steps if steps is not None else 3
    topk = topk if topk is not None else 1
    if drafts is None or (topk == 1 and drafts != steps + 1):
        if drafts is not None:
            warnings.append(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
            )
        drafts = steps + 1 if topk == 1 else steps * topk + 1
    return SpeculativeConfig(ns.speculative_algorithm, steps, topk, drafts, ns.speculative_draft_model_path)


def parse_args(argv: Sequence[str], release: SGLangRelease) -> TwinArgs:
    """Parse like SGLang (argparse errors exit 2); ServerConfig problems raise ConfigError."""
    ns = build_parser(release).parse_args(list(argv))
    warnings: list[str] = []
    disable = bool(ns.disable_cuda_graph or getattr(ns, "disable_decode_cuda_graph", False))
    if getattr(ns, "cuda_graph_backend_decode", None) == "disabled":
        disable = True
    max_bs = None if disable else ns.cuda_graph_max_bs_decode
    bs_list = None if disable or ns.cuda_graph_bs_decode is None else tuple(sorted(set(ns.cuda_graph_bs_decode)))
    if bs_list is not None and max_bs is not None and max(bs_list) > max_bs:
        bs_list = tuple(b for b in bs_list if b <= max_bs) or None
    chunk = ns.chunked_prefill_size
    config = ServerConfig(
        model_path=ns.model_path,
        served_model_name=ns.served_model_name,
        tp=ns.tp_size,
        dp=ns.dp_size,
        host=ns.host,
        port=ns.port,
        mem_fraction_static=ns.mem_fraction_static,
        cuda_graph_max_bs=max_bs,
        cuda_graph_bs=bs_list,
        disable_cuda_graph=disable,
        max_running_requests=ns.max_running_requests,
        chunked_prefill_size=chunk,
        context_length=ns.context_length,
        kv_cache_dtype=None if ns.kv_cache_dtype == "auto" else ns.kv_cache_dtype,
        quantization=ns.quantization,
        trust_remote_code=ns.trust_remote_code,
        enable_metrics=ns.enable_metrics,
        speculative=_speculative(ns, warnings),
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
    )
    values = {f: getattr(ns, f) for f in vars(ns)}
    return TwinArgs(config=config, values=values, warnings=tuple(warnings))


def config_fields(config: ServerConfig) -> dict[str, Any]:
    """The config as flat data (for server_args dumps)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
