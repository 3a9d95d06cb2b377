"""benchmarks/coreset.py at tiny sizes (``--quick``): the selection timed and its coverage radius equal to the
plain greedy's at every size the plain greedy ran to the end, the candidates' sweep, the files it claims."""

import json

import coreset
import pytest

pytestmark = pytest.mark.slow  # runs the benchmark's cases end to end


def test_coreset_benchmark__quick_run_covers_as_the_plain_greedy(tmp_path):
    out = tmp_path / "coreset"
    coreset.main(["--quick", "--out", str(out)])
    record = json.loads((out / "results.json").read_text())
    cases = record["cases"]
    assert cases and all(case["selection_s"] > 0 for case in cases)
    ratios = [case["radius_ratio"] for case in cases if case.get("radius_ratio") is not None]
    assert ratios and all(ratio == pytest.approx(1.0, abs=1e-6) for ratio in ratios)
    assert len(record["candidates_sweep"]) == 4
    assert (out / "results.md").read_text().startswith("| vectors (data, M) | k |")
