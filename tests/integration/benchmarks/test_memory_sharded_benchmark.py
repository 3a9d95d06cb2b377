"""``benchmarks/memory_sharded.py``'s ``StepMemory`` callback in a real ``mae pretrain`` run (one process, the
tiny model, the benchmark's own config): the bytes it reports are exactly those of the parameters, gradients
and AdamW state. The benchmark itself (ViT-L/16 on 2 processes, 4 runs) takes minutes; its ``--dry-run`` two
(4 two-process runs of about 30 s each) is too slow for the suite."""

import json

import memory_sharded

from mae.models import create_model
from tests.helpers import run_mae


def test_memory_sharded__step_memory_reports_the_exact_bytes_of_parameters_gradients_and_adamw_state(
    tmp_path,
):
    steps = 2
    config = memory_sharded.write_config(tmp_path, memory_sharded.TINY_MODEL, 32, 2, steps)
    run_mae(
        "pretrain",
        "--config",
        str(config),
        "--trainer.devices",
        "1",
        "--trainer.callbacks+=memory_sharded.StepMemory",
        "--trainer.callbacks.out_dir",
        str(tmp_path / "memory"),
        "--trainer.callbacks.at_step",
        str(steps),
    )
    assert sorted(p.name for p in (tmp_path / "memory").iterdir()) == ["rank0.json"]
    row = json.loads((tmp_path / "memory" / "rank0.json").read_text())
    model = create_model("mae_vit_tiny_patch4", img_size=32, **memory_sharded.TINY_MODEL["model_kwargs"])
    params = list(model.parameters())
    weights = sum(p.numel() * 4 for p in params)  # fp32
    assert row["step"] == steps and row["rank"] == 0
    assert row["parameters"] == row["gradients"] == len(params) and row["sharded_parameters"] == 0
    assert row["parameter_mib"] * 2**20 == row["gradient_mib"] * 2**20 == weights
    # AdamW: exp_avg and exp_avg_sq per weight, and a float32 step count per parameter
    assert row["optimizer_mib"] * 2**20 == 2 * weights + 4 * len(params)
    # torch alone takes 100s of MiB; the steps' peak is at least what is resident after them
    assert row["peak_rss_mib"] >= row["rss_mib"] > 100 and row["startup_peak_rss_mib"] > 100
