"""A headless Chromium looking at report.html as a person would: screenshots, and the checks the
browser tests make (console errors, images decoded, horizontal overflow, the verdict above the fold).

Chromium comes from the system (Debian `chromium`, or $OVERDRIVE_CHROMIUM); Playwright from PyPI
(`pip install playwright`, the overdrive[browser] extra) drives it. Playwright's own browser download is not needed.
Nothing here is imported by the bench: a report is written without a browser.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager

__all__ = ["BrowserUnavailable", "find_chromium", "browser_missing", "open_browser", "inspect_page",
           "screenshot_report", "WIDTHS", "LAPTOP"]

WIDTHS = {"desktop": 1280, "phone": 390}
LAPTOP = (1280, 720)
"""The screen the verdict must fit on without scrolling: a 13" laptop's browser viewport."""

# Headless and hermetic: no GPU process, no network side channels, no first-run UI, a fresh profile.
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage"]


class BrowserUnavailable(RuntimeError):
    """No headless Chromium can be driven here; the message says what is missing and how to get it."""


def find_chromium() -> str | None:
    env = os.environ.get("OVERDRIVE_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browser_missing() -> str | None:
    """None when a browser can be driven, else one line saying why not and the fix."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install playwright: the overdrive[browser] extra)"
    if find_chromium() is None:
        return "no Chromium found (apt-get install chromium, or set OVERDRIVE_CHROMIUM to its path)"
    return None


@contextmanager
def open_browser():
    """One headless Chromium for many pages (launching costs ~1-2 s; a page ~0.1 s)."""
    why = browser_missing()
    if why:
        raise BrowserUnavailable(why)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="overdrive-chromium-") as profile, sync_playwright() as p:
        try:
            ctx = p.chromium.launch_persistent_context(profile, executable_path=find_chromium(), headless=True,
                                                       args=_FLAGS)
        except Exception as e:  # noqa: BLE001 — any launch failure means "no usable browser here"
            raise BrowserUnavailable(f"Chromium did not start: {str(e).splitlines()[0][:200]}") from None
        try:
            yield ctx
        finally:
            ctx.close()


def _file_url(path: str) -> str:
    return "file://" + os.path.abspath(path)


def inspect_page(ctx, html_path: str, *, width: int, height: int = 720, dark: bool = False,
                 screenshot: str | None = None, full_page: bool = True) -> dict:
    """Load the page at this viewport and measure what a person would notice.

    Returns console errors, images that did not decode, the document's scroll width vs the
    viewport, and for the `.rec` / `.next` lines whether they lie fully inside the first screen.
    """
    page = ctx.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.set_viewport_size({"width": width, "height": height})
        page.emulate_media(color_scheme="dark" if dark else "light")
        page.goto(_file_url(html_path), wait_until="load")
        facts = page.evaluate("""() => {
          const box = sel => { const e = document.querySelector(sel); if (!e) return null;
            const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
            text: e.innerText}; };
          const bodyStyle = getComputedStyle(document.body);
          return {
            scroll_width: document.documentElement.scrollWidth, client_width: document.documentElement.clientWidth,
            images: Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, w: i.naturalWidth,
              shown: i.getBoundingClientRect().width})),
            rec: box('.rec'), next: box('.next'),
            fg: bodyStyle.color, bg: bodyStyle.backgroundColor,
          };
        }""")
        if screenshot:
            os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
            page.screenshot(path=screenshot, full_page=full_page)
    finally:
        page.close()
    facts["console_errors"] = errors
    facts["broken_images"] = [i["alt"] for i in facts["images"] if not (i["complete"] and i["w"] > 0)]
    facts["overflow_px"] = max(0, facts["scroll_width"] - facts["client_width"])
    facts["above_fold"] = {k: bool(facts[k] and facts[k]["top"] >= 0 and facts[k]["bottom"] <= height)
                           for k in ("rec", "next")}
    return facts


def screenshot_report(html_path: str, out_dir: str | None = None) -> list[str]:
    """Full-page PNGs of one report at desktop and phone width, beside it (or in out_dir):
    report-1280.png and report-390.png. Raises BrowserUnavailable when no browser can be driven."""
    out_dir = out_dir or os.path.dirname(os.path.abspath(html_path))
    stem = os.path.splitext(os.path.basename(html_path))[0]
    paths = []
    with open_browser() as ctx:
        for width in WIDTHS.values():
            path = os.path.join(out_dir, f"{stem}-{width}.png")
            inspect_page(ctx, html_path, width=width, screenshot=path)
            paths.append(path)
    return paths
