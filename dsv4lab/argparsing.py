"""The command line's argparse, with what the standard one lacks: a mistyped command or choice is answered
with the nearest known one.

``dsv4lab lanch`` would otherwise list every command and leave the reader to spot ``launch``; the same
wording as the library's :class:`~dsv4lab.errors.UnknownNameError` is used, so a typo reads the same
wherever it is made.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from dsv4lab.errors import unknown_name_message

__all__ = ["ArgumentParser"]


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with "did you mean" for choices and commands.

    Subcommand parsers are made of this class too (argparse uses the parent's class for them).
    """

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        command = not action.option_strings and isinstance(choices, Mapping)
        kind = "command" if command else "value"  # argparse names the option: "argument --format: unknown value"
        raise argparse.ArgumentError(action, unknown_name_message(kind, value, [str(c) for c in choices]))
