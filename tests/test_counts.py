"""Counts read as English: "1 run", "2 runs", "0/1 request" — the helper, a few of the places that print a count
of one (a progress line on a real streaming server, a repr, a chart, a diagnosis, an error), and no "(s)" or
"{n} runs" left in the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dsv4lab import plots
from dsv4lab.bench import BenchRuns
from dsv4lab.cli.bench import bench_main
from dsv4lab.config.server_config import SpeculativeConfig
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError
from dsv4lab.logs.runs import diagnose
from tests.test_bench_cli import ServerThread
from tests.test_bench_fakeserver import ServerBehaviour
from tests.test_bench_stats import run
from tests.test_plots import _samples, _titles

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("args", "kwargs", "text"),
    [
        ((1, "run"), {}, "1 run"),
        ((2, "run"), {}, "2 runs"),
        ((0, "request"), {}, "0 requests"),
        ((1, "GPU"), {}, "1 GPU"),
        ((8, "GPU"), {}, "8 GPUs"),
        ((3, "batch-stats line"), {}, "3 batch-stats lines"),
        ((2, "batch"), {}, "2 batches"),
        ((1024, "request"), {}, "1,024 requests"),
        ((1.5, "second"), {}, "1.5 seconds"),
        ((1, "request"), {"number": False}, "request"),
        ((2, "was"), {"number": False}, "were"),
        ((1, "needs", "need"), {"number": False}, "needs"),
        ((2, "needs", "need"), {"number": False}, "need"),
        ((2, "repeat per arm", "repeats per arm"), {}, "2 repeats per arm"),
    ],
)
def test_plural(args: tuple[object, ...], kwargs: dict[str, bool], text: str) -> None:
    assert plural(*args, **kwargs) == text  # type: ignore[arg-type]


def test_a_one_request_benchmark_reads_in_the_singular(capsys: pytest.CaptureFixture[str]) -> None:
    """The progress lines of real benchmarks (``dsv4lab bench`` against a streaming server on 127.0.0.1): one
    request, then two runs of one request."""
    server = ServerThread(ServerBehaviour(ttft_s=0.005, itl_s=0.001))
    try:
        one = ["--url", server.server.url, "--num-prompts", "1", "--output-len", "3", "--input-len", "8"]
        assert bench_main(one) == 0
        first = capsys.readouterr().err
        assert bench_main([*one, "--repeats", "2"]) == 0
        second = capsys.readouterr().err
    finally:
        server.close()
    assert "done: 1 run, best" in first and "| 0/1 request, 0 ok |" in first and "| 1 request |" in first, first
    assert "| 1/1 request ok |" in first, first
    assert "done: 2 runs," in second, second
    for text in (first, second):
        assert not re.search(r"\b1 (runs|requests)\b|/1 requests|\(s\)", text), text


def test_a_repr_of_one_run() -> None:
    assert repr(BenchRuns([run(1, 1.0)])) == "BenchRuns(1 run)"
    assert repr(BenchRuns([run(1, 1.0), run(1, 2.0)])) == "BenchRuns(2 runs)"


def test_a_one_gpu_memory_chart_says_1_gpu() -> None:
    one = _samples()
    one = one[one["gpu"] == 0]
    titles = _titles(plots.memory_timeline(one).to_dict())
    assert any(t.endswith("; 1 GPU") for t in titles), titles
    assert any(t.endswith("; 8 GPUs") for t in _titles(plots.memory_timeline(_samples()).to_dict()))


def test_a_one_line_log_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "one.log"
    log.write_text("hello\n", encoding="utf-8")
    assert "were found in 1 line;" in diagnose(log).cause


def test_one_field_needs_and_two_need_an_algorithm() -> None:
    with pytest.raises(ConfigError, match="eagle_topk needs an algorithm"):
        SpeculativeConfig(eagle_topk=1)
    with pytest.raises(ConfigError, match="num_steps, eagle_topk need an algorithm"):
        SpeculativeConfig(num_steps=2, eagle_topk=1)


#: The plural nouns of counts the code prints.
_NOUNS = re.compile(r" (?:runs|requests|repeats|points|steps|servers|GPUs|lines|hosts|kernels|batches)\b")
#: "request(s)", "GPU(s)": the plural plural() replaced ("http(s)://" is a URL scheme, not a count).
_PAREN_S = re.compile(r"[A-Za-z]\(s\)(?!://| URL| endpoint| server URL)")


def _count(node: ast.expr) -> bool:
    """Whether an f-string's ``{...}`` is a count: a name, an attribute, arithmetic or ``len(...)``, not a
    word such as ``{kind.capitalize()}``."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "len"
    return isinstance(node, (ast.Name, ast.Attribute, ast.BinOp, ast.Subscript))


def test_no_count_is_glued_to_a_plural_in_the_code() -> None:
    found = []
    for path in sorted((ROOT / "dsv4lab").rglob("*.py")):
        if path.name == "counts.py":  # its doc quotes what not to write
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _PAREN_S.search(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
            if isinstance(node, ast.JoinedStr):
                for value, after in zip(node.values, node.values[1:], strict=False):
                    glued = isinstance(after, ast.Constant) and _NOUNS.match(str(after.value))
                    if isinstance(value, ast.FormattedValue) and _count(value.value) and glued:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:100]}")
    assert found == [], "\n".join(found)
