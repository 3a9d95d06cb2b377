"""Smoke runs of benchmarks/throughput.py and benchmarks/dataloader.py at tiny sizes
(numbers live in README)."""

import tempfile

import dataloader
import pytest
import throughput
import torch

from mae.convert.huggingface import save_hf_pretrained
from mae.training.runtime import TrainingSettings, training_settings
from tests.helpers import ONE_TIMED_STEP, REPO


@pytest.mark.slow
def test_throughput_benchmark__interleaved_table_against_hugging_face(tmp_path, capsys):
    rows = throughput.main(
        [
            "--configs",
            "cifar",
            "--batch-size",
            "2",
            *ONE_TIMED_STEP,
            "--variants",
            "peers",
            "--no-memory",
            "--json",
            str(tmp_path / "rows.json"),
        ]
    )
    assert [r["impl"] for r in rows] == ["hf", "ours"] * 4
    best_hf = max(r["img_s"] for r in rows if r["impl"] == "hf")
    for r in rows:
        assert r["img_s"] > 0 and r["gflops"] > 0 and 0 < r["peak_fraction"]
        assert r["vs_hf_best"] == pytest.approx(r["img_s"] / best_hf)
    out = capsys.readouterr().out
    assert "matmul peak" in out and "| cifar (batch 2) | hf bf16 + explicit |" in out
    assert (tmp_path / "rows.json").stat().st_size > 0


@pytest.mark.slow
def test_throughput_benchmark__contenders_and_memory_probe():
    default = [c for c in throughput.contenders(torch.device("cpu"), ["default", "ablations"])]
    assert default[0].settings == training_settings("cpu") and default[0].name.startswith("ours default")
    assert {c.settings.compile for c in default} == {True, False}  # each choice flipped once
    assert {c.settings.fused_adamw for c in default} == {True, False}
    plain = TrainingSettings(precision="fp32", attention="sdpa", compile=False, fused_adamw=False)
    mib = throughput.cpu_peak_memory_mib(throughput.Contender("ours", plain), "cifar", 32, "kept", steps=1)
    assert 10 < mib < 2000  # activations of 32 images, gradients and AdamW state of a 6M-parameter model


@pytest.mark.slow
def test_throughput_benchmark__shipped_allocators_time_each_block_in_its_own_process(tmp_path):
    """``--allocator shipped``: ours keeps freed memory (as train.py), Hugging Face runs with glibc's
    defaults, each timed block in a fresh process with that setting."""
    plain = TrainingSettings(precision="fp32", attention="explicit", compile=False, fused_adamw=False)
    ours, hf = throughput.Contender("ours", plain), throughput.Contender("hf", plain)
    assert [throughput.process_allocator(c, "shipped") for c in (ours, hf)] == ["kept", "glibc"]
    assert [throughput.process_allocator(c, "glibc") for c in (ours, hf)] == ["glibc", "glibc"]
    options = ["--allocator", "shipped", "--batch-size", "2", "--warmup", "1", "--steps", "1"]
    args = throughput.build_parser().parse_args(options)
    save_hf_pretrained(throughput.reference_model(throughput.CONFIGS["cifar"]["model"]), tmp_path, 0.75)
    for contender in (ours, hf):
        seconds, faults, memory = throughput.timed_block_in_process(contender, "cifar", args, str(tmp_path))
        assert seconds > 0 and faults >= 0 and memory is None  # CPU: no CUDA peak


def test_throughput_benchmark__same_step_as_hugging_face():
    """Both contenders run the same computation: equal losses, step after step, from the same weights
    and masks."""
    spec = throughput.CONFIGS["cifar"]["model"]
    plain = TrainingSettings(precision="fp32", attention="explicit", compile=False, fused_adamw=False)
    with tempfile.TemporaryDirectory() as hf_dir:
        save_hf_pretrained(throughput.reference_model(spec), hf_dir, throughput.MASK_RATIO)
        losses = {}
        for impl in ("ours", "hf"):
            step = throughput.build_step(
                throughput.Contender(impl, plain), spec, torch.device("cpu"), hf_dir, 2
            )
            losses[impl] = [float(step()) for _ in range(3)]
    assert losses["ours"][0] == pytest.approx(losses["hf"][0], abs=1e-6)  # the same forward
    # Adam's first update is +-lr per element whatever the gradient's size, so float-level gradient
    # differences near zero flip a few elements: later losses agree to 0.1 %, not to the last digit
    assert losses["ours"][1:] == pytest.approx(losses["hf"][1:], rel=1e-3)


def test_dataloader_benchmark__ours_streamed_and_torchvision_on_generated_jpegs(capsys):
    rows = dataloader.main(
        [
            "--images",
            "20",
            "--img-sizes",
            "32",
            "--batch-size",
            "4",
            "--batches",
            "2",
            "--rounds",
            "2",
            "--decode-device",
            "cpu",
        ]
    )
    assert len(rows) == 1 and rows[0]["torchvision"] > 0 and rows[0]["ours"] > 0 and rows[0]["streamed"] > 0
    assert rows[0]["ours_normalised"] < rows[0]["ours"]  # the same batches, plus their normalisation
    # bytes only: faster
    assert rows[0]["encoded_worker"] > rows[0]["streamed"] and rows[0]["device_decode"] > 0
    assert rows[0]["workers_gpu_decode"] >= 1
    assert "| 32 px |" in capsys.readouterr().out


def test_throughput_benchmark__times_registered_models_with_the_modules_optimizer_and_gpu_script_is_valid():
    """Every config is a registered model (base224 / large224 the paper's ViT-B/16 and ViT-L/16); our
    step's optimizer has the pretraining module's weight-decay groups; the default run leaves ViT-L
    out; benchmarks/gpu_check.sh parses and only names configs the benchmark has."""
    import re
    import subprocess

    from mae.models import MODEL_REGISTRY
    from mae.training.optim import weight_decay_groups

    assert all(c["model"] in MODEL_REGISTRY for c in throughput.CONFIGS.values())
    assert throughput.CONFIGS["base224"]["model"] == "mae_vit_base_patch16"
    assert throughput.CONFIGS["large224"]["model"] == "mae_vit_large_patch16"
    plain = TrainingSettings(precision="fp32", attention="sdpa", compile=False, fused_adamw=False)
    step = throughput.build_step(
        throughput.Contender("ours", plain), "mae_vit_tiny_patch4", torch.device("cpu"), "", 2
    )
    decayed = {g["name"]: (g["weight_decay"], len(g["params"])) for g in step.optimizer.param_groups}
    expected = weight_decay_groups(throughput.reference_model("mae_vit_tiny_patch4"), 0.05)
    assert decayed == {g["name"]: (g["weight_decay"], len(g["params"])) for g in expected}
    assert throughput.build_parser().parse_args([]).configs == ["cifar", "tiny224", "base224"]
    script = REPO / "benchmarks" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    named = re.findall(r"^bench (\w+) ", script.read_text(), flags=re.MULTILINE)
    assert named[0] == "base224" and set(named) == set(throughput.CONFIGS)
