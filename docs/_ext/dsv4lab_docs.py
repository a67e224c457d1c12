"""Sphinx directives that write dsv4lab's reference from its source, so a new module or name cannot be left
out of it.

``.. public-module:: dsv4lab.logs`` documents a module's public names (its ``__all__``) that it defines
itself, with autodoc, then links the names it re-exports to where they are documented; ``:recursive:`` does
the same for each module below a package, in file order. ``.. cli-help::`` prints ``dsv4lab VERB --help``
for every verb, from the parser the command line itself builds.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import publicapi
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.domains import Domain
from sphinx.environment import BuildEnvironment
from sphinx.util.docutils import SphinxDirective

__all__ = ["CliHelp", "PublicModule", "setup"]


def _module_lines(module: str) -> list[str]:
    names = [n for n in publicapi.public_names() if n.module == module]
    lines = [f".. automodule:: {module}"]
    if module not in publicapi.modules_with_all():
        return [*lines, "   :no-members:", ""]
    own = [n.name for n in names if n.home == module]
    lines.append(f"   :members: {', '.join(own)}" if own else "   :no-members:")
    lines.append("")
    others = [n for n in names if n.home != module]
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
        lines: list[str] = []
        for module in modules:
            lines += _module_lines(module)
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=f"<public-module {root}>"), self.content_offset, container)
        return container.children


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
    """``dsv4lab --help`` and each verb's ``--help`` (sub-verbs too), as literal blocks under headings."""

    def run(self) -> list[nodes.Node]:
        import argparse

        from dsv4lab.cli.main import build_parser

        out: list[nodes.Node] = []

        def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
            with _columns(100):
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


def _private_but_real(app: Sphinx, domain: Domain, node: addnodes.pending_xref) -> bool | None:
    """A signature names a private helper or a type variable (``dsv4lab.blocking.T``): real, not broken, and
    left out of the reference on purpose, so no warning. A dsv4lab path that names nothing is still reported."""
    target = str(node.get("reftarget", ""))
    if domain.name == "py" and target.startswith("dsv4lab.") and publicapi.known_name(target):
        return True
    return None


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

        converted = GoogleDocstring(lines, Config(napoleon_use_param=True), app, what, name, obj, options).lines()
        lines[:] = converted


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("public-module", PublicModule)
    app.add_directive("cli-help", CliHelp)
    app.connect("missing-reference", _resolve_reexport)
    app.connect("warn-missing-reference", _private_but_real)
    app.connect("autodoc-process-docstring", _google_sections)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
