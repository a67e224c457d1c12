"""Every ``dsv4lab ... --help`` is plain text: no reST or Markdown markup from the docstrings it is built from."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from dsv4lab import cli
from dsv4lab.cli.argparsing import plain_text

#: What a terminal shows as noise: reST literals and roles, Markdown code spans and bold.
MARKUP = re.compile(r"``|`|:(?:func|class|mod|meth|attr|data|exc):|\*\*")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of the CLI: (), ("config",), ("config", "show"), ..."""
    yield path
    for action in parser._actions:  # argparse keeps its subcommands here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(cli.build_parser()))


def test_every_command_is_listed() -> None:
    names = {" ".join(c) for c in COMMANDS}
    assert {"", "config", "config show", "config render", "bench", "run", "sweep", "campaign", "lab"} <= names
    assert len(COMMANDS) >= 18


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "dsv4lab" for c in COMMANDS])
def test_help_is_plain_text(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dsv4lab"), out[:200]
    assert not MARKUP.search(out), f"markup in `dsv4lab {' '.join(command)} --help`:\n{out}"


def test_the_top_help_says_what_dsv4lab_is() -> None:
    text = cli.build_parser().format_help()
    assert "launch, watch, diagnose and benchmark SGLang servers" in text
    assert "The dsv4lab command line" not in text and "``" not in text


@pytest.mark.parametrize(
    ("marked", "plain"),
    [
        ("The ``dsv4lab`` command line.", "The dsv4lab command line."),
        ("see `dsv4lab bench --help`", "see 'dsv4lab bench --help'"),
        ("raises :class:`~dsv4lab.errors.ConfigError` first", "raises ConfigError first"),
        ("see :func:`load_points`", "see load_points"),
        ("no markup at all, 5 * 3", "no markup at all, 5 * 3"),
    ],
)
def test_plain_text(marked: str, plain: str) -> None:
    assert plain_text(marked) == plain
