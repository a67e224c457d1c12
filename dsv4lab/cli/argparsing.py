"""The command line's argparse, with what the standard one lacks: a mistyped command or choice is answered
with the nearest known one, and help reads as plain text.

``dsv4lab lanch`` would otherwise list every command and leave the reader to spot ``launch``; the same
wording as the library's :class:`~dsv4lab.errors.UnknownNameError` is used, so a typo reads the same
wherever it is made. Descriptions come from docstrings, whose reST (double backquotes, ``:func:`` roles)
is noise in a terminal, so help and usage are stripped of it on the way out, whatever the source.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from dsv4lab.errors import unknown_name_message

__all__ = ["ArgumentParser", "add_host_options", "plain_text"]

#: ``:func:`~dsv4lab.x.name``` and ``:class:`Name``` (reST roles): the name alone.
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?(?:[\w.]+\.)?([^`]+)`")
#: reST literals and Markdown code spans.
_CODE = re.compile(r"``(.+?)``|`([^`\n]+)`")


def plain_text(text: str) -> str:
    """``text`` without markup: roles as their name, code spans as their text (quoted when it holds a space,
    a command line: ``dsv4lab bench --help`` becomes 'dsv4lab bench --help')."""

    def code(m: re.Match[str]) -> str:
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        return f"'{inner}'" if " " in inner else inner

    return _CODE.sub(code, _ROLE.sub(r"\1", text))


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with "did you mean" for choices and commands, and plain-text help.

    Subcommand parsers are made of this class too (argparse uses the parent's class for them).
    """

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        command = not action.option_strings and isinstance(choices, Mapping)
        kind = "command" if command else "value"  # argparse names the option: "argument --format: unknown value"
        raise argparse.ArgumentError(action, unknown_name_message(kind, value, [str(c) for c in choices]))

    def format_help(self) -> str:
        return plain_text(super().format_help())

    def format_usage(self) -> str:
        return plain_text(super().format_usage())


def add_host_options(p: argparse.ArgumentParser) -> None:
    """--host, --known-hosts and --trust-host-key: every verb that reaches a host takes the same three."""
    p.add_argument("--host", default=None, help="SSH alias or user@host[:port] (default: this machine)")
    p.add_argument("--known-hosts", default="~/.ssh/known_hosts", help="known_hosts file to check host keys")
    p.add_argument(
        "--trust-host-key",
        action="store_true",
        help="record an UNKNOWN host key in --known-hosts (check its fingerprint first); changed keys are refused",
    )
