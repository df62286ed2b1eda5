"""Every report kind as a person sees it in Chromium: no console errors, every image decoded, nothing
wider than a laptop or a phone, the verdict and the next step on the first laptop screen, dark mode
readable. Each check leaves full-page screenshots beside the page (report-1280.png, report-390.png)."""

import os
import subprocess
import sys

import pytest
from kinds import PAGES

from overdrive.report.browser import LAPTOP, WIDTHS, inspect_page

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PHONE_HEIGHT = 844  # an iPhone 12-15 viewport: 390 x 844


def _luminance(rgb: str) -> float:
    r, g, b = (int(x) / 255 for x in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3])
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(fg: str, bg: str) -> float:
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("kind", list(PAGES))
def test_report_reads_well_in_a_browser(kind, browser, rendered):
    page = rendered[kind]
    stem = os.path.splitext(page)[0]
    for width in WIDTHS.values():
        f = inspect_page(browser, page, width=width, height=LAPTOP[1] if width == LAPTOP[0] else PHONE_HEIGHT,
                         screenshot=f"{stem}-{width}.png")
        assert f["console_errors"] == [], f["console_errors"]
        assert f["broken_images"] == [], f"images not decoded: {f['broken_images']}"
        if PAGES[kind][2]:
            assert f["images"] and all(i["shown"] <= width for i in f["images"])
        assert f["overflow_px"] == 0, f"{kind} is {f['overflow_px']} px wider than a {width} px screen"
        assert os.path.getsize(f"{stem}-{width}.png") > 0
        if width == LAPTOP[0]:
            assert f["above_fold"] == {"rec": True, "next": True}, (f["rec"], f["next"])
            assert f["next"]["text"].startswith("Next step")


@pytest.mark.parametrize("kind", ["bench", "plan"])
def test_dark_mode_is_readable(kind, browser, rendered):
    page = rendered[kind]
    light = inspect_page(browser, page, width=1280)
    dark = inspect_page(browser, page, width=1280, dark=True, screenshot=os.path.splitext(page)[0] + "-dark.png")
    assert _luminance(dark["bg"]) < 0.05 < _luminance(light["bg"])  # it does switch
    assert _contrast(dark["fg"], dark["bg"]) >= 7 and _contrast(light["fg"], light["bg"]) >= 7  # WCAG AAA text
    assert dark["overflow_px"] == 0 and dark["console_errors"] == []


def test_report_screenshot_flag_writes_both_widths(browser, rendered):
    run = os.path.dirname(rendered["bench"])
    for w in WIDTHS.values():
        p = os.path.join(run, f"report-{w}.png")
        if os.path.exists(p):
            os.remove(p)
    cp = subprocess.run([sys.executable, "-m", "overdrive", "report", run, "--screenshot"], capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    for w in WIDTHS.values():
        png = os.path.join(run, f"report-{w}.png")
        with open(png, "rb") as fh:
            head = fh.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(head[16:20], "big") == w, png
