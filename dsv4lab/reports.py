"""Self-contained HTML reports.

A report has to open anywhere, offline, years later: no CDN scripts, no external stylesheets, every
value escaped. The notebook runner renders executed notebooks through nbconvert; this module turns the
campaign's markdown narrative into the same kind of standalone page.
"""

from __future__ import annotations

import html
import re

__all__ = ["markdown_to_html"]

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; max-width: 60rem; margin: 2rem auto;
       padding: 0 1rem; line-height: 1.5; color: #1f2328; }
code { background: #f6f8fa; padding: 0.1em 0.3em; border-radius: 4px; font-size: 90%; }
h1, h2 { border-bottom: 1px solid #d0d7de; padding-bottom: 0.3em; }
li { margin: 0.2em 0; }
"""

_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*")


def _inline(text: str) -> str:
    out: list[str] = []
    pos = 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos : m.start()]))
        if m.group(1) is not None:
            out.append(f"<code>{html.escape(m.group(1))}</code>")
        else:
            out.append(f"<b>{html.escape(m.group(2))}</b>")
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


def markdown_to_html(markdown: str, *, title: str = "dsv4lab report") -> str:
    """The small markdown subset dsv4lab writes (headings, paragraphs, lists, code, bold) as one page."""
    body: list[str] = []
    in_list: str | None = None

    def close_list() -> None:
        nonlocal in_list
        if in_list:
            body.append(f"</{in_list}>")
            in_list = None

    for raw in markdown.splitlines():
        line = raw.rstrip()
        heading = re.match(r"^(#{1,4}) (.*)$", line)
        bullet = re.match(r"^\s*- (.*)$", line)
        numbered = re.match(r"^\s*\d+\. (.*)$", line)
        if heading:
            close_list()
            level = len(heading.group(1))
            body.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif bullet or numbered:
            kind = "ul" if bullet else "ol"
            if in_list != kind:
                close_list()
                body.append(f"<{kind}>")
                in_list = kind
            item = bullet or numbered
            assert item is not None
            body.append(f"<li>{_inline(item.group(1))}</li>")
        elif not line:
            close_list()
        else:
            close_list()
            body.append(f"<p>{_inline(line)}</p>")
    close_list()
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
