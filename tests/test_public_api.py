"""The public surface: what ``import dsv4lab`` offers, that nothing hides a module, and that every
import is a declared dependency."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import pkgutil
import re
import sys
import types
from pathlib import Path

import pytest

import dsv4lab
from dsv4lab import errors

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dsv4lab", "dsv4lab.bench", "dsv4lab.hosts", "dsv4lab.logs", "dsv4lab.plots", "dsv4lab.twin")


def test_all_is_sorted_complete_and_resolves() -> None:
    names = list(dsv4lab.__all__)
    assert names == sorted(names)
    public = {
        n
        for n in dir(dsv4lab)
        if not n.startswith("_") and not isinstance(getattr(dsv4lab, n), types.ModuleType)  # submodules
    } - {"annotations", "TYPE_CHECKING", "Any"}
    assert public <= set(names), f"public but not in __all__: {public - set(names)}"
    for name in names:
        assert getattr(dsv4lab, name) is not None


def test_import_is_light() -> None:
    """The twin and the CLI import the package; the notebook API loads on first use."""
    code = "import sys, dsv4lab; print(sorted(m for m in ('pandas', 'aiohttp', 'paramiko') if m in sys.modules))"
    out = __import__("subprocess").run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_shadowed_by_a_function(package: str) -> None:
    pkg = importlib.import_module(package)
    for name in getattr(pkg, "__all__", ()):
        getattr(pkg, name)
    for info in pkgutil.iter_modules(pkg.__path__):
        if hasattr(pkg, info.name):
            value = getattr(pkg, info.name)
            assert isinstance(value, types.ModuleType), (
                f"{package}.{info.name} is a module but {package}.{info.name} resolves to {value!r}"
            )


def _declared() -> set[str]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = data["project"]["dependencies"]
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def test_every_imported_package_is_a_declared_dependency() -> None:
    declared = _declared()
    dists = importlib.metadata.packages_distributions()
    missing: dict[str, set[str]] = {}
    for path in (ROOT / "dsv4lab").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if top in sys.stdlib_module_names or top in ("dsv4lab", "tomli"):
                    continue  # tomli: Python 3.10 only (declared with a marker)
                names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if not names & declared:
                    missing.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject dependencies: {missing}"


def test_every_error_has_an_exit_code_and_connection_failures_are_not_usage_errors() -> None:
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.DSV4LabError)]
    assert len(classes) >= 15
    for cls in classes:
        assert isinstance(cls.exit_code, int) and cls.exit_code >= 1
        assert cls.__name__ in (errors.__doc__ or ""), f"{cls.__name__} is missing from the tree in errors.py"
    assert errors.HostConnectionError.exit_code != errors.ConfigError.exit_code
    assert errors.exit_code_for(errors.Interrupted("x")) == 130
    assert errors.exit_code_for(RuntimeError()) == 1


#: Functions whose ``**`` catch config-field overrides by name (validated by name, not passed through).
_OVERRIDES = {"Lab.launch", "Lab.config", "Lab.preflight", "Lab.suggest", "Lab.launch_ab"}


def test_the_notebook_api_has_explicit_keywords() -> None:
    from dsv4lab import bench
    from dsv4lab.notebook.lab import Lab
    from dsv4lab.notebook.server import Server

    callables: list[tuple[str, object]] = [(n, getattr(dsv4lab, n)) for n in dsv4lab.__all__]
    callables += [(f"bench.{n}", getattr(bench, n)) for n in bench.__all__]
    callables += [(f"Lab.{n}", f) for n, f in vars(Lab).items() if not n.startswith("_") and callable(f)]
    callables += [(f"Server.{n}", f) for n, f in vars(Server).items() if not n.startswith("_") and callable(f)]
    for name, obj in callables:
        if not callable(obj) or isinstance(obj, type) or name in _OVERRIDES:
            continue
        sig = inspect.signature(obj)
        var_kw = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        assert not var_kw, f"{name} takes **{var_kw[0]}: name its keywords so Shift-Tab shows them"
