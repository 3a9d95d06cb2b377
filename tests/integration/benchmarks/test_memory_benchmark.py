"""``benchmarks/memory.py --dry-run``: the activation-memory benchmark walked with a tiny model, each case in
a process of its own, writing the results file the performance page reads."""

import json
import subprocess
import sys

from tests.helpers import REPO


def test_memory_benchmark__dry_run_measures_each_case_with_and_without_checkpointing(tmp_path):
    out = tmp_path / "memory.json"
    command = [sys.executable, str(REPO / "benchmarks" / "memory.py"), "--dry-run", "--out", str(out)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["dry_run"] and results["cases_done"] == "2 of 2" and len(results["rows"]) == 4
    assert [(r["task"], r["grad_checkpointing"]) for r in results["rows"]] == [
        ("pretrain", False),
        ("pretrain", True),
        ("finetune", False),
        ("finetune", True),
    ]
    for row in results["rows"]:
        assert row["peak_mib"] >= row["baseline_mib"] > 100 and row["step_s"] > 0  # torch alone takes 100 MiB
        assert abs(row["activation_mib"] - (row["peak_mib"] - row["baseline_mib"])) <= 1  # each rounded
    assert [s["task"] for s in results["summary"]] == ["pretrain", "finetune"]
    assert "pretrain tiny 32 px batch 2: activation" in result.stdout
