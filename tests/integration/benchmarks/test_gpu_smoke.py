"""``bash benchmarks/gpu_smoke.sh --dry-run``: the one command a person runs on a lent GPU, walked on the CPU
(the parts' own dry runs are the ``dry_run`` tests of ``tests/gpu``). Its JSON per part and summary, its
logs, a part that outlives its time limit (status "timeout", nothing it started left running), and a part
skipped for want of time before the deadline."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.gpu.parts import RESULT_KEYS
from tests.helpers import REPO

SCRIPT = REPO / "benchmarks" / "gpu_smoke.sh"
DECODER_VARIANTS = {
    "default",
    "partial-0.25",
    "partial-0.5",
    "cross",
    "cross-partial-0.25",
    "low-res",
    "fast",
}
RECORD_KEYS = {
    "part",
    "status",
    "seconds",
    "limit_s",
    "dry_run",
    "device",
    "results",
    "notes",
    "error",
    "log",
}
TAG = "GPU_SMOKE_TEST_TAG"  # in the environment of everything the script starts


def _read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def _left_running(tag: str, grace_s: float = 15.0) -> list[int]:
    """The processes that still run ``grace_s`` after the script ended (the forkserver and multiprocessing's
    resource tracker leave a moment after pytest) and carry ``TAG=tag`` in their environment."""
    deadline = time.monotonic() + grace_s
    while (pids := _carrying(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids


def _carrying(tag: str) -> list[int]:
    """The processes running (not zombies) with ``TAG=tag`` in their environment."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            running = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            if running and f"{TAG}={tag}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return pids


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """One dry run of three parts: decoders (ok), onnx (needs more time than is left: skipped), sigterm
    (a 3 s limit: timeout)."""
    out = tmp_path_factory.mktemp("gpu_smoke") / "results"
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("GPU_SMOKE_", "DRY_RUN", "PARTS"))
    }
    environment.update(GPU_SMOKE_LIMIT_SIGTERM="3", GPU_SMOKE_MIN_ONNX="100000", **{TAG: str(out)})
    command = ["bash", str(SCRIPT), "--dry-run", "--out", str(out), "--parts", "sigterm decoders onnx"]
    result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=280)
    return result, out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_summary_counts_every_part_and_the_run_fails_unless_all_are_ok(dry_run) -> None:
    result, out = dry_run
    assert result.returncode == 1, (result.stdout + result.stderr)[-4000:]
    summary = _read(out, "summary.json")
    assert summary["dry_run"] and summary["device"] == "cpu" and not summary["all_ok"]
    assert summary["parts_requested"] == ["decoders", "onnx", "sigterm"]  # the parts' own order
    statuses = {p["part"]: p["status"] for p in summary["parts"]}
    assert statuses == {"decoders": "ok", "onnx": "skipped", "sigterm": "timeout"}, summary
    assert summary["counts"] == {"ok": 1, "failed": 0, "timeout": 1, "skipped": 1}
    assert "torch" in (out / "machine.txt").read_text()
    assert "gpu_smoke.sh: exit 1" in (out / "run.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_part_that_passes_writes_its_results_notes_and_log(dry_run) -> None:
    _, out = dry_run
    record = _read(out, "decoders.json")
    assert RECORD_KEYS <= set(record), record
    assert (
        record["status"] == "ok"
        and record["error"] is None
        and record["dry_run"]
        and record["device"] == "cpu"
    )
    assert 0 < record["seconds"] <= record["limit_s"] == 240
    assert RESULT_KEYS["decoders"] <= set(record["results"]) and record["results"]["checks_failed"] == []
    assert set(record["results"]["img_s"]) == DECODER_VARIANTS
    assert any("dry run" in note for note in record["notes"])
    assert (out / "decoders.log").read_text().startswith("== decoders (dry run, device cpu)")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_part_over_its_time_limit_times_out_and_leaves_nothing_running(dry_run) -> None:
    _, out = dry_run
    record = _read(out, "sigterm.json")
    assert record["status"] == "timeout" and record["limit_s"] == 3, record
    assert 3 <= record["seconds"] < 20 and "time limit of 3 s" in record["error"]
    assert record["results"]["checks_failed"]
    assert not _left_running(str(out))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_part_without_time_left_is_skipped(dry_run) -> None:
    _, out = dry_run
    record = _read(out, "onnx.json")
    assert record["status"] == "skipped" and "needs at least 100000 s" in record["error"], record
    assert "skipped" in (out / "onnx.log").read_text()


def test_an_unknown_part_is_refused_before_anything_runs(tmp_path) -> None:
    command = ["bash", str(SCRIPT), "--dry-run", "--out", str(tmp_path), "--parts", "fsdp nonsense"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "unknown part nonsense" in result.stderr, result.stdout + result.stderr
    assert not (tmp_path / "summary.json").exists()
