"""The anomaly benchmark (``benchmarks/anomaly.py``) at tiny size: its table, results and figures."""

import importlib.util
import json

from tests.helpers import REPO
from tests.unit.apps.anomaly.trees import SIZE


def test_anomaly_benchmark__tiny_run_writes_the_table_and_figures(smooth_checkpoint, tmp_path):
    spec = importlib.util.spec_from_file_location("anomaly_benchmark", REPO / "benchmarks" / "anomaly.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    tables = benchmark.main(
        [
            "--tasks-to-run",
            "digits",
            "--checkpoint",
            str(smooth_checkpoint),
            "--seeds",
            "0",
            "1",
            "--num-normal",
            "12",
            "--num-test",
            "8",
            "--img-size",
            str(SIZE),
            "--tasks",
            str(tmp_path / "tasks"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    header, _, *rows = tables["digits"].splitlines()
    assert "F1 at the threshold" in header and "CPU s per seed" in header
    assert [row.split(" | ")[0] for row in rows] == [f"| {name}" for name in benchmark.SCORERS]
    out = tmp_path / "out" / "anomaly_digits"
    record = json.loads((out / "results.json").read_text())
    for runs in record["results"].values():
        assert len(runs) == 2 and all(0 <= run["image_f1"] <= 1 and run["cpu_seconds"] > 0 for run in runs)
    # the random encoder: another network than the pretrained one, drawn anew with each seed
    fingerprints = {
        json.loads((out / seed / tag / "metrics.json").read_text())["settings"]["fingerprint"]
        for seed in ("seed0", "seed1")
        for tag in ("features", "random")
    }
    assert len(fingerprints) == 3
    for name in ("table.md", "auroc.png", "heatmaps_seed0.png"):
        assert (out / name).stat().st_size > 0
