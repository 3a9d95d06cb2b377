"""A screenshot of TensorBoard showing one run's scalar, taken in headless Chromium from a local
``tensorboard`` server (docs/pretraining.md's figure of a SIGTERM-ed and resumed run).

    python benchmarks/tensorboard_screenshot.py --logdir runs/tensorboard \\
        --out docs/tensorboard_resumed_run.png

Needs the ``tracking`` extra (TensorBoard) and Debian's ``chromium``. Starts TensorBoard on a free port
of 127.0.0.1, loads its time-series page filtered to ``--tag`` for ``--wait`` seconds of the browser's
virtual time, writes the PNG, and stops the server.
"""

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from harness import window_size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, server: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"tensorboard exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"tensorboard did not answer on {url} within {timeout:.0f} s")


def screenshot(url: str, out: Path, size: tuple[int, int], wait_ms: int) -> None:
    """``url`` as a PNG at ``out``, taken by headless Chromium after ``wait_ms`` of virtual time."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("error: chromium not found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        command = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            f"--virtual-time-budget={wait_ms}",
            f"--screenshot={out}",
            url,
        ]
        subprocess.run(command, check=True, capture_output=True, timeout=120)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", required=True, type=Path, help="the folder tensorboard reads")
    parser.add_argument("--out", required=True, type=Path, help="the PNG to write")
    parser.add_argument(
        "--tag", default="train/loss_step", help="the scalar shown (default: train/loss_step)"
    )
    parser.add_argument("--size", type=window_size, default="1200x700", help="window WIDTHxHEIGHT in pixels")
    parser.add_argument("--wait", type=float, default=20.0, help="seconds of the page's virtual time")
    args = parser.parse_args(argv)
    if not args.logdir.is_dir():
        parser.error(f"--logdir {args.logdir}: no such folder")
    if args.out.exists():
        parser.error(f"--out {args.out} exists: remove it or choose another name (nothing is overwritten)")
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(args.logdir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}/"
        wait_for(base, server)
        # The scalars dashboard draws its charts without WebGL (headless Chromium has none here).
        query = urllib.parse.urlencode({"tagFilter": args.tag, "_smoothingWeight": 0})
        screenshot(f"{base}#scalars&{query}", args.out, args.size, int(args.wait * 1000))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
