"""What each supported vLLM release calls things on ``vllm serve``.

vLLM moves settings between flags and JSON blobs from release to release: CUDA-graph sizes were only a
``--compilation-config`` key in 0.8.5, gained ``--cuda-graph-sizes`` by 0.10.1 and
``--cudagraph-capture-sizes`` / ``--max-cudagraph-capture-size`` in 0.12 (where ``--cuda-graph-sizes`` became
a deprecated alias, gone by 0.32); ``--kv-cache-memory-bytes`` arrived in 0.10.2; ``--speculative-config``
took ``enforce_eager`` only after 0.8.5. A renderer that guessed
would send a flag argparse rejects (the server never starts) or, worse, one it reads differently. This
module is the one table of those facts; the renderer (:mod:`dsv4lab.config.vllm_launch`) refuses a setting
a release does not have instead of dropping it.

Facts were read from each release's own source (``vllm/engine/arg_utils.py``, ``vllm/config.py`` for 0.8.5,
``vllm/config/{cache,compilation,scheduler,speculative}.py`` for 0.11.0 and 0.32.0) and, for 0.32.0, checked
against its real ``vllm serve`` parser (``tests/test_real_vllm_parser.py``). Unlike SGLang's table, an
unknown release is an error, not a fallback: vLLM renames too much between minors for a guess to be safe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from dsv4lab.errors import UnknownNameError

__all__ = [
    "LATEST_VLLM",
    "VLLM_CLI_MODULE",
    "VLLM_DTYPE_CHOICES",
    "VLLM_RELEASES",
    "VllmRelease",
    "flags_owned_by_vllm_fields",
    "resolve_vllm_release",
]

#: The module every supported release starts ``vllm serve`` from (its ``vllm`` console script calls the same
#: ``main``); ``python -m`` of it needs no script on PATH, which a venv on a remote host may not put there.
VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"

_COMMON_FLAGS: dict[str, str] = {
    "served_model_name": "--served-model-name",
    "host": "--host",
    "port": "--port",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "dtype": "--dtype",
    "kv_cache_dtype": "--kv-cache-dtype",
    "enforce_eager": "--enforce-eager",
    "block_size": "--block-size",
    "enable_prefix_caching": "--enable-prefix-caching",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "speculative": "--speculative-config",
}

#: Tri-state fields (unset / on / off): every supported release has argparse's ``--no-`` form for them.
_NEGATIVE_FLAGS: dict[str, str] = {
    "enable_prefix_caching": "--no-enable-prefix-caching",
    "enable_chunked_prefill": "--no-enable-chunked-prefill",
}

#: ``--dtype`` choices; the same six in 0.8.5 (arg_utils), 0.11.0 and 0.32.0 (``ModelDType``).
VLLM_DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")

#: ``--block-size`` choices of 0.8.5 and 0.11.0 (``BlockSize``); 0.32.0 takes any integer > 0.
_OLD_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)

#: Spellings of flags a field owns that the tables above do not render: short forms, aliases, the other
#: half of a boolean pair, and 0.26+'s ``--spec-*`` shorthands that write into the speculative config.
_ALIASES: dict[str, str] = {
    "--model": "model_path",
    "-tp": "tensor_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--device-memory-utilization": "gpu_memory_utilization",
    "--no-enforce-eager": "enforce_eager",
    "-sc": "speculative",
    "--spec-method": "speculative.method",
    "--spec-model": "speculative.model",
    "--spec-tokens": "speculative.num_speculative_tokens",
}


@dataclass(frozen=True)
class VllmRelease:
    """The facts dsv4lab needs about one vLLM release's ``vllm serve``."""

    version: str
    #: field -> its flag; a field missing here has no flag in this release.
    flags: Mapping[str, str] = field(repr=False)
    #: graph fields this release takes only as ``--compilation-config`` JSON keys (field -> key).
    compilation_keys: Mapping[str, str] = field(repr=False)
    kv_cache_dtypes: tuple[str, ...] = field(repr=False)
    speculative_methods: tuple[str, ...] = field(repr=False)
    #: the ``--speculative-config`` JSON keys this release's ``SpeculativeConfig`` has, of the ones dsv4lab sets.
    speculative_keys: tuple[str, ...] = field(repr=False)
    #: ``--block-size`` choices; None = any integer >= 1.
    block_sizes: tuple[int, ...] | None = field(repr=False, default=None)
    negative_flags: Mapping[str, str] = field(repr=False, default_factory=lambda: dict(_NEGATIVE_FLAGS))
    dtypes: tuple[str, ...] = field(repr=False, default=VLLM_DTYPE_CHOICES)
    #: vLLM's own default when gpu_memory_utilization is unset (what the memory split starts from).
    default_gpu_memory_utilization: float = 0.9
    #: the V0 engine is still there (``VLLM_USE_V1=0`` selects it); V1 is the default from 0.8 and V0 is
    #: gone in 0.11.
    has_v0_engine: bool = False
    cli_module: str = VLLM_CLI_MODULE

    @property
    def key(self) -> tuple[int, int, int]:
        return _version_key(self.version)

    def flag_for(self, field_name: str) -> str | None:
        return self.flags.get(field_name)

    def accepts(self, field_name: str) -> bool:
        """Whether some flag (or compilation-config key) of this release carries the field."""
        return field_name in self.flags or field_name in self.compilation_keys


_SPEC_KEYS = (
    "method",
    "model",
    "num_speculative_tokens",
    "draft_tensor_parallel_size",
    "prompt_lookup_min",
    "prompt_lookup_max",
)

#: The vLLM releases whose ``vllm serve`` flags dsv4lab renders, oldest first.
VLLM_RELEASES: tuple[VllmRelease, ...] = (
    VllmRelease(
        # V0 and V1 side by side; graph sizes only through the compilation config (whose -O/--compilation-config
        # value is read with ast.literal_eval, so the JSON dsv4lab writes holds only lists of integers);
        # SpeculativeConfig has no enforce_eager. Its SpeculativeMethod literal omits eagle3, which its
        # __post_init__ nevertheless handles (and stdlib dataclasses do not check literals).
        version="0.8.5",
        flags=dict(_COMMON_FLAGS),
        compilation_keys={"cudagraph_capture_sizes": "cudagraph_capture_sizes"},
        kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
        speculative_methods=("ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model"),
        speculative_keys=_SPEC_KEYS,
        block_sizes=_OLD_BLOCK_SIZES,
        has_v0_engine=True,
    ),
    VllmRelease(
        # V1 only; --kv-cache-memory-bytes (new in 0.10.2); --cuda-graph-sizes: one value N means 1, 2, 4 and
        # every 8 up to N, more values are the list itself, so an exact list goes in the compilation config,
        # whose cudagraph_capture_sizes override it.
        version="0.11.0",
        flags={
            **_COMMON_FLAGS,
            "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
            "max_cudagraph_capture_size": "--cuda-graph-sizes",
        },
        compilation_keys={"cudagraph_capture_sizes": "cudagraph_capture_sizes"},
        kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"),
        speculative_methods=(
            "ngram",
            "eagle",
            "eagle3",
            "medusa",
            "mlp_speculator",
            "draft_model",
            "deepseek_mtp",
            "ernie_mtp",
            "qwen3_next_mtp",
            "mimo_mtp",
            "longcat_flash_mtp",
            "mtp",
        ),
        speculative_keys=(*_SPEC_KEYS, "enforce_eager"),
        block_sizes=_OLD_BLOCK_SIZES,
    ),
    VllmRelease(
        # Both graph settings have flags of their own (since 0.12); --cuda-graph-sizes is gone.
        version="0.32.0",
        flags={
            **_COMMON_FLAGS,
            "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
            "cudagraph_capture_sizes": "--cudagraph-capture-sizes",
            "max_cudagraph_capture_size": "--max-cudagraph-capture-size",
        },
        compilation_keys={},
        kv_cache_dtypes=(
            "auto",
            "float16",
            "bfloat16",
            "fp8",
            "fp8_e4m3",
            "fp8_e5m2",
            "fp8_inc",
            "fp8_ds_mla",
            "nvfp4_ds_mla",
            "turboquant_k8v4",
            "turboquant_4bit_nc",
            "turboquant_k3v4_nc",
            "turboquant_3bit_nc",
            "ultraquant_4bit",
            "int4_per_token_head",
            "int8_per_token_head",
            "fp8_per_token_head",
            "nvfp4",
            "nvfp4_4over6",
        ),
        speculative_methods=(
            "ngram",
            "medusa",
            "mlp_speculator",
            "draft_model",
            "suffix",
            "custom_class",
            "eagle",
            "eagle3",
            "extract_hidden_states",
            "deepseek_mtp",
            "dots3_note_mtp",
            "mimo_mtp",
            "mimo_v2_mtp",
            "glm4_moe_mtp",
            "glm4_moe_lite_mtp",
            "glm_ocr_mtp",
            "ernie_mtp",
            "nemotron_h_mtp",
            "exaone_moe_mtp",
            "exaone4_5_mtp",
            "qwen3_next_mtp",
            "qwen4_exp_mtp",
            "qwen3_5_mtp",
            "longcat_flash_mtp",
            "bailing_hybrid_v3_mtp",
            "minimax_m3_mtp",
            "bailing_hybrid_mtp",
            "mtp",
            "kimi_k3_mtp",
            "pangu_ultra_moe_mtp",
            "step3p5_mtp",
            "hy_v3_mtp",
            "hy_v4_mtp",
            "gemma4_mtp",
            "inkling_mtp",
            "glm5_next_mtp",
            "dflash",
            "ngram_gpu",
            "dspark",
        ),
        speculative_keys=(*_SPEC_KEYS, "enforce_eager"),
        default_gpu_memory_utilization=0.92,
    ),
)

#: The newest release in the table: what renders when no version is given.
LATEST_VLLM = VLLM_RELEASES[-1]

#: ``0.32.0``, ``v0.8.5``, ``0.8.5.post1`` (a post release keeps its release's flags), ``0.32.0+cpu`` (what the
#: CPU wheel reports as the ``vllm`` distribution's version).
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?(?:\+[\w.]+)?$")


def _version_key(text: str) -> tuple[int, int, int]:
    m = _VERSION.match(text.strip())
    if not m:
        raise UnknownNameError("vLLM release", text, [r.version for r in VLLM_RELEASES])
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def resolve_vllm_release(version: str | VllmRelease | None = None) -> VllmRelease:
    """The release whose flags to render for ``version`` (None = the newest known); any other version is an
    :class:`~dsv4lab.errors.UnknownNameError` that lists the known ones."""
    if version is None:
        return LATEST_VLLM
    if isinstance(version, VllmRelease):
        return version
    key = _version_key(version)
    for release in VLLM_RELEASES:
        if release.key == key:
            return release
    raise UnknownNameError("vLLM release", version, [r.version for r in VLLM_RELEASES])


def flags_owned_by_vllm_fields() -> dict[str, str]:
    """Every spelling (any release, aliases and ``--no-`` forms included) of a flag a VllmConfig field renders."""
    owned: dict[str, str] = dict(_ALIASES)
    owned["--cuda-graph-sizes"] = "cudagraph_capture_sizes or max_cudagraph_capture_size"
    for release in VLLM_RELEASES:
        for name, flag in release.flags.items():
            owned.setdefault(flag, name)
        for name, flag in release.negative_flags.items():
            owned.setdefault(flag, name)
    return owned
