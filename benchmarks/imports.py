"""How long a notebook kernel waits for ``from dsv4lab import plots`` (Altair, vl-convert, jsonschema).

jsonschema imports the optional IRI checker ``rfc3987_syntax`` when it is installed (jupyter-events pulls it
in), and that package compiles a parser grammar at import. ``dsv4lab/__init__`` keeps it out. This measures
the import in fresh processes, with dsv4lab's setting and without it (the peer), alternating, and prints
the medians and their ratio.

    .venv/bin/python benchmarks/imports.py --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

#: The peer: the same imports with the IRI checker left importable (what a plain ``import altair`` does).
PEER = "import rfc3987_syntax; from dsv4lab import plots"
OURS = "from dsv4lab import plots"


def _time(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ours: list[float] = []
    peer: list[float] = []
    for _ in range(args.runs):
        ours.append(_time(OURS))
        peer.append(_time(PEER))
    m_ours, m_peer = statistics.median(ours), statistics.median(peer)
    print(f"from dsv4lab import plots: median {m_ours:.2f} s (min {min(ours):.2f}, max {max(ours):.2f})")
    print(f"with the IRI checker:      median {m_peer:.2f} s (min {min(peer):.2f}, max {max(peer):.2f})")
    print(f"ratio: {m_peer / m_ours:.1f}x faster, {m_peer - m_ours:.1f} s saved per kernel start")


if __name__ == "__main__":
    main()
