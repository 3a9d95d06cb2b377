"""A screenshot of the reconstruction page (``mae demo``) taken in headless Chromium: the figure of
docs/inspecting.md.

    python benchmarks/page_screenshot.py --checkpoint runs/pretrain_default/version_0/checkpoints/last.ckpt \
        --out docs/reconstruction_page.png

Needs the ``demo`` extra (Gradio), selenium (``dev`` extra), and Debian's ``chromium`` and
``chromium-driver``. Serves the page of ``--checkpoint`` on a free port of 127.0.0.1 with the built-in
example digits (as ``mae demo`` does), waits until the first example's four panels and loss are shown,
writes the PNG and stops the page. An existing ``--out`` is refused (nothing is overwritten).
"""

import argparse
import shutil
from pathlib import Path

from harness import window_size


def browser(size: tuple[int, int]):
    """Headless Chromium driven by selenium, ``size`` = (width, height) pixels."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        raise SystemExit(
            "error: chromium or chromedriver not found (Debian: apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    options.binary_location = chromium
    return webdriver.Chrome(service=Service(driver), options=options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, type=Path, help="a checkpoint with a decoder")
    parser.add_argument("--out", required=True, type=Path, help="the PNG to write")
    parser.add_argument(
        "--size",
        type=window_size,
        default="1400x1000",
        help="window WIDTHxHEIGHT in pixels (default: 1400x1000)",
    )
    parser.add_argument(
        "--wait", type=float, default=120.0, help="seconds to wait for the panels (default: 120)"
    )
    return parser


def main(argv: list[str] | None = None) -> Path:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    if args.out.exists():
        parser.error(f"--out {args.out} exists: remove it or choose another name (nothing is overwritten)")

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from mae.apps.page.demo import ReconstructionSession, build_page, choose_port, example_images, serve

    session = ReconstructionSession(args.checkpoint)
    port = choose_port("127.0.0.1", None)  # the first free one from 7860, as mae demo takes
    with example_images(None) as examples:
        page = build_page(session, examples)
        serve(page, "127.0.0.1", port, 100, block=False)
        driver = browser(args.size)
        try:
            driver.get(f"http://127.0.0.1:{port}/")
            WebDriverWait(driver, args.wait).until(
                lambda d: (
                    "masked-patch loss" in d.find_element(By.CSS_SELECTOR, "#details").text
                    and len(d.find_elements(By.CSS_SELECTOR, "[id^=panel-] img")) == 4
                )
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            if not driver.save_screenshot(str(args.out)):
                raise SystemExit(f"error: the browser wrote no screenshot to {args.out}")
        finally:
            driver.quit()
            page.close()
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
