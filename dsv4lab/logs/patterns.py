"""Line shapes of SGLang 0.4.10-0.5.23 and vLLM logs, compiled once, plus unit conversion.

Everything here is derived from the formats in ``shared/reference/sglang.md`` (f-string shapes) and from
vLLM's own startup lines. Regexes are compiled at import and only tried on a line after a cheap substring
test picked it, so a line that is none of these (most of a serving log) costs a few ``in`` checks.
Patterns do not anchor on rank tags (TP=1 logs have none) and tolerate a line cut anywhere after the
figures they need.
"""

from __future__ import annotations

import re

__all__ = [
    "ANSI",
    "GIB_UNITS",
    "SHUTDOWN_SIGNAL",
    "SglangPrefix",
    "split_sglang_prefix",
    "to_gib",
]

#: ANSI colour / cursor sequences (``\x1b[32m``, ``\x1b[2K``) that some terminals and tqdm leave in logs.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")

#: A server saying it was sent a shutdown signal (vLLM's EngineCore: "[shutdown] EngineCore: trigger received
#: signal=SIGTERM"). Stopped during start-up, vLLM then logs its workers' initialisation failing: errors
#: after this line are the stop's consequences, not a crash of its own.
SHUTDOWN_SIGNAL = re.compile(r"received signal[ =:]*SIG(?:TERM|INT)\b")

#: Multipliers to GiB. SGLang and vLLM print "GB" for bytes / 2**30, so GB is GiB here.
GIB_UNITS: dict[str, float] = {
    "B": 1 / 2**30,
    "BYTES": 1 / 2**30,
    "KB": 1 / 2**20,
    "KIB": 1 / 2**20,
    "MB": 1 / 2**10,
    "MIB": 1 / 2**10,
    "GB": 1.0,
    "GIB": 1.0,
    "TB": 2.0**10,
    "TIB": 2.0**10,
}

_SIZE = re.compile(r"^\s*(-?[\d.]+)\s*([KMGT]i?B|bytes|B)?", re.IGNORECASE)


def to_gib(text: str | None, default_unit: str = "GiB") -> float | None:
    """``"448.00 MiB"`` -> 0.4375; ``"123 bytes"`` -> bytes / 2**30; a cut-off unit uses ``default_unit``.

    PyTorch prints sizes with ``format_size`` (bytes, KiB, MiB, GiB); engines print "GB" meaning GiB. A
    log cut right after the number (``total capacity of 95.00``) keeps the number with ``default_unit``,
    which for a GPU capacity is GiB in every PyTorch release.
    """
    if text is None:
        return None
    m = _SIZE.match(text)
    if not m:
        return None
    try:
        value = float(m.group(1))
    except ValueError:
        return None
    unit = (m.group(2) or default_unit).upper()
    return value * GIB_UNITS.get(unit, 1.0)


# -- line prefixes -------------------------------------------------------------------------------------------


#: ``(timestamp, tp_rank, dp_rank, message)`` of an SGLang line.
SglangPrefix = tuple[str, "int | None", "int | None", str]


#: Rank-tag strings repeat on every line of a rank (" DP0 TP0"); parsing each distinct one once is cheaper.
_TAG_CACHE: dict[str, tuple[int | None, int | None]] = {}


def parse_tags(tags: str) -> tuple[int | None, int | None]:
    """(TP rank, DP rank) of SGLang's rank tags (`` DP1 TP4``); None where a tag is absent."""
    rank: int | None = None
    dp: int | None = None
    for tag in tags.split():
        if tag[:2] == "TP":
            if tag[2:].isdigit():
                rank = int(tag[2:])
        elif tag[:2] == "DP" and tag[2:].isdigit():
            dp = int(tag[2:])
    return rank, dp


def split_sglang_prefix(line: str) -> SglangPrefix | None:
    """Parse SGLang's ``[ts{ tags}] message`` prefix with string operations (no regex: it is hot).

    Tags are ``DPn``, ``PPn``, ``ATTN_CPn``, ``MOE_DPn``, ``TPn``, ``EPn`` in any subset; TP=1 logs have
    none. ``SGLANG_LOG_MS`` adds ``.mmm`` after the seconds. Returns None for other lines.
    """
    if line[5:6] != "-" or line[:1] != "[":
        return None
    end = line.find("]", 20, 160)
    if end < 0:
        return None
    if end > 20:
        tags = line[20:end]
        ranks = _TAG_CACHE.get(tags)
        if ranks is None:
            ranks = parse_tags(tags)
            if len(_TAG_CACHE) < 4096:
                _TAG_CACHE[tags] = ranks
        rank, dp = ranks
    else:
        rank = dp = None
    if line[end + 1 : end + 2] == " ":
        return line[1:20], rank, dp, line[end + 2 :]
    return line[1:20], rank, dp, line[end + 1 :]


#: A line that is only the start of an SGLang timestamp (a log cut mid-prefix): ``[2025-11-30 1``.
PARTIAL_PREFIX = re.compile(r"^\[(\d{4}-[\d\- :.]*)$")

#: SGLang before 0.4 (and its router era): ``[23:17:01 TP7] msg`` (time only), ``[gpu_id=0] msg``,
#: ``[rank=1] msg``. Issue threads still carry them, so they are read like the modern prefix.
OLD_SGLANG_PREFIX = re.compile(
    r"^\[(?:(?P<time>\d\d:\d\d:\d\d)(?P<tags>(?: [A-Z_]+\d+)*)|gpu_id=(?P<gpu>\d+)|rank=(?P<rank>\d+)"
    r"|(?P<only>[A-Z_]+\d+(?: [A-Z_]+\d+)*))\] ?(?P<msg>.*)$",
    re.DOTALL,
)
#: An engine line behind a wrapper nobody configured for (journald, a log viewer's borders, a cloud export,
#: a launcher's own logger): vLLM's tag or level+timestamp, or SGLang's full timestamp, anywhere in a line.
EMBEDDED = re.compile(
    r"\((?:[^()]{1,80}? pid=\d+[^()]{0,40})\) (?:\[[^\]\s]{1,40}\] )?"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d "
    r"|(?<![\w(])(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\]"
    r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?(?: [A-Z_]+\d+)*\] "
)
#: A frame or an exception line behind such a wrapper.
FRAME_ANY = re.compile(r'File "(?P<file>[^"]*)", line \d+,? in (?P<func>[\w<>.]+)')
EXCEPTION_ANY = re.compile(r"(?:^|\s)((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?:\(\w+\))?: .*)$")

#: vLLM: ``(EngineCore_DP0 pid=441) INFO 12-31 14:54:54 [gpu_model_runner.py:3341] msg`` and the older
#: ``INFO 12-19 22:58:41 model_runner.py:1535] msg`` (no brackets around the source, no process tag).
#: Ray nests tags (``(RayWorkerProc pid=1) (Worker_DP0_TP0 pid=1) INFO ...``): the last tag names the worker.
#: ``VLLM_LOGGING_PREFIX`` (e.g. ``[Stage-0] ``) may sit between the tag and the level.
VLLM_PREFIX = re.compile(
    r"^(?:\((?P<proc>[^()]{1,80}?)\) )*(?:\[[^\]\s]{1,40}\] )?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) "
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? \[?(?P<src>[^\]\s]{1,120})\] ?(?P<msg>.*)$",
    re.DOTALL,
)
#: A worker's own output without the logging format (print, tqdm): ``(Worker_TP2 pid=99) text``.
VLLM_PROC_ONLY = re.compile(
    r"^(?:\([^()]{1,80}? pid=\d+[^()]{0,40}\) )*\((?P<proc>[^()]{1,80}? pid=\d+[^()]{0,40})\) (?P<msg>.*)$", re.DOTALL
)
#: Ray's log dedup suffix: the line stands for N copies from other workers and arrives seconds late.
RAY_REPEATED = re.compile(r" \[repeated (\d+)x across cluster\]")
#: torch's C++ (glog-style) records behind ``[rankN]:``: ``[E1030 15:32:32.970893361 ProcessGroupNCCL.cpp:2055] msg``.
GLOG_LEVEL = re.compile(r"^\[([EWIF])\d{4} [\d:.]+ [^\]]*\] ")
#: torchrun / elastic prefix: ``[rank0]: text``.
RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?(?P<msg>.*)$", re.DOTALL)
VLLM_PROC_TP = re.compile(r"(?:TP|rank=)(\d+)")
VLLM_PROC_DP = re.compile(r"DP(\d+)")
#: Wrappers some CI systems and container runtimes put in front of every line.
FOREIGN_WRAPPER = re.compile(r"^(?:\[\d{4}-\d\d-\d\dT[\d:.]+Z?\] |[\w.-]{1,40}\s{1,8}\| )")

# -- SGLang startup lines ------------------------------------------------------------------------------------

WEIGHT_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) ?GB")
WEIGHT_END = re.compile(
    r"Load weight end\.\s*(?:elapsed=(?P<el>[\d.]+) s, )?(?:type=(?P<cls>\w+), )?(?P<mid>.*?)"
    r"avail mem=(?P<avail>[\d.]+) ?GB(?:, mem usage=(?P<use>[\d.]+) ?GB)?"
)
WEIGHT_DTYPE = re.compile(r"dtype=([\w.]+)")
WEIGHT_QUANT = re.compile(r"quant=([^,]+(?:, (?:bits|fmt)=[^,]+)?)")
KV_ALLOC = re.compile(
    r"(?:(?P<label>[\w-]+(?: [\w-]+)?) )?KV [Cc]ache (?P<how>is allocated|allocated|VA upper bound)\.\s*"
    r"(?:dtype: (?P<dtype>[^,\s]+), )?#tokens: (?P<tokens>\d+)"
    r"(?:, (?:K size: (?P<k>[\d.]+) ?GB, V size: (?P<v>[\d.]+) ?GB|KV size: (?P<kv>[\d.]+) ?GB))?"
)
POOL_END = re.compile(r"Memory pool end\. avail mem=([\d.]+) ?GB")
CAPTURE_OLD = re.compile(
    r"Capture (?P<role>draft extend |draft |piecewise )?(?:cuda|cpu|npu|musa|CUDA) graph (?P<stage>begin|end)\b"
)
CAPTURE_NEW = re.compile(
    r"Capture (?P<role>target|draft) (?P<graph>prefill|decode|verify|extend) CUDA graph (?P<stage>begin|end)\b"
)
#: Any other draft capture line (0.5.23's ``Capture Frozen-KV MTP draft cuda graph begin.``, ``Capture UNO tree
#: draft CUDA graph begin. ...``): the speculative workers' own begin/end lines all say "draft" and "graph".
CAPTURE_DRAFT_ANY = re.compile(
    r"Capture \b.{0,40}?\bdraft\b.{0,20}? (?:cuda|CUDA|npu|cpu) graph (?P<stage>begin|end)\b"
)
CAPTURE_BS = re.compile(r"Capture (?:cuda|cpu) graph (?P<what>bs|num tokens) \[([\d, ]*)\]?")
AVAIL = re.compile(r"avail[ _]mem=([\d.]+) ?GB")
USAGE = re.compile(r"mem usage=([\d.]+) ?GB")
ELAPSED = re.compile(r"(?:elapsed=|Time elapsed: )([\d.]+) ?s")
BS_LIST = re.compile(r"\bbs=\[([\d, ]*)\]")
BACKEND = re.compile(r"backend=(\w+)")
TQDM_COUNT = re.compile(r"\|\s*(\d+)/(\d+)\b")
TQDM_BS = re.compile(r"\(bs=(\d+)")
KEY_NUM = re.compile(r"(\w+)=(-?[\d.]+)")
DIST_END_USAGE = re.compile(r"mem usage=([\d.]+) ?GB")
PROFILED_VALUE = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (-?\d+)")
FP8_TUNED = re.compile(r"Using configuration from (?P<path>.+?) for (?P<what>W8A8 Block FP8 kernel|MoE layer)")
FP8_DEFAULT = re.compile(
    r"Using default (?P<what>W8A8 Block FP8 kernel|MoE kernel|MoE) config(?:.*?Config file not found at (?P<path>\S+))?"
)

# -- requests ------------------------------------------------------------------------------------------------

#: ``PhaseChange.what`` of the first HTTP request served after the ready line.
REQUEST_SERVED = "request served"


def is_request(msg: str) -> bool:
    """A uvicorn access line of a POST (``INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 200``): both
    engines serve inference (generate, completions, chat, tokenize) on POST routes, while GETs are probes
    and info (health, metrics, models, version, load, ping), which a watcher polls on an idle server."""
    return '"POST /' in msg and " HTTP/" in msg


# -- errors --------------------------------------------------------------------------------------------------

#: An exception line: a (dotted) class name ending like an exception, then ``:`` or the end of the line.
#: Class names are CamelCase, so code lines such as ``self.comm: ncclComm_t = ...`` do not match.
EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Exit|Interrupt|Failed|Failure|Warning)(?:\(\w+\))?"
    r"(?::\s?(?P<msg>.*)|\s*$)",
    re.DOTALL,
)
#: A traceback frame; Python's faulthandler dump writes the same without the comma before ``in``.
FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+,? in (?P<func>[\w<>.]+)')
#: PyTorch's allocator message: ``... Tried to allocate X. GPU N has a total capacity of T of which F is free``
#: (2.0+) or, before 2.0 (and torch_npu / XPU), ``... Tried to allocate X (GPU N; T total capacity; A already
#: allocated; F free; ...)``.
OOM = re.compile(
    r"(?:CUDA|HIP|cuda|hip|XPU|NPU) (?:error: )?out of memory"
    r"(?:\. Tried to allocate (?P<tried>[\d.]+ ?(?:[KMGT]i?B|bytes|B)?)"
    r"(?:\. GPU (?P<gpu>\d+) has a total capac(?:i)?ty of (?P<total>[\d.]+(?: ?(?:[KMGT]i?B|bytes))?)"
    r"(?: of which (?P<free>[\d.]+ ?(?:[KMGT]i?B|bytes)) is free)?"
    r"| \((?:GPU|NPU|XPU) (?P<gpu_old>\d+); (?P<total_old>[\d.]+ ?[KMGT]i?B) "
    r"total capacity;(?: (?P<alloc_old>[\d.]+ ?[KMGT]i?B) already allocated;)?"
    r"(?: (?P<free_old>[\d.]+ ?[KMGT]i?B) free;)?)?)?"
)
OOM_ALLOCATED = re.compile(r"(?P<v>[\d.]+ ?(?:[KMGT]i?B|bytes)) is allocated by PyTorch")
OOM_PRIVATE = re.compile(r"with (?P<v>[\d.]+ ?(?:[KMGT]i?B|bytes)) allocated in private pools")
OOM_RESERVED = re.compile(r"(?P<v>[\d.]+ ?(?:[KMGT]i?B|bytes)) is reserved by PyTorch but unallocated")
RAISE_ABOVE = re.compile(r"above (\d?\.\d+)")
MIN_VIABLE = re.compile(r"minimum viable = [^=]*= ?(\d?\.\d+)")
CURRENT_FRACTION = re.compile(r"mem_fraction_static=(\d?\.\d+)")
EXIT_CODE = re.compile(r"exit code:? (-?\d+)", re.IGNORECASE)

# -- vLLM lines ----------------------------------------------------------------------------------------------

VLLM_WEIGHTS = re.compile(
    r"(?:Model loading|Loading model weights) took ([\d.]+) ?(GiB|GB|MiB)(?: memory)?(?: and ([\d.]+) s)?"
)
VLLM_KV_MEM = re.compile(r"Available KV cache memory: (-?[\d.]+) ?(GiB|GB|MiB)")
VLLM_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
VLLM_BLOCKS = re.compile(r"# (?:GPU|cuda|CUDA) blocks: (\d+)")
VLLM_PROFILE_TOTAL = re.compile(
    r"total_gpu_memory \(([\d.]+) ?GiB\) x gpu_memory_utilization \(([\d.]+)\) = ([\d.]+) ?GiB"
)
VLLM_PROFILE_SPLIT = re.compile(
    r"model weights take ([\d.]+) ?GiB; non_torch_memory takes ([\d.]+) ?GiB; "
    r"PyTorch activation peak memory takes ([\d.]+) ?GiB; "
    r"the rest of the memory reserved for KV Cache is (-?[\d.]+) ?GiB"
)
VLLM_GRAPH_DONE = re.compile(r"Graph capturing finished in ([\d.]+) secs?(?:, took (-?[\d.]+) ?(GiB|MiB|GB))?")
VLLM_FREE_ON_START = re.compile(
    r"(?:Free memory on device(?: [\w:]+)?|Available memory on node \d+) \(([\d.]+)/([\d.]+) GiB\) on startup"
)
#: vLLM's CPU worker refusing a KV budget larger than the NUMA node has available (free, total, requested).
VLLM_KV_SPACE = re.compile(
    r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than requested "
    r"memory for kv \(([\d.]+)"
)
#: vLLM's refusal of a KV cache that cannot hold one request of ``max_model_len`` tokens (V1's
#: ``_check_enough_kv_cache_memory``): the length, the GiB one request needs, the GiB there are, and vLLM's
#: estimate of the longest length that fits when it gives one.
VLLM_MAX_SEQ_LEN = re.compile(
    r"max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the available KV "
    r"cache memory \((?P<have>[\d.]+) GiB\)(?:.*?estimated maximum model length is (?P<est>\d+))?",
    re.DOTALL,
)
#: vLLM's wrappers name the worker method that raised: V0 multiproc and Ray workers.
METHOD = re.compile(r"(?:while processing method|[Ee]rror executing method) '?(\w+)'?")
VLLM_STATS = re.compile(
    r"Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs?,.*?(?:Waiting|Pending): (\d+) reqs?"
    r"(?:,.*?GPU KV cache usage: ([\d.]+)%)?"
)
VLLM_UTIL = re.compile(r"gpu_memory_utilization['\"]?[:=] ?\(?([\d.]+)")
