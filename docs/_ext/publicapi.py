"""dsv4lab's public names, read from the source with :mod:`ast` (nothing is imported).

A public name is one listed in a module's ``__all__``. Each has one *home*: the module whose source defines
it (a ``def``, a ``class`` or an assignment at the top level); every other ``__all__`` that lists it
re-exports it through ``from ... import``. The reference documents a name once, at its home, and links the
re-exports there; ``tests/test_docs.py`` checks, with the same walk, that every public name has a docstring
and an entry in the built reference.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = [
    "PACKAGE",
    "ROOT",
    "PublicName",
    "home_of",
    "known_name",
    "module_names",
    "modules_with_all",
    "public_names",
    "reexports",
    "source_file",
]

#: The package documented.
PACKAGE = "dsv4lab"
#: The repository: the package's folder is beside ``docs/``.
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class PublicName:
    """One entry of one module's ``__all__``, with where it is defined."""

    module: str  # the module whose __all__ lists it
    name: str
    home: str  # the module that defines it
    kind: str  # "function", "class", "data" (an assignment) or "module"
    documented: bool  # a docstring, or a ``#:`` comment above an assignment

    @property
    def path(self) -> str:
        """The dotted path of the definition: its anchor in the reference and its inventory entry."""
        return f"{self.home}.{self.name}" if self.kind != "module" else self.home


def source_file(module: str) -> Path | None:
    """The file a module of the package is read from (None for a name that is not one)."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@cache
def module_names() -> tuple[str, ...]:
    """Every module of the package, in file order (a package before its modules)."""
    out = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "__pycache__" not in parts:
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return tuple(out)


@cache
def _source(module: str) -> tuple[ast.Module, tuple[str, ...]]:
    path = source_file(module)
    if path is None:
        raise LookupError(f"no source for {module}")
    text = path.read_text(encoding="utf-8")
    return ast.parse(text, filename=str(path)), tuple(text.splitlines())


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Top-level statements, with the bodies of ``if TYPE_CHECKING:`` (the imports type checkers see) and of
    ``try`` blocks flattened in."""
    out: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            out.extend(node.body)
        else:
            out.append(node)
    return out


def _targets(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        names = []
        for target in node.targets:
            elts = target.elts if isinstance(target, ast.Tuple) else [target]
            names += [e.id for e in elts if isinstance(e, ast.Name)]
        return names
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _all_of(module: str) -> list[str] | None:
    for node in _source(module)[0].body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and "__all__" in _targets(node) and node.value:
            value = ast.literal_eval(node.value)
            return [str(name) for name in value]
    return None


@cache
def modules_with_all() -> tuple[str, ...]:
    """The modules that declare ``__all__`` (one without it has no public names of its own)."""
    return tuple(m for m in module_names() if _all_of(m) is not None)


def _is_docstring(node: ast.stmt | None) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _wrapped_function(node: ast.stmt) -> str | None:
    """``run = stoppable(...)(run_async)``: the function a decorator call wraps at module level."""
    value = getattr(node, "value", None)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Call) and len(value.args) == 1:
        arg = value.args[0]
        if isinstance(arg, ast.Name):
            return arg.id
    return None


def _definition(module: str, name: str) -> tuple[str, bool] | None:
    """(kind, documented) when ``module`` itself defines ``name``."""
    tree, lines = _source(module)
    body = _top_level(tree)
    for i, node in enumerate(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            return kind, bool(ast.get_docstring(node))
        if name in _targets(node):
            comment = node.lineno >= 2 and lines[node.lineno - 2].lstrip().startswith("#:")
            documented = comment or _is_docstring(body[i + 1] if i + 1 < len(body) else None)
            wrapped = _wrapped_function(node)
            if wrapped is not None:  # a function made by a decorator: functools.wraps keeps the docstring
                inner = _definition(module, wrapped)
                return "function", documented or bool(inner and inner[1])
            return "data", documented
    return None


def _imported_from(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    path = source_file(module)
    parts = module.split(".")
    base = parts if path is not None and path.name == "__init__.py" else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


@cache
def home_of(module: str, name: str) -> tuple[str, str, bool]:
    """(home module, kind, documented) of ``name`` as ``module`` sees it, following ``from ... import``."""
    found = _definition(module, name)
    if found is not None:
        return (module, *found)
    for node in _top_level(_source(module)[0]):
        if not isinstance(node, ast.ImportFrom):
            continue
        for alias in node.names:
            if (alias.asname or alias.name) != name:
                continue
            source = _imported_from(module, node)
            submodule = f"{source}.{alias.name}"
            if source_file(submodule) is not None:  # a module imported by name
                return submodule, "module", bool(ast.get_docstring(_source(submodule)[0]))
            if source.split(".")[0] != PACKAGE:
                raise LookupError(f"{module}.{name} comes from outside {PACKAGE} ({source})")
            return home_of(source, alias.name)
    raise LookupError(f"{module} neither defines nor imports {name!r}")


@cache
def public_names() -> tuple[PublicName, ...]:
    """Every entry of every ``__all__`` in the package."""
    out = []
    for module in modules_with_all():
        for name in _all_of(module) or []:
            home, kind, documented = home_of(module, name)
            out.append(PublicName(module, name, home, kind, documented))
    return tuple(out)


@cache
def reexports() -> dict[str, str]:
    """Each public path that is a re-export (``dsv4lab.logs.diagnose``) -> the path it is documented at."""
    return {f"{n.module}.{n.name}": n.path for n in public_names() if n.home != n.module}


def known_name(path: str) -> bool:
    """Whether a dotted path names a module of the package or something one defines or imports (a private
    helper, or a type variable in a signature), as opposed to a name that does not exist."""
    modules = set(module_names())
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module in modules:
            if i == len(parts):
                return True
            try:
                home_of(module, parts[i])
            except LookupError:
                return False
            return True
    return False
