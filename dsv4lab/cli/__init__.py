"""The command line: ``dsv4lab`` and its verbs (``main``), ``dsv4lab bench`` (``bench``, ``bench_args``), and
the argparse flavour they share (``argparsing``). The top layer: it may import anything, nothing imports it.
"""

from __future__ import annotations

from dsv4lab.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
