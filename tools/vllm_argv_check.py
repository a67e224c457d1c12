#!/usr/bin/env python3
"""Check that an argv is accepted by the installed vLLM's ``vllm serve`` parser.

Run with the python of a venv that has vLLM installed (see
``tools/vllm_cpu_venv.sh``); the argv is what follows ``vllm serve``::

    python tools/vllm_argv_check.py -- MODEL --max-model-len 1024 --dtype float32

Prints exactly one JSON line on stdout:

* ``{"ok": true, "version": "<vllm.__version__>"}`` and exits 0 when the argv
  parses; with ``--batch``, a JSON list of argv lists is read from stdin and a
  JSON list of results is printed;
* ``{"ok": false, "error": "<message>", "version": ...}`` and exits 2 when
  argparse (or the CLI's own pre-launch validation) rejects it;
* ``{"ok": false, "error": "...", "stage": "import"}`` and exits 1 when the
  parser could not be built (broken venv).

The parser is vLLM's own, built the way ``vllm`` (``vllm.entrypoints.cli.main``)
builds it: a top-level ``FlexibleArgumentParser`` with subcommands, the
``serve`` subcommand added by ``ServeSubcommand.subparser_init``; the argv is
parsed as ``["serve", *argv]`` by the top-level parser (whose ``parse_args``
rewrites ``--model``, ``--config``, ``--a.b`` and ``-O`` forms first), then
``ServeSubcommand.validate`` runs, as the CLI does before it dispatches. Nothing
is launched, no model config is read and no device is touched.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from typing import Any, NoReturn

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class ArgvRejected(Exception):
    """argparse called ``error()``: the argv is not accepted."""


def _raise_rejected(self: argparse.ArgumentParser, message: str) -> NoReturn:
    raise ArgvRejected(message)


_parser_cache: dict[str, Any] = {}


def _build() -> tuple[Any, Any, str]:
    """vLLM's top-level parser with its real ``serve`` subparser (built once)."""
    if not _parser_cache:
        vllm = importlib.import_module("vllm")
        serve = importlib.import_module("vllm.entrypoints.cli.serve")
        argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
        parser = argparse_utils.FlexibleArgumentParser(description="vLLM CLI")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        command = serve.ServeSubcommand()
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        _parser_cache.update(parser=parser, command=command, version=str(getattr(vllm, "__version__", "unknown")))
    return _parser_cache["parser"], _parser_cache["command"], _parser_cache["version"]


def check_argv(argv: list[str]) -> tuple[dict[str, Any], int]:
    try:
        parser, command, version = _build()
    except Exception as exc:  # any failure here means a broken venv
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "stage": "import"}, 1

    original_error = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _raise_rejected  # type: ignore[method-assign]
    try:
        args = parser.parse_args(["serve", *argv])
    except ArgvRejected as exc:
        return {"ok": False, "error": str(exc), "version": version}, 2
    except SystemExit as exc:  # --help: argparse exits on its own
        return {"ok": False, "error": f"argparse exited with status {exc.code}", "version": version}, 2
    except Exception as exc:  # e.g. a type= converter or the --model/--config rewrite raising
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "version": version, "stage": "parse"}, 2
    finally:
        argparse.ArgumentParser.error = original_error  # type: ignore[method-assign]
    try:
        command.validate(args)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "version": version, "stage": "validate"}, 2
    return {"ok": True, "version": version}, 0


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
    # vLLM logs (and argparse prints help) while importing and parsing; keep
    # stdout for our one JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        if args == ["--batch"]:
            result: Any
            result, code = check_batch(sys.stdin.read())
        else:
            if args and args[0] == "--":
                args = args[1:]
            result, code = check_argv(args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
