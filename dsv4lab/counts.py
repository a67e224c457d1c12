"""How a count reads in a sentence: "1 run", "2 runs", "0/1 request", never "1 runs" or "2 GPU(s)".

Progress lines, chart titles, cards and reports all say how many of something there were, often of one
(one repeat of a quick check, one GPU of the tiny twin, one server in a lab). Every such count goes through
:func:`plural`, so the grammar is decided once.
"""

from __future__ import annotations

__all__ = ["plural"]

#: Plurals that are not the noun with an "s".
_IRREGULAR = {"batch": "batches", "fix": "fixes", "process": "processes", "this": "these", "was": "were"}


def plural(count: float, noun: str, many: str | None = None, *, number: bool = True) -> str:
    """``count`` with ``noun`` in the form the count takes: ``plural(1, "run")`` is "1 run", ``plural(2, "run")``
    "2 runs", ``plural(3, "batch-stats line")`` "3 batch-stats lines" (the last word is the one that changes).

    ``many`` is the plural when it is not the last word with an "s" (or a known irregular one); ``number=False``
    leaves the number out, for "0/1 request" written as ``f"{k}/{total} {plural(total, 'request', number=False)}"``
    or a verb that agrees (``plural(n, "was", number=False)``). Integers get thousands separators.
    """
    one = count == 1
    if one:
        word = noun
    elif many is not None:
        word = many
    else:
        head, _, last = noun.rpartition(" ")
        last = _IRREGULAR.get(last, last + "s")
        word = f"{head} {last}" if head else last
    if not number:
        return word
    shown = f"{count:,}" if isinstance(count, int) else f"{count:g}"
    return f"{shown} {word}"
