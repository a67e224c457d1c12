"""What each supported SGLang release calls things.

SGLang renames and removes launch flags between releases (0.5.23 rejects ``--cuda-graph-max-bs`` as
ambiguous; 0.4.x-0.5.4 know only that spelling), moves ``bench_serving`` and renames info endpoints. This
module is the single table of those facts, so the renderer, the twin and the log reader agree on which
release says what. An unknown version is mapped to the nearest known release *at or below* it — flags
appear at releases, so the older spelling is the safer guess — and the caller is told.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

from dsv4lab.errors import VersionError, closest_name

__all__ = [
    "RELEASES",
    "SGLangRelease",
    "VersionFallbackWarning",
    "flags_owned_by_fields",
    "parse_version",
    "resolve_release",
]


class VersionFallbackWarning(UserWarning):
    """An SGLang version that dsv4lab does not know was mapped to the nearest known release."""


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.\-+]?(?:post|rc|dev|a|b)?\d*)*(?:\+[\w.]+)?$")


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.5.4.post3"`` -> ``(0, 5, 4)``; post/rc/dev suffixes do not change which flags exist."""
    m = _VERSION.match(text.strip())
    if not m:
        known = [r.version for r in RELEASES]
        near = closest_name(text, known)
        hint = f" — did you mean {near!r}?" if near else ""
        raise VersionError(
            f"SGLang version {text!r} is not a version number like 0.5.23 or 0.5.4.post3{hint} "
            f"(known releases: {', '.join(known)})"
        )
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


_COMMON_FLAGS: dict[str, str] = {
    "model_path": "--model-path",
    "served_model_name": "--served-model-name",
    "tp": "--tp-size",
    "dp": "--dp-size",
    "host": "--host",
    "port": "--port",
    "mem_fraction_static": "--mem-fraction-static",
    "disable_cuda_graph": "--disable-cuda-graph",
    "max_running_requests": "--max-running-requests",
    "chunked_prefill_size": "--chunked-prefill-size",
    "context_length": "--context-length",
    "kv_cache_dtype": "--kv-cache-dtype",
    "quantization": "--quantization",
    "trust_remote_code": "--trust-remote-code",
    "enable_metrics": "--enable-metrics",
    "speculative.algorithm": "--speculative-algorithm",
    "speculative.num_steps": "--speculative-num-steps",
    "speculative.eagle_topk": "--speculative-eagle-topk",
    "speculative.num_draft_tokens": "--speculative-num-draft-tokens",
    "speculative.draft_model_path": "--speculative-draft-model-path",
    "nnodes": "--nnodes",
    "node_rank": "--node-rank",
    "dist_init_addr": "--dist-init-addr",
}

_OLD_GRAPH_FLAGS = {"cuda_graph_max_bs": "--cuda-graph-max-bs", "cuda_graph_bs": "--cuda-graph-bs"}
_NEW_GRAPH_FLAGS = {
    "cuda_graph_max_bs": "--cuda-graph-max-bs-decode",
    "cuda_graph_bs": "--cuda-graph-bs-decode",
}

#: Aliases SGLang accepts for flags that a field owns; passing them in extra_args would fight the field.
_ALIASES: dict[str, str] = {
    "--model": "model_path",
    "--tp": "tp",
    "--tensor-parallel-size": "tp",
    "--dp": "dp",
    "--data-parallel-size": "dp",
    "--nccl-init-addr": "dist_init_addr",
    "--speculative-draft-model": "speculative.draft_model_path",
    "--cuda-graph-max-bs": "cuda_graph_max_bs",
    "--cuda-graph-bs": "cuda_graph_bs",
}


@dataclass(frozen=True)
class SGLangRelease:
    """The facts dsv4lab needs about one SGLang release."""

    version: str
    flags: Mapping[str, str] = field(repr=False)
    kv_cache_dtypes: tuple[str, ...] = field(repr=False)
    speculative_algorithms: tuple[str, ...] = field(repr=False)
    quantizations: tuple[str, ...] = field(repr=False, default=())
    bench_module: str = "sglang.bench_serving"
    launch_module: str = "sglang.launch_server"
    server_info_path: str = "/get_server_info"
    model_info_path: str = "/get_model_info"
    #: Releases' argparse choices, read from the real parsers (0.5.16+ take any speculative algorithm
    #: name at parse time; the built-in list is what the server then accepts).
    #: "old" = 0.4.x-0.5.4 log and graph-capture lines; "new" = 0.5.16+ (see reference sglang.md).
    log_style: str = "old"
    #: kill_process_tree logs a line from 0.5.16 on.
    logs_kill_process_tree: bool = False
    #: 0.5.23 loads draft weights before sizing KV (inside the static fraction) and folds draft KV into
    #: the target's bytes per token; 0.5.4 puts both in the slack outside the fraction.
    draft_in_static: bool = False

    @property
    def key(self) -> tuple[int, int, int]:
        return parse_version(self.version)

    def flag_for(self, field_name: str) -> str | None:
        return self.flags.get(field_name)


#: ``--quantization`` choices of 0.5.16, read from its parser; 0.5.23 has the same list without ``marlin``.
_QUANT_0_5_16: tuple[str, ...] = (
    "awq",
    "fp8",
    "mxfp8",
    "gptq",
    "marlin",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp8",
    "modelopt_fp4",
    "nvfp4_online",
    "modelopt_mixed",
    "petit_nvfp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "w4afp8",
    "mxfp4",
    "auto-round",
    "auto-round-int8",
    "compressed-tensors",
    "modelslim",
    "mxfp_w4a8",
    "quark",
    "quark_int4fp8_moe",
    "quark_mxfp4",
    "mlx_q4",
    "mlx_q8",
    "unquant",
    "humming",
)

#: The SGLang releases whose flags dsv4lab renders, oldest first; an unknown version renders as the newest
#: one at or below it.
RELEASES: tuple[SGLangRelease, ...] = (
    SGLangRelease(
        version="0.4.10",
        flags={**_COMMON_FLAGS, **_OLD_GRAPH_FLAGS},
        kv_cache_dtypes=("auto", "fp8_e5m2", "fp8_e4m3"),
        speculative_algorithms=("EAGLE", "EAGLE3", "NEXTN"),
        quantizations=(
            "awq",
            "fp8",
            "gptq",
            "marlin",
            "gptq_marlin",
            "awq_marlin",
            "bitsandbytes",
            "gguf",
            "modelopt",
            "modelopt_fp4",
            "petit_nvfp4",
            "w8a8_int8",
            "w8a8_fp8",
            "moe_wna16",
            "qoq",
            "w4afp8",
        ),
    ),
    SGLangRelease(
        version="0.5.4",
        flags={**_COMMON_FLAGS, **_OLD_GRAPH_FLAGS},
        kv_cache_dtypes=("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"),
        speculative_algorithms=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
        quantizations=(
            "awq",
            "fp8",
            "gptq",
            "marlin",
            "gptq_marlin",
            "awq_marlin",
            "bitsandbytes",
            "gguf",
            "modelopt",
            "modelopt_fp8",
            "modelopt_fp4",
            "petit_nvfp4",
            "w8a8_int8",
            "w8a8_fp8",
            "moe_wna16",
            "qoq",
            "w4afp8",
            "mxfp4",
            "auto-round",
            "compressed-tensors",
        ),
    ),
    SGLangRelease(
        version="0.5.16",
        flags={**_COMMON_FLAGS, **_NEW_GRAPH_FLAGS},
        kv_cache_dtypes=(
            "auto",
            "fp8_e5m2",
            "fp8_e4m3",
            "mxfp8",
            "bf16",
            "bfloat16",
            "nvfp4",
            "fp4_mx_block16",
            "fp4_e2m1",
        ),
        speculative_algorithms=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"),
        quantizations=_QUANT_0_5_16,
        bench_module="sglang.benchmark.serving",
        server_info_path="/server_info",
        model_info_path="/model_info",
        log_style="new",
        logs_kill_process_tree=True,
    ),
    SGLangRelease(
        version="0.5.23",
        flags={**_COMMON_FLAGS, **_NEW_GRAPH_FLAGS},
        kv_cache_dtypes=(
            "auto",
            "fp8_e5m2",
            "fp8_e4m3",
            "mxfp8",
            "bf16",
            "bfloat16",
            "nvfp4",
            "fp4_mx_block16",
        ),
        speculative_algorithms=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"),
        quantizations=tuple(q for q in _QUANT_0_5_16 if q != "marlin"),
        bench_module="sglang.benchmark.serving",
        server_info_path="/server_info",
        model_info_path="/model_info",
        log_style="new",
        logs_kill_process_tree=True,
        draft_in_static=True,
    ),
)

LATEST = RELEASES[-1]


def resolve_release(version: str | SGLangRelease | None, *, warn: bool = True) -> SGLangRelease:
    """The release whose flags to use for ``version`` (None = the newest known).

    Unknown versions map to the newest known release at or below them (below the oldest: the oldest),
    with a :class:`VersionFallbackWarning` that names both, so reports can say what was assumed.
    """
    if version is None:
        return LATEST
    if isinstance(version, SGLangRelease):
        return version
    key = parse_version(version)
    exact = [r for r in RELEASES if r.key == key]
    if exact:
        return exact[0]
    below = [r for r in RELEASES if r.key <= key]
    chosen = below[-1] if below else RELEASES[0]
    if warn:
        warnings.warn(
            f"SGLang {version} is not a release dsv4lab knows ({', '.join(r.version for r in RELEASES)}); "
            f"rendering as SGLang {chosen.version}",
            VersionFallbackWarning,
            stacklevel=2,
        )
    return chosen


def fallback_note(version: str | None) -> str | None:
    """The sentence :func:`resolve_release` would warn with, or None for a known version."""
    if version is None:
        return None
    key = parse_version(version)
    if any(r.key == key for r in RELEASES):
        return None
    chosen = resolve_release(version, warn=False)
    return f"SGLang {version} is not a known release; rendered as SGLang {chosen.version}"


def flags_owned_by_fields() -> dict[str, str]:
    """Every spelling (any release, aliases included) of a flag that a ServerConfig field renders."""
    owned: dict[str, str] = dict(_ALIASES)
    for release in RELEASES:
        for name, flag in release.flags.items():
            owned[flag] = name
    return owned
