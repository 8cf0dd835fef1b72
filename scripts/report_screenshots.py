"""Screenshots of a task=report page in headless Chromium, one PNG per section (the page's <h2> headings), as in
docs/report/. Needs `chromium` (Debian: apt-get install chromium) and Pillow (a matplotlib dependency).

    python scripts/report_screenshots.py runs/report/index.html docs/report [--width 1400]

Writes OUT/full.png (the whole page) and OUT/NN-<section>.png; prints each file with the section's heading.
"""
import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from PIL import Image

MEASURE = """<script>addEventListener("load", () => {
  const hs = Array.from(document.querySelectorAll("h1, h2"));
  document.body.dataset.sections = JSON.stringify(hs.map(h => [h.textContent, h.getBoundingClientRect().top
                                                                              + window.scrollY]));
  document.body.dataset.height = document.documentElement.scrollHeight;
});</script>"""


def chromium(*args) -> str:
    exe = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if exe is None:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=10000", *args], capture_output=True, text=True, timeout=180).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--width", type=int, default=1400)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    page = args.index.resolve()
    # A measuring copy beside the page (same relative figure paths); the page itself is not changed.
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=page.parent, delete=False) as f:
        f.write(page.read_text().replace("</body>", MEASURE + "</body>"))
    try:
        dom = chromium(f"--window-size={args.width},1000", "--dump-dom", Path(f.name).as_uri())
    finally:
        Path(f.name).unlink()
    import html
    import json

    body = re.search(r"<body ([^>]*)>", dom).group(1)
    height = int(re.search(r'data-height="(\d+)"', body).group(1))
    sections = json.loads(html.unescape(re.search(r'data-sections="([^"]*)"', body).group(1)))
    full = args.out / "full.png"
    chromium(f"--window-size={args.width},{height}", f"--screenshot={full}", page.as_uri())
    img = Image.open(full)
    tops = [int(t) - 8 for _, t in sections] + [img.height]
    for i, ((title, _), top, bottom) in enumerate(zip(sections, tops, tops[1:])):
        plain = title.lower().replace("τ", "tau").replace("α", "alpha").replace("β", "beta")
        slug = re.sub(r"[^a-z0-9]+", "-", plain).strip("-")[:40].strip("-") or "section"
        path = args.out / f"{i:02d}-{slug}.png"
        img.crop((0, max(0, top), img.width, bottom)).save(path, optimize=True)
        print(path, title)


if __name__ == "__main__":
    main()
