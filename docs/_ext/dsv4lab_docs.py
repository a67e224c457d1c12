"""Sphinx directives that write dsv4lab's reference from its source, so a new module or name cannot be left
out of it.

``.. public-module:: dsv4lab.logs`` documents a module's public names (its ``__all__``) that it defines
itself, with autodoc, then links the names it re-exports to where they are documented; ``:recursive:`` does
the same for each module below a package, in file order. ``.. cli-help::`` prints ``dsv4lab VERB --help``
for every verb, from the parser the command line itself builds.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any, cast

import publicapi
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.domains import Domain
from sphinx.environment import BuildEnvironment
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

__all__ = ["CliHelp", "PublicModule", "setup"]


def _module_lines(module: str) -> list[str]:
    """autodoc for the public names ``module`` defines: those in its ``__all__``, and those it leaves out of
    its own ``__all__`` but a package re-exports (``dsv4lab.cli.build_parser``): each name is documented at
    its home, whoever exports it."""
    names = publicapi.public_names()
    lines = [f".. automodule:: {module}"]
    own = [n.name for n in names if n.module == module and n.home == module]
    own += sorted({n.name for n in names if n.home == module and n.kind != "module"} - set(own))
    lines.append(f"   :members: {', '.join(own)}" if own else "   :no-members:")
    lines.append("")
    others = [n for n in names if n.module == module and n.home != module]
    if others:
        refs = ", ".join(f":py:obj:`{n.name} <{n.path}>`" for n in others)
        lines += [f"   Also exported here: {refs}.", ""]
    return lines


class PublicModule(SphinxDirective):
    """Autodoc for one module's public names (``:recursive:``: and every module below it)."""

    required_arguments = 1
    option_spec = {"recursive": directives.flag}  # noqa: RUF012 - docutils' interface

    def run(self) -> list[nodes.Node]:
        root = self.arguments[0]
        modules = [root]
        if "recursive" in self.options:
            modules += [m for m in publicapi.module_names() if m.startswith(f"{root}.") and not m.endswith(".__main__")]
        # `make docs` rebuilds only what changed: a page is read again when these files change
        self.env.note_dependency(__file__)
        self.env.note_dependency(publicapi.__file__)
        for module in modules:
            source = publicapi.source_file(module)
            if source is not None:
                self.env.note_dependency(str(source))
        lines: list[str] = []
        for module in modules:
            if module != root:  # the page's title names the root; each module below it gets a heading
                lines += [module, "-" * len(module), ""]
            lines += _module_lines(module)
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source=f"<public-module {root}>"), container)
        return list(container.children)


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    """argparse wraps help to the terminal's width; the page's is fixed."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


class CliHelp(SphinxDirective):
    """``dsv4lab --help`` and each verb's ``--help`` (sub-verbs too), as literal blocks under headings whose
    anchors are ``cli-dsv4lab-VERB``."""

    def run(self) -> list[nodes.Node]:
        import argparse

        from dsv4lab.cli import bench_args
        from dsv4lab.cli.main import build_parser

        out: list[nodes.Node] = []
        self.env.note_dependency(__file__)
        for module in (build_parser, bench_args.build_parser):
            self.env.note_dependency(sys.modules[module.__module__].__file__ or "")

        def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
            if words == ["dsv4lab", "bench"]:  # the verb hands its arguments to a parser of its own
                parser = bench_args.build_parser()
            with _columns(88):  # the page's code column
                text = parser.format_help()
            name = " ".join(words)
            section = nodes.section(ids=[nodes.make_id(f"cli-{name}")], names=[nodes.fully_normalize_name(name)])
            section += nodes.title(text=name)
            section += nodes.literal_block(text, text, language="text")
            out.append(section)
            for action in parser._actions:  # argparse has no public accessor for subcommands
                if isinstance(action, argparse._SubParsersAction):
                    for verb, sub in action.choices.items():
                        walk(sub, [*words, verb])

        walk(build_parser(), ["dsv4lab"])
        return out


def _resolve_reexport(
    app: Sphinx, env: BuildEnvironment, node: addnodes.pending_xref, contnode: nodes.TextElement
) -> nodes.Element | None:
    """``:func:`dsv4lab.logs.diagnose``` is documented at its home, ``dsv4lab.logs.runs.diagnose``: resolve
    a re-exported path (written in full, or relative to the current module) to the home's entry."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    candidates = [target]
    if node.get("py:module"):
        candidates.append(f"{node['py:module']}.{target}")
    homes = publicapi.reexports()
    for candidate in candidates:
        home = homes.get(candidate)
        if home is not None:
            node["reftarget"] = home
            domain = env.domains["py"]
            builder = app.builder
            resolved = domain.resolve_xref(env, node["refdoc"], builder, node["reftype"], home, node, contnode)
            node["reftarget"] = target
            return resolved
    return None


def _qualify_by_module(app: Sphinx, doctree: nodes.document) -> None:
    """A signature's bare ``Engine`` means the ``Engine`` its own module imports: two public classes share
    the name (``dsv4lab.engines.Engine``, ``dsv4lab.logs.Engine``), and Sphinx's fuzzy search would pick one
    of them at random. Point such a reference at the home of what the module binds, when that is documented."""
    import importlib

    for node in doctree.findall(addnodes.pending_xref):
        target, module = str(node.get("reftarget", "")), node.get("py:module")
        if node.get("refdomain") != "py" or not module or "." in target or not str(module).startswith("dsv4lab"):
            continue
        try:
            obj = getattr(importlib.import_module(str(module)), target, None)
        except ImportError:
            continue
        home = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        if isinstance(obj, type) and home in _public_paths():
            node["reftarget"] = home


def _private_but_real(app: Sphinx, domain: Domain, node: addnodes.pending_xref) -> bool | None:
    """A signature names a private helper or a type variable (``dsv4lab.blocking.T``): real, not broken, and
    left out of the reference on purpose, so no warning. A dsv4lab path that names nothing is still reported."""
    target = str(node.get("reftarget", ""))
    public = target in _public_paths()
    if domain.name == "py" and target.startswith("dsv4lab.") and not public and publicapi.known_name(target):
        return True
    return None


@functools.cache
def _public_paths() -> frozenset[str]:
    names = publicapi.public_names()
    return frozenset({n.path for n in names} | {f"{n.module}.{n.name}" for n in names})


#: Google-style section headers; a docstring with one of these on a line of its own is read as Google style.
GOOGLE_SECTIONS = ("Args:", "Arguments:", "Returns:", "Raises:", "Yields:")


def _google_sections(
    app: Sphinx, what: str, name: str, obj: object, options: dict[str, object], lines: list[str]
) -> None:
    """The few docstrings with an ``Args:`` section (``Lab``, ``ConfigPanel``) are Google style; the rest are
    plain reST, where napoleon would misread a sentence like ``of dsv4lab's: ...`` as a type, so napoleon
    reads only those."""
    if any(line.strip() in GOOGLE_SECTIONS for line in lines):
        from sphinx.ext.napoleon import Config
        from sphinx.ext.napoleon.docstring import GoogleDocstring

        # napoleon's own Config: its napoleon_* settings are not registered, napoleon not being an extension here
        config: Any = Config(napoleon_use_param=True)
        lines[:] = GoogleDocstring(lines, config, app, cast(Any, what), name, obj, options).lines()


def _plain_defaults(
    app: Sphinx, what: str, name: str, obj: object, options: object, signature: str | None, annotation: str | None
) -> tuple[str | None, str | None] | None:
    """A dataclass field with ``default_factory`` shows as ``<factory>``, which Sphinx cannot read as Python
    and then prints the whole signature unformatted: show it as ``...``."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), annotation
    return None


def _relative_paths(app: Sphinx, doctree: nodes.document) -> None:
    """A constant whose value is a path in the package shows the path of the checkout that built the docs;
    show it relative to the repository instead."""
    root = f"{publicapi.ROOT}/"
    for text in list(doctree.findall(nodes.Text)):
        if root in text and text.parent is not None:
            text.parent.replace(text, nodes.Text(str(text).replace(root, "")))


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("public-module", PublicModule)
    app.add_directive("cli-help", CliHelp)
    app.connect("doctree-read", _qualify_by_module)
    app.connect("missing-reference", _resolve_reexport)
    app.connect("warn-missing-reference", _private_but_real)
    app.connect("autodoc-process-docstring", _google_sections)
    app.connect("autodoc-process-signature", _plain_defaults)
    app.connect("doctree-read", _relative_paths)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
