"""Where GPU time goes: profile a running server and break its trace down by kernel.

The story's structural finding — the sparse-MLA decode attention kernel takes 63% of GPU time on sm_120,
which no GEMM tuning can touch — came from one of these breakdowns. SGLang's ``/start_profile`` and
``/stop_profile`` write a torch-profiler Chrome trace on the server host; this module drives them, fetches
the newest trace and sums kernel time by name and by kind.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import posixpath
import re
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dsv4lab.errors import Interrupted, ProfileError
from dsv4lab.hosts import Host
from dsv4lab.units import REAL, Clock, fmt_ms

__all__ = ["KernelBreakdown", "ProfileError", "kernel_breakdown", "kind_of", "profile_server"]

#: Kernel kinds by name pattern, most specific first (names as torch profiler records them).
_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"mla|attn|attention|flash_fwd|flashinfer.*decode", re.I)),
    ("moe", re.compile(r"moe|expert", re.I)),
    ("allreduce", re.compile(r"nccl|all_?reduce|cross_device_reduce", re.I)),
    ("gemm", re.compile(r"gemm|matmul|w8a8|cutlass|sm\d+_xmma|ampere_|hopper_", re.I)),
)


def kind_of(name: str) -> str:
    """The kind of a kernel by its name (attention, moe, gemm, allreduce, other): the breakdown's rows, which
    read the same across GPU generations whose kernel names differ."""
    for kind, pattern in _KINDS:
        if pattern.search(name):
            return kind
    return "other"


@dataclass(frozen=True)
class KernelBreakdown:
    """Kernel time by name (``kernels``) and by kind (``kinds``), with shares of total GPU time."""

    kernels: pd.DataFrame
    kinds: pd.DataFrame
    total_ms: float
    source: str
    #: The profiled server's clock: a twin's trace is on its modelled clock, a real server's as measured.
    clock: Clock = REAL

    @property
    def gpu_ms(self) -> float:
        """Total GPU kernel time on the reader's clock (the modelled hardware on the twin)."""
        return self.total_ms

    def share(self, kind: str) -> float:
        row = self.kinds[self.kinds["kind"] == kind]
        return float(row["share"].iloc[0]) if len(row) else 0.0

    def top(self) -> tuple[str, float]:
        """The kernel with the most GPU time, and its share."""
        first = self.kernels.iloc[0]
        return str(first["kernel"]), float(first["share"])

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        ms = f"GPU time (ms{', modelled' if self.clock.is_twin else ''})"
        kinds = [
            {"kind": r["kind"], ms: float(r["ms"]), "share": f"{r['share']:.0%}"} for _, r in self.kinds.iterrows()
        ]
        top = [
            {
                "kernel": r["kernel"],
                "kind": r["kind"],
                ms: float(r["ms"]),
                "share": f"{r['share']:.1%}",
            }
            for _, r in self.kernels.head(25).iterrows()
        ]
        name, share = self.top()
        body = hv.p(
            f"{fmt_ms(self.gpu_ms)} of GPU kernel time{self.clock.tag}; the top kernel {name} takes {share:.0%}."
        )
        return hv.card(
            "kernel time",
            body + hv.table(kinds, digits=1) + hv.table(top, max_rows=10, digits=1),
            status=f"{share:.0%} top kernel",
        )

    def to_frame(self) -> pd.DataFrame:
        """Kernel time by name (the ``kernels`` table)."""
        frame: pd.DataFrame = self.kernels.copy()
        return frame


def _load(trace: str | Path | dict[str, Any]) -> dict[str, Any]:
    if isinstance(trace, dict):
        return trace
    path = Path(trace)
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ProfileError(f"cannot read trace {path}: {exc}") from exc
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ProfileError(f"{path} is not a Chrome trace (no traceEvents list)")
    return data


def _regions(events: list[Any], pattern: re.Pattern[str]) -> list[tuple[float, float]]:
    out = []
    for ev in events:
        if (
            isinstance(ev, dict)
            and ev.get("ph") == "X"
            and str(ev.get("cat", "")).lower() in ("cpu_op", "user_annotation", "gpu_user_annotation")
            and pattern.search(str(ev.get("name", "")))
        ):
            start = float(ev.get("ts", 0.0))
            out.append((start, start + float(ev.get("dur", 0.0))))
    return sorted(out)


def kernel_breakdown(trace: str | Path | dict[str, Any], *, within: str | None = None) -> KernelBreakdown:
    """Sum GPU kernel durations (``cat == "kernel"``, complete events) by kernel name and by kind.

    ``within`` (a regex, e.g. ``"decode"``) keeps only kernels that start inside annotated regions of
    that name (``forward_decode`` in SGLang traces), so a decode breakdown is not diluted by prefill.
    """
    data = _load(trace)
    regions = _regions(data["traceEvents"], re.compile(within)) if within else None
    if regions is not None and not regions:
        raise ProfileError(f"the trace has no annotated region matching {within!r}")
    totals: dict[str, float] = {}
    for ev in data["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        if str(ev.get("cat", "")).lower() not in ("kernel", "gpu_op", "cuda_runtime_kernel"):
            continue
        if regions is not None:
            ts = float(ev.get("ts", 0.0))
            if not any(a <= ts < b for a, b in regions):
                continue
        name = str(ev.get("name", "?"))
        totals[name] = totals.get(name, 0.0) + float(ev.get("dur", 0.0)) / 1000.0
    if not totals:
        raise ProfileError("the trace has no GPU kernel events (cat == 'kernel'); was anything running?")
    total = sum(totals.values())
    kernels = pd.DataFrame(
        [{"kernel": k, "kind": kind_of(k), "ms": v, "share": v / total} for k, v in totals.items()]
    ).sort_values("ms", ascending=False, ignore_index=True)
    kinds = (
        kernels.groupby("kind", as_index=False)[["ms", "share"]].sum().sort_values("ms", ascending=False)
    ).reset_index(drop=True)
    source = str(trace) if not isinstance(trace, dict) else "in-memory trace"
    return KernelBreakdown(kernels, kinds, total, source)


def _post(url: str, body: dict[str, Any], timeout_s: float) -> str:
    if not url.startswith(("http://", "https://")):
        raise ProfileError(f"{url}: only http(s) server URLs can be profiled")
    req = urllib.request.Request(  # noqa: S310 - scheme checked above
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - scheme checked above
            return str(resp.read().decode(errors="replace"))
    except OSError as exc:
        raise ProfileError(f"{url}: {exc}") from exc


def _post_quietly(url: str, timeout_s: float) -> None:
    with contextlib.suppress(ProfileError):
        _post(url, {}, timeout_s)


def profile_server(
    url: str,
    host: Host,
    output_dir: str,
    during: Callable[[], object],
    *,
    timeout_s: float = 120.0,
    local_dir: str | None = None,
    within: str | None = None,
) -> KernelBreakdown:
    """Profile while ``during()`` runs load against the server; fetch the newest trace and break it down.

    ``output_dir`` is on the server host (SGLang writes traces there); the trace is copied to ``local_dir``
    (a temporary folder by default) before it is read.
    """
    host.makedirs(output_dir)
    started = time.time()
    _post(f"{url}/start_profile", {"output_dir": output_dir}, timeout_s)
    try:
        during()
    except KeyboardInterrupt as exc:
        # Stop must not wait for the server to write its trace: ask it to stop profiling in the
        # background (a server left profiling slows down and fills its disk) and give control back.
        threading.Thread(target=_post_quietly, args=(f"{url}/stop_profile", timeout_s), daemon=True).start()
        stopped = Interrupted(
            f"profiling of {url}",
            getattr(exc, "partial", None),
            after=exc.after if isinstance(exc, Interrupted) else "",
            elapsed_s=time.time() - started,
            note="the server was asked to stop profiling",
        )
        stopped.places = getattr(exc, "places", [])  # where the load run said its result is kept
        raise stopped from None
    except BaseException:
        _post_quietly(f"{url}/stop_profile", timeout_s)
        raise
    _post(f"{url}/stop_profile", {}, timeout_s)
    deadline = time.monotonic() + timeout_s
    newest = ""
    while time.monotonic() < deadline:
        listing = host.run(
            [
                "find",
                output_dir,
                "-maxdepth",
                "2",
                "-name",
                "*.trace.json*",
                "-newermt",
                f"@{int(started) - 1}",
                "-printf",
                "%T@ %p\\n",
            ],
            timeout_s=30.0,
        ).stdout.split("\n")
        found = sorted((line.split(" ", 1) for line in listing if " " in line), key=lambda p: float(p[0]))
        if found:
            newest = found[-1][1]
            break
        time.sleep(0.5)
    if not newest:
        raise ProfileError(f"no trace appeared in {output_dir} on {host.name} within {timeout_s:.0f} s")
    target_dir = Path(local_dir or tempfile.mkdtemp(prefix="dsv4lab-trace-"))
    target_dir.mkdir(parents=True, exist_ok=True)
    local = target_dir / posixpath.basename(newest)
    host.get(newest, str(local))
    return kernel_breakdown(local, within=within)
