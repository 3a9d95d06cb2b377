"""Smoke run of benchmarks/quality.py at tiny sizes (the real numbers live in README)."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quality_benchmark__tiny_run_writes_table_and_plots(tmp_path):
    spec = importlib.util.spec_from_file_location("quality", REPO / "benchmarks" / "quality.py")
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)
    tiny = {"embed_dim": 32, "depth": 1, "num_heads": 2, "decoder_embed_dim": 32, "decoder_depth": 1,
            "decoder_num_heads": 2}  # fmt: skip
    table = quality.main([
        "--seeds", "0", "--pretrain-epochs", "1", "--pretrain-warmup", "0", "--probe-epochs", "1",
        "--finetune-epochs", "2", "--model-kwargs", json.dumps(tiny), "--batch-size", "128", "--out", str(tmp_path),
    ])  # fmt: skip
    assert "| MAE-pretrained (1 epochs) |" in table and "| random init (from scratch) |" in table
    for name in ("results.md", "results.json", "pretrain_loss.png", "accuracy.png"):
        assert (tmp_path / name).stat().st_size > 0
    results = json.loads((tmp_path / "results.json").read_text())[0]
    assert set(results["mae"]) == {"kNN", "linear probe", "fine-tune 10% labels", "fine-tune 100% labels"}
    assert all(0 <= v <= 100 for tag in ("mae", "random") for v in results[tag].values())
