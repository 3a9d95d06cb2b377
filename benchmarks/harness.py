"""What the benchmark scripts share: the machine they ran on, this process's resident memory (Linux
``/proc``), the results file written whole, and the screenshot scripts' window size.

A benchmark imports it as ``harness`` (``python benchmarks/<name>.py`` puts this folder first on the path;
the tests' ``pythonpath`` setting in pyproject.toml does the same for them).
"""

import argparse
import json
import os
import platform
from pathlib import Path

import torch

from mae.io.atomic import atomic_write


def cpu_name() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``); elsewhere what ``platform`` reports."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return cpu


def machine() -> str:
    """The CPU, its cores and torch's version, as the memory benchmarks record them."""
    return f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}"


def resident_kib() -> tuple[int, int]:
    """(current, peak) resident memory of this process in KiB (Linux ``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def reset_resident_peak() -> None:
    """From here the peak resident memory (``VmHWM``) is the current resident size (Linux ``clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def write_results(path: Path, results: dict) -> None:
    """``results`` as indented JSON at ``path``, written whole (a new file replaces the old at once): a run
    that rewrites it after each case and is interrupted keeps the cases done."""
    text = json.dumps(results, indent=1) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def window_size(text: str) -> tuple[int, int]:
    """``--size WIDTHxHEIGHT`` (pixels) as (width, height)."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give WIDTHxHEIGHT in pixels, e.g. 1200x700") from None
    return width, height
