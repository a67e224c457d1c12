#!/usr/bin/env python3
"""Check that an argv is accepted by the installed SGLang's launch_server parser.

Run with the python of a venv that has ``sglang`` installed (see
``tools/sglang_parser_venvs.sh``)::

    python tools/sglang_argv_check.py -- --model-path m --tp 8

Prints exactly one JSON line on stdout:

* ``{"ok": true, "version": "<sglang.__version__>"}`` and exits 0 when the
  argv parses; with ``--batch``, a JSON list of argv lists is read from stdin and a JSON list of
  results is printed;
* ``{"ok": false, "error": "<argparse message>", "version": ...}`` and exits 2
  when argparse rejects it;
* ``{"ok": false, "error": "...", "stage": "import"}`` and exits 1 when the
  parser could not be built (broken venv).

The parser is SGLang's own: we call ``sglang.srt.server_args.prepare_server_args``
(what ``python -m sglang.launch_server`` calls) and stop it right after
``parse_args`` returns, before ``ServerArgs`` is constructed, so no model config
is fetched and no GPU is touched.

GPU-only packages that SGLang imports at module level (triton, ...) are not
installed in the checker venvs; when the real package is missing, an inert
stand-in module is served for it.  The stand-in is registered *after* all the
normal import finders, so an installed real package always wins.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

# Top-level modules faked when absent: triton is GPU-only; torchvision's PyPI
# wheels are CUDA builds that fail to load next to a CPU torch (sglang 0.5.16
# imports torchvision.io at module level).
GPU_ONLY_MODULES: frozenset[str] = frozenset({"triton", "torchvision"})


# --------------------------------------------------------------------------
# Inert stand-ins for GPU-only modules
# --------------------------------------------------------------------------


class _InertMeta(type):
    """Metaclass of stand-in attributes.

    A stand-in attribute is a class so it can be subclassed, used in
    annotations and ``isinstance`` checks; attribute access on it yields more
    stand-ins; calling it acts as a pass-through decorator (``@jit``) or as a
    decorator factory (``@autotune(...)``).
    """

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls.__dict__.get("_inert", False):
            # A real class deriving from a stand-in: behave normally.
            return super().__call__(*args, **kwargs)
        if not args and not kwargs:
            # Runtime queries (``driver.active.get_current_target()``) fail
            # as they do with the real package on a machine without a GPU.
            raise RuntimeError(f"{cls.__qualname__}: GPU-only module stand-in")
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return cls

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __bool__(cls) -> bool:
        return False

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls


def _inert(qualname: str) -> Any:
    name = qualname.rsplit(".", 1)[-1]
    return _InertMeta(name, (), {"_inert": True, "__qualname__": qualname})


class _InertModule(types.ModuleType):
    """A package whose every (non-dunder) attribute is a stand-in."""

    __version__: str

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: frozenset[str]) -> None:
        self.roots = roots

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install_gpu_stand_ins(roots: frozenset[str] = GPU_ONLY_MODULES) -> None:
    if not any(isinstance(f, _InertFinder) for f in sys.meta_path):
        sys.meta_path.append(_InertFinder(roots))


# --------------------------------------------------------------------------
# Running SGLang's own argv handling up to parse_args
# --------------------------------------------------------------------------


class ArgvRejected(Exception):
    """argparse called ``error()``: the argv is not accepted."""


class ArgvParsed(Exception):
    """The outermost ``parse_args`` returned: the argv is accepted."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


def _raise_rejected(self: argparse.ArgumentParser, message: str) -> NoReturn:
    raise ArgvRejected(message)


def check_argv(argv: list[str]) -> tuple[dict[str, Any], int]:
    install_gpu_stand_ins()
    try:
        sglang = importlib.import_module("sglang")
        version = str(getattr(sglang, "__version__", "unknown"))
        server_args = importlib.import_module("sglang.srt.server_args")
        prepare: Callable[[list[str]], Any] = server_args.prepare_server_args
        try:
            plugins = importlib.import_module("sglang.srt.plugins")
        except ImportError:
            plugins = None  # older releases have no plugin hook
        if plugins is not None and hasattr(plugins, "load_plugins"):
            plugins.load_plugins()  # launch_server does this before parsing
    except Exception as exc:  # any failure here means a broken venv
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "stage": "import"}, 1

    original_parse_args = argparse.ArgumentParser.parse_args
    original_error = argparse.ArgumentParser.error

    def parse_then_stop(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> NoReturn:
        raise ArgvParsed(original_parse_args(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    argparse.ArgumentParser.error = _raise_rejected  # type: ignore[method-assign]
    try:
        prepare(argv)
    except ArgvParsed:
        return {"ok": True, "version": version}, 0
    except ArgvRejected as exc:
        return {"ok": False, "error": str(exc), "version": version}, 2
    except SystemExit as exc:  # --help / --version: argparse exits on its own
        return {"ok": False, "error": f"argparse exited with status {exc.code}", "version": version}, 2
    except Exception as exc:  # e.g. a custom argparse Action raising
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "version": version,
            "stage": "parse",
        }, 2
    finally:
        argparse.ArgumentParser.parse_args = original_parse_args  # type: ignore[method-assign]
        argparse.ArgumentParser.error = original_error  # type: ignore[method-assign]
    return {
        "ok": False,
        "error": "prepare_server_args returned without calling parse_args",
        "version": version,
        "stage": "parse",
    }, 1


def check_batch(text: str) -> tuple[list[dict[str, Any]], int]:
    """Check a JSON list of argv lists (one interpreter start for many checks: imports cost seconds)."""
    batch = json.loads(text)
    if not isinstance(batch, list) or not all(isinstance(a, list) for a in batch):
        return [{"ok": False, "error": "--batch wants a JSON list of argv lists on stdin", "stage": "input"}], 1
    results = []
    worst = 0
    for argv in batch:
        result, code = check_argv([str(a) for a in argv])
        results.append(result)
        if code == 1:
            return results, 1  # a broken venv: the rest would fail the same way
        worst = max(worst, code)
    return results, worst


def main(args: list[str]) -> int:
    if args == ["--batch"]:
        with contextlib.redirect_stdout(sys.stderr):
            results, code = check_batch(sys.stdin.read())
        sys.stdout.write(json.dumps(results) + "\n")
        sys.stdout.flush()
        return code
    if args and args[0] == "--":
        args = args[1:]
    # SGLang may print while importing; keep stdout for our one JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        result, code = check_argv(args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
