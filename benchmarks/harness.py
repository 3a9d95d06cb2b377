"""What the benchmark scripts share: the machine they ran on, this process's resident memory (Linux
``/proc``), the output folders claimed at start-up, the results file written whole, mean ± std table cells,
and the screenshot scripts' window size.

A benchmark imports it as ``harness`` (``python benchmarks/<name>.py`` puts this folder first on the path;
the tests' ``pythonpath`` setting in pyproject.toml does the same for them).
"""

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from mae.errors import OutputExistsError
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


def claim_out(out: Path, written_by: str, outputs: tuple[str, ...], record: str) -> None:
    """Check at start-up that ``out`` is new, empty, or holds only what the script ``written_by`` wrote there
    before: its ``record`` (a JSON file of ``{"written_by": ..., "files": [...]}``) lists the files.

    Raises:
        OutputExistsError: ``out`` is a file, holds files and no record of the script, or holds a file
            named as one of ``outputs`` that its record does not list.
    """
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out} is a file: --out must be a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    path = out / record
    written = json.loads(path.read_text()) if path.is_file() else {}
    if not isinstance(written, dict) or written.get("written_by") != written_by:
        raise OutputExistsError(
            f"{out} holds files that {written_by} did not write (no {record} of it): choose a new or empty "
            "--out folder"
        )
    for name in outputs:
        if (out / name).exists() and name not in written["files"]:
            raise OutputExistsError(f"{out / name} was not written by {written_by}: move it away and rerun")


def claim_work(work: Path, written_by: str, record: str) -> None:
    """Make ``work`` the script ``written_by``'s working folder (its ``record`` file written first), or
    check that it is.

    Raises:
        OutputExistsError: ``work`` holds files and no ``record``.
    """
    path = work / record
    if work.is_dir() and any(work.iterdir()) and not path.is_file():
        raise OutputExistsError(
            f"{work} holds files that {written_by} did not write (no {record}): choose a new or "
            "empty --work folder"
        )
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"written_by": written_by}) + "\n")


def write_results(path: Path, results: dict) -> None:
    """``results`` as indented JSON at ``path``, written whole (a new file replaces the old at once): a run
    that rewrites it after each case and is interrupted keeps the cases done."""
    text = json.dumps(results, indent=1) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def mean_std(values: list[float | None], digits: int = 1) -> str:
    """A table cell: the mean of ``values`` ± their standard deviation (the mean alone for one value), with
    ``digits`` decimals; "-" when there is none or one is missing (None)."""
    if not values or any(v is None for v in values):
        return "-"
    mean = f"{statistics.mean(values):.{digits}f}"
    return mean + (f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else "")


def window_size(text: str) -> tuple[int, int]:
    """``--size WIDTHxHEIGHT`` (pixels) as (width, height)."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give WIDTHxHEIGHT in pixels, e.g. 1200x700") from None
    return width, height


def quiet_trainer(folder: Path, callbacks: list, **limits) -> "pl.Trainer":  # noqa: F821
    """A quiet single-device trainer (no logger or checkpoint; no validation unless ``limits`` set
    ``limit_val_batches``) with the run ``limits``. Lightning is imported here, so that the scripts that
    only time or measure do not pay for it."""
    import lightning.pytorch as pl

    from mae.training.runtime import default_lightning_precision

    return pl.Trainer(
        accelerator="auto",
        devices=1,
        precision=default_lightning_precision(),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=folder,
        **{"limit_val_batches": 0, "num_sanity_val_steps": 0, **limits},
    )


def _report_to(connection, function, args: tuple) -> None:
    try:
        connection.send(function(*args))
    except BaseException as error:  # the parent reports it
        connection.send({"error": f"{type(error).__name__}: {error}"})


def in_fresh_process(function, *args):
    """``function(*args)`` (a dict) run in a fresh process of its own (spawned: none of this one's memory
    is mapped in it, so its peak memory is its own), and its result.

    Raises:
        RuntimeError: it raised (its error named) or died before it could report.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_report_to, args=(child, function, args))
    process.start()
    child.close()
    try:
        result = parent.recv()
    except EOFError:  # it died before it could report
        process.join()
        result = {"error": f"the process ended with exit code {process.exitcode}"}
    process.join()
    if "error" in result:
        raise RuntimeError(f"{function.__name__} in a process of its own failed: {result['error']}")
    return result
