#!/usr/bin/env python3
"""The package's import graph by layer folder: a picture (SVG) and a check that no arrow points up.

Reads every module's imports (function-level ones included) with ``ast``, folds them into the layer folders
of ``pyproject.toml``'s import-linter ``layers`` contract (the base modules as one box), and draws the boxes
top to bottom in the contract's order with an arrow for every folder that imports another. An arrow that
points up (a lower layer importing a higher one) is drawn red and listed; so is any cycle between folders.

    .venv/bin/python tools/import_graph.py                 # writes import-graph.svg, prints the edges
    .venv/bin/python tools/import_graph.py --out FILE.svg  # elsewhere

Exit status 1 when an arrow points up or folders import each other in a cycle.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dsv4lab"


def layers() -> list[list[str]]:
    """The layers contract's modules, top to bottom (each a list of sibling modules)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for contract in data["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers":
            return [[m.strip() for m in layer.replace(":", "|").split("|")] for layer in contract["layers"]]
    raise SystemExit("no layers contract in pyproject.toml")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterable[str]:
    """The dsv4lab modules ``path`` imports, at any depth in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dsv4lab"):
            yield node.module
            for alias in node.names:  # from dsv4lab import plots
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("dsv4lab"))


def box_of(module: str, boxes: dict[str, str]) -> str | None:
    """The layer box a module belongs to (the longest contract module that contains it)."""
    best = None
    for name, box in boxes.items():
        if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[0])):
            best = (name, box)
    return None if best is None else best[1]


def graph() -> tuple[list[list[str]], set[tuple[str, str]]]:
    """The boxes by layer, and the (importer box, imported box) pairs."""
    order = layers()
    base = [m for m in order[-2] + order[-1]]  # the flat base modules and errors: one box
    shown = [*order[:-2], ["base"]]
    boxes = {m: m.removeprefix("dsv4lab.") for layer in order[:-2] for m in layer}
    boxes.update({m: "base" for m in base})
    edges: set[tuple[str, str]] = set()
    for path in PACKAGE.rglob("*.py"):
        src = box_of(module_name(path), boxes)
        if src is None:
            continue  # the package root and __main__: the public facade and the entry point
        for target in imports(path):
            dst = box_of(target, boxes)
            if dst is not None and dst != src:
                edges.add((src, dst))
    return [[boxes.get(m, m) if m != "base" else "base" for m in layer] for layer in shown], edges


def problems(shown: list[list[str]], edges: set[tuple[str, str]]) -> list[str]:
    rank = {box: i for i, layer in enumerate(shown) for box in layer}
    out = [f"arrow up: {a} imports {b}" for a, b in sorted(edges) if rank[b] <= rank[a]]
    out += [f"cycle: {a} <-> {b}" for a, b in sorted(edges) if (b, a) in edges and a < b]
    return out


def svg(shown: list[list[str]], edges: set[tuple[str, str]]) -> str:
    """Boxes in rows (a layer a row), arrows from importer to imported, red where one points up."""
    w, h, gap_x, gap_y = 150, 34, 30, 46
    width = max(len(layer) for layer in shown) * (w + gap_x) + gap_x
    pos: dict[str, tuple[float, float]] = {}
    for i, layer in enumerate(shown):
        row = len(layer) * (w + gap_x) - gap_x
        for j, box in enumerate(layer):
            pos[box] = ((width - row) / 2 + j * (w + gap_x), 20 + i * (h + gap_y))
    height = 20 + len(shown) * (h + gap_y)
    bad = {tuple(p.split(": ", 1)[1].replace(" imports ", "|").split("|")) for p in problems(shown, edges)}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        'aria-label="dsv4lab import graph by layer folder">',
        "<title>dsv4lab import graph by layer folder: arrows point from importer to imported</title>",
        '<defs><marker id="a" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
        '<path d="M0,0 L8,4 L0,8 z" fill="#57606a"/></marker></defs>',
    ]
    for a, b in sorted(edges):
        (x1, y1), (x2, y2) = pos[a], pos[b]
        colour = "#cf222e" if (a, b) in bad else "#8c959f"
        parts.append(
            f'<line x1="{x1 + w / 2:.0f}" y1="{y1 + h:.0f}" x2="{x2 + w / 2:.0f}" y2="{y2:.0f}" '
            f'stroke="{colour}" stroke-width="1.2" marker-end="url(#a)"/>'
        )
    for box, (x, y) in pos.items():
        parts.append(f'<rect x="{x:.0f}" y="{y:.0f}" width="{w}" height="{h}" rx="4" fill="#ddf4ff" stroke="#0969da"/>')
        label = "base modules" if box == "base" else box + "/"
        parts.append(
            f'<text x="{x + w / 2:.0f}" y="{y + h / 2 + 5:.0f}" text-anchor="middle" '
            f'font-family="sans-serif" font-size="13">{label}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", default="import-graph.svg", help="where to write the SVG")
    args = ap.parse_args(argv)
    shown, edges = graph()
    Path(args.out).write_text(svg(shown, edges), encoding="utf-8")
    for layer in shown:
        print(" | ".join(layer))
    print(f"{len(edges)} folder-to-folder imports; picture: {args.out}")
    found = problems(shown, edges)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
