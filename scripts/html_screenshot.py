"""Regenerate the docs' picture of the HTML page: ``tracetool analyze --html`` of a sample trace,
opened in headless chromium (tests/report/html_browser.py) and saved as a PNG.

    python scripts/html_screenshot.py                       # sample_traces/chat -> docs/images/html-page.png
    python scripts/html_screenshot.py queueing --dark -o /tmp/queueing-dark.png --height 0

Look at the picture before committing it (as the TUI's snapshots are looked at).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "report"))

from html_browser import Browser  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default="chat", help="a sample trace's name (default chat)")
    ap.add_argument("-o", "--output", type=Path, default=REPO / "docs" / "images" / "html-page.png")
    ap.add_argument("--dark", action="store_true", help="the reader prefers a dark theme")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=1560, help="CSS pixels from the top; 0 = the whole page")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / f"{args.trace}.html"
        subprocess.run([sys.executable, "-m", "tracetool", "analyze", str(REPO / "sample_traces" / args.trace),
                        "--claim", "network-rtt", "--html", str(page)], check=True, stdout=subprocess.DEVNULL)
        with Browser(width=args.width) as b:
            seen = b.open(page, dark=args.dark)
            if seen.requests != [page.resolve().as_uri()] or seen.errors:
                raise SystemExit(f"the page did not load clean: {seen.requests} {seen.errors}")
            png = b.screenshot(args.height or None)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(png)
    print(f"wrote {args.output} ({len(png) / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
