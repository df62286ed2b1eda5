"""The frame every report.html shares: one stylesheet (light and dark), tables that scroll inside
their own box, plots embedded as base64 and scaled to the width.

Each page starts with the same two lines, in this order, so a person sees them without scrolling:
`.rec` (what won, by how much, is it safe) and `.next` (how to use it). The browser tests look for
exactly these two classes.
"""

from __future__ import annotations

import base64
import html

__all__ = ["CSS", "esc", "page", "table", "img_tag", "rec_block"]

# Headers wrap on a laptop so the bench table fits 1280 px; on a phone the table scrolls in its box
# and headers stay on one line. Colours are variables so that one media query gives a readable dark mode; the PNG plots keep
# their white background (matplotlib draws dark text) inside a light frame in both modes.
CSS = """:root{color-scheme:light dark;--fg:#1d1d1f;--bg:#fff;--muted:#555;--line:#ccc;--head:#f1f1f1;
--rec-bg:#eaf6ea;--rec-line:#2e8b37;--next-bg:#eaf0fb;--next-line:#2f63c4;--bad:#b00000;--code:#eef0f2;--warn:#8a5a00}
@media (prefers-color-scheme:dark){:root{--fg:#e8e8e8;--bg:#15171a;--muted:#a9adb3;--line:#3d4148;--head:#23262b;
--rec-bg:#17301c;--rec-line:#4cc35a;--next-bg:#172338;--next-line:#6b9bff;--bad:#ff7a7a;--code:#262a30;--warn:#f0b44c}}
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;padding:12px 20px 40px;max-width:1240px;
color:var(--fg);background:var(--bg);line-height:1.4;overflow-wrap:anywhere}
h1{font-size:1.45em;margin:.2em 0 .1em}h2{font-size:1.2em;margin:1.2em 0 .3em}h3{font-size:1em;margin:1em 0 .3em}
.meta,.note,.legend{color:var(--muted);font-size:13px;margin:.3em 0}
.rec,.next{padding:.5em .7em;margin:.5em 0;border-left:4px solid}
.rec{font-size:1.12em;font-weight:600;background:var(--rec-bg);border-color:var(--rec-line)}
.next{background:var(--next-bg);border-color:var(--next-line)}
.rec.none{background:var(--head);border-color:var(--warn)}
td.w{white-space:normal;min-width:14em;max-width:34em}
.why{font-size:14px;margin:.4em 0;color:var(--warn)}
code{background:var(--code);padding:0 .3em;border-radius:3px;font-size:.92em}
.scroll{overflow-x:auto;max-width:100%;margin:.5em 0}
table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid var(--line);padding:3px 7px;text-align:right;white-space:nowrap}
th{background:var(--head);white-space:normal;overflow-wrap:normal;vertical-align:bottom}td.l,th.l{text-align:left}
.unsafe,.bad{color:var(--bad);font-weight:600}
figure{margin:.8em 0}figcaption{font-weight:600;margin:.3em 0}
img{display:block;max-width:100%;height:auto;background:#fff;border-radius:4px}
ul{padding-left:1.2em}
@media (max-width:700px){th{white-space:nowrap}body{padding:8px 12px 30px}}"""

esc = html.escape


def page(title: str, body: list[str]) -> str:
    """A whole document; `viewport` makes phones lay it out at their own width, not at 980 px."""
    return "\n".join([
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>", *body, "</body></html>"])


def table(headers: list[str], rows: list[list[str]], *, left: int = 1, wrap: tuple[int, ...] = ()) -> str:
    """Cells are HTML already (escaped by the caller); the first `left` columns align left, the `wrap`
    columns (sentences: a reason, a setting) wrap instead of widening the table past the page. The
    wrapper scrolls sideways on a narrow screen instead of pushing the page wider."""
    def cls(i: int, td: bool = False) -> str:
        c = " ".join(x for x in ("l" if i < left else "", "w" if td and i in wrap else "") if x)
        return f" class='{c}'" if c else ""

    head = "".join(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f"<td{cls(i, True)}>{c}</td>" for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def img_tag(path: str, alt: str, caption: str | None = None) -> str:
    with open(path, "rb") as f:
        b64 = base64.b64encode(f.read()).decode()
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f"<figure>{cap}<img alt='{esc(alt)}' src='data:image/png;base64,{b64}'></figure>"


def rec_block(rec: str, next_html: str, why: str | None = None, *, answered: bool = True) -> list[str]:
    """The two lines a reader needs first: the verdict, then how to apply it (HTML, escaped by
    the caller), and an optional sentence on why the verdict differs from what was expected.
    answered=False (no verdict) draws the first line grey-amber, never in the green of a result."""
    out = [f"<p class='rec{'' if answered else ' none'}'>{esc(rec)}</p>", f"<p class='next'>{next_html}</p>"]
    if why:
        out.append(f"<p class='why'>{esc(why)}</p>")
    return out
