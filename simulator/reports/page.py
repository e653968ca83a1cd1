"""A small document model (sections of paragraphs, tables, figures) rendered to one self-contained
HTML page or to Markdown. Pure: data in, text out.

The HTML needs no network and no JavaScript: inline CSS, figures as base64 PNG data URIs. Every
number that comes from a stepsim report is a :class:`Num`; in HTML it carries ``data-source``
(``run`` or ``memory``: the ``stepsim run --json`` / ``stepsim memory --json`` report it is from),
``data-key`` (its dotted path in that report) and ``data-value`` (the exact value, ``repr``), so
a test can hold the page against the JSON.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Num:
    """A number as shown (``text``), with its exact value and, if from a report, where it is."""

    value: float
    text: str
    source: str | None = None
    key: str | None = None


Inline = str | Num
Cell = Inline | tuple  # a tuple of inlines is one cell


@dataclass(frozen=True)
class Para:
    parts: tuple[Inline, ...]
    kind: str = "p"  # p | note | answer


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    caption: str = ""
    numeric: tuple[int, ...] = ()  # right-aligned columns


@dataclass(frozen=True)
class Figure:
    name: str
    png: bytes
    caption: str
    wide: bool = False


@dataclass(frozen=True)
class Facts:
    """A definition list: (label, value) pairs, the worksheet's bullet lines."""

    items: tuple[tuple[str, tuple[Inline, ...]], ...]


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    blocks: tuple = ()
    lead: str = ""


@dataclass(frozen=True)
class Page:
    title: str
    subtitle: str
    cards: tuple[tuple[str, Inline], ...]
    sections: tuple[Section, ...]
    footer: str = ""
    extra: dict = field(default_factory=dict)


def p(*parts: Inline, kind: str = "p") -> Para:
    return Para(tuple(parts), kind)


# --- HTML ------------------------------------------------------------------------------------------

CSS = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; --soft: #f6f8fa; --accent: #0b5cad;
        --good: #1a7f37; --bad: #cf222e; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff;
       font: 15px/1.55 -apple-system, "Segoe UI", "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1040px; margin: 0 auto; padding: 28px 32px 60px; }
header.top { border-bottom: 3px solid var(--accent); padding-bottom: 14px; margin-bottom: 18px; }
h1 { font-size: 26px; margin: 0 0 4px; }
.subtitle { color: var(--muted); margin: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 16px 0 6px; }
.card { flex: 1 1 150px; border: 1px solid var(--line); border-radius: 8px; padding: 8px 12px;
        background: var(--soft); }
.card .label { font-size: 12px; color: var(--muted); text-transform: uppercase; letter-spacing: .04em; }
.card .value { font-size: 20px; font-weight: 600; }
nav.toc { font-size: 13px; color: var(--muted); margin: 8px 0 0; }
nav.toc a { color: var(--accent); text-decoration: none; margin-right: 12px; white-space: nowrap; }
section { margin-top: 30px; }
h2 { font-size: 20px; border-bottom: 1px solid var(--line); padding-bottom: 4px; margin: 0 0 10px; }
.lead { color: var(--muted); margin-top: 0; }
table { border-collapse: collapse; width: 100%; margin: 10px 0 6px; font-size: 14px; }
th, td { border: 1px solid var(--line); padding: 5px 9px; vertical-align: top; text-align: left; }
th { background: var(--soft); font-weight: 600; }
tbody tr:nth-child(even) td { background: #fbfcfd; }
td.r, th.r { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
caption { caption-side: bottom; text-align: left; color: var(--muted); font-size: 12.5px; padding-top: 4px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 18px; margin: 8px 0; }
dl.facts dt { font-weight: 600; }
dl.facts dd { margin: 0; }
figure { margin: 14px 0; text-align: center; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
figure.narrow img { max-width: 720px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
p.note { color: var(--muted); font-size: 13.5px; }
div.answer { border-left: 4px solid var(--accent); background: #f3f8fe; padding: 8px 14px; margin: 10px 0;
             border-radius: 0 6px 6px 0; }
div.answer h3 { font-size: 15px; margin: 0 0 4px; }
div.answer p { margin: 0; }
.verdict-holds { color: var(--good); font-weight: 700; }
.verdict-fails { color: var(--bad); font-weight: 700; }
footer { margin-top: 40px; color: var(--muted); font-size: 12.5px; border-top: 1px solid var(--line);
         padding-top: 8px; }
"""


def _inline_html(x: Inline) -> str:
    if isinstance(x, Num):
        attrs = f' data-value="{x.value!r}"'
        if x.source:
            attrs += f' data-source="{x.source}" data-key="{html.escape(x.key or "")}"'
        return f'<span class="num"{attrs}>{html.escape(x.text)}</span>'
    return html.escape(x)


def _cell_html(c: Cell) -> str:
    parts = c if isinstance(c, tuple) else (c,)
    out = "".join(_inline_html(x) for x in parts)
    for verdict in ("holds", "fails"):
        if parts == (verdict,):
            out = f'<span class="verdict-{verdict}">{verdict}</span>'
    return out


def _block_html(b) -> str:
    if isinstance(b, Para):
        body = "".join(_inline_html(x) for x in b.parts)
        if b.kind == "answer":
            return f'<div class="answer">{body}</div>'
        return f'<p class="{b.kind}">{body}</p>' if b.kind != "p" else f"<p>{body}</p>"
    if isinstance(b, Table):
        head = "".join(f'<th{" class=r" if i in b.numeric else ""}>{html.escape(h)}</th>'
                       for i, h in enumerate(b.header))
        rows = "".join("<tr>" + "".join(f'<td{" class=r" if i in b.numeric else ""}>{_cell_html(c)}</td>'
                                        for i, c in enumerate(r)) + "</tr>" for r in b.rows)
        cap = f"<caption>{html.escape(b.caption)}</caption>" if b.caption else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    if isinstance(b, Figure):
        data = base64.b64encode(b.png).decode("ascii")
        cls = "" if b.wide else ' class="narrow"'
        return (f'<figure id="fig-{b.name}"{cls}><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
    if isinstance(b, Facts):
        items = "".join(f"<dt>{html.escape(k)}</dt><dd>{''.join(_inline_html(x) for x in v)}</dd>" for k, v in b.items)
        return f'<dl class="facts">{items}</dl>'
    if isinstance(b, Answer):
        body = "".join(_inline_html(x) for x in b.parts)
        return f'<div class="answer" id="{b.id}"><h3>{html.escape(b.question)}</h3><p>{body}</p></div>'
    raise TypeError(f"unknown block {type(b).__name__}")


@dataclass(frozen=True)
class Answer:
    """A worksheet prompt and its measured answer."""

    id: str
    question: str
    parts: tuple[Inline, ...]


def render_html(page: Page) -> str:
    cards = "".join(f'<div class="card"><div class="label">{html.escape(k)}</div>'
                    f'<div class="value">{_inline_html(v)}</div></div>' for k, v in page.cards)
    toc = "\n".join(f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in page.sections)
    body = []
    for s in page.sections:
        lead = f'<p class="lead">{html.escape(s.lead)}</p>' if s.lead else ""
        body.append(f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>{lead}'
                    + "\n".join(_block_html(b) for b in s.blocks) + "</section>")
    footer = f"<footer>{html.escape(page.footer)}</footer>" if page.footer else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(page.title)}</title><style>{CSS}</style></head><body><main>"
            f'<header class="top"><h1>{html.escape(page.title)}</h1><p class="subtitle">{html.escape(page.subtitle)}</p>'
            f'<div class="cards">{cards}</div><nav class="toc">{toc}</nav></header>'
            + "\n".join(body) + footer + "</main></body></html>\n")


# --- Markdown --------------------------------------------------------------------------------------

def _inline_md(x: Inline) -> str:
    return x.text if isinstance(x, Num) else x


def _cell_md(c: Cell) -> str:
    parts = c if isinstance(c, tuple) else (c,)
    return "".join(_inline_md(x) for x in parts).replace("|", "\\|").replace("\n", " ")


def _block_md(b, figure_paths: dict) -> str:
    if isinstance(b, Para):
        text = "".join(_inline_md(x) for x in b.parts)
        return f"> {text}" if b.kind == "answer" else (f"_{text}_" if b.kind == "note" else text)
    if isinstance(b, Table):
        align = ["---:" if i in b.numeric else "---" for i in range(len(b.header))]
        lines = ["| " + " | ".join(b.header) + " |", "| " + " | ".join(align) + " |"]
        lines += ["| " + " | ".join(_cell_md(c) for c in r) + " |" for r in b.rows]
        if b.caption:
            lines += ["", f"_{b.caption}_"]
        return "\n".join(lines)
    if isinstance(b, Figure):
        return f"![{b.caption}]({figure_paths.get(b.name, b.name + '.png')})\n\n_{b.caption}_"
    if isinstance(b, Facts):
        return "\n".join(f"- **{k}:** " + "".join(_inline_md(x) for x in v) for k, v in b.items)
    if isinstance(b, Answer):
        return f"**{b.question}**\n\n> " + "".join(_inline_md(x) for x in b.parts)
    raise TypeError(f"unknown block {type(b).__name__}")


def render_markdown(page: Page, figure_paths: dict | None = None) -> str:
    """The page as Markdown; figures link to ``figure_paths[name]`` (written by the caller)."""
    paths = figure_paths or {}
    out = [f"# {page.title}", "", page.subtitle, ""]
    out += [" | ".join(f"**{k}:** {_inline_md(v)}" for k, v in page.cards), ""]
    for s in page.sections:
        out += [f"## {s.title}", ""]
        if s.lead:
            out += [f"_{s.lead}_", ""]
        for b in s.blocks:
            out += [_block_md(b, paths), ""]
    if page.footer:
        out += ["---", "", f"_{page.footer}_", ""]
    return "\n".join(out)


def figures_of(page: Page) -> list[Figure]:
    return [b for s in page.sections for b in s.blocks if isinstance(b, Figure)]
