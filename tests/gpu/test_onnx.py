"""onnx: an encoder trained on the GPU, exported to ONNX (``mae.convert.onnx_encoder.export_onnx``, which
checks it with onnxruntime against torch on the CPU) and compared with the encoder run on the GPU (dry run:
the tiny model trained 3 steps on the CPU in fp32)."""

from collections.abc import Iterator
from contextlib import contextmanager

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from tests.gpu.callbacks import differing, state_digest
from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart

pytestmark = pytest.mark.timeout(LIMITS["onnx"][0])
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def differences(smoke: SmokePart) -> dict[str, float]:
    """The whole part (under the first test's time limit): train, export, compare."""
    _train(smoke)
    return _compare_with_onnxruntime(smoke)


def _train(smoke: SmokePart) -> None:
    """The default job's model trained a few steps on the device; its checkpoint is ``work/trained.ckpt``."""
    from mae.data import DigitsDataModule
    from mae.training.pretrain import MAEPretrainModule

    steps, img_size, batch = (3, 16, 8) if smoke.dry_run else (50, 32, 64)
    if smoke.dry_run:
        smoke.note("dry run: the tiny model trained 3 steps on the CPU in fp32")
    pl.seed_everything(0)
    module = MAEPretrainModule(img_size=img_size, **smoke.default_job_model())
    before = state_digest(module.model.state_dict())
    trainer = pl.Trainer(
        accelerator=smoke.accelerator,
        devices=1,
        precision=smoke.precision,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=smoke.work,
    )
    trainer.fit(module, datamodule=DigitsDataModule(img_size=img_size, batch_size=batch))
    trainer.save_checkpoint(smoke.work / "trained.ckpt")
    smoke.results.update(
        trained_on=str(trainer.strategy.root_device),
        steps=trainer.global_step,
        expected_steps=steps,
        img_size=img_size,
        precision=smoke.precision,
        tensors_changed_by_training=len(differing(before, state_digest(module.model.state_dict()))),
    )


def _compare_with_onnxruntime(smoke: SmokePart) -> dict[str, float]:
    """The ONNX file's largest difference from the encoder on the device, by onnxruntime provider."""
    import onnxruntime

    from mae.convert.backbone import load_backbone
    from mae.convert.onnx_encoder import INPUT_NAME, export_onnx

    ckpt, onnx_path, img_size = (
        smoke.work / "trained.ckpt",
        smoke.work / "encoder.onnx",
        smoke.results["img_size"],
    )
    export = export_onnx(ckpt, onnx_path, dynamic_batch=True)
    smoke.results.update(
        onnx_file=str(onnx_path),
        opset=export.opset,
        onnx_mb=onnx_path.stat().st_size / 2**20,
        input_shape=export.input_shape,
        output_shape=export.output_shape,
        export_check_vs_torch_cpu={str(k): v for k, v in export.differences.items()},
    )
    pixels = torch.randn(4, 3, img_size, img_size, generator=torch.Generator().manual_seed(1))
    with _no_tf32():  # the encoder on the device in fp32
        backbone = load_backbone(str(ckpt)).eval().to(smoke.device)
        with torch.no_grad():
            expected = backbone.forward_features(pixels.to(smoke.device)).float().cpu().numpy()
    providers = onnxruntime.get_available_providers()
    differences = {}
    for provider in [p for p in ("CPUExecutionProvider", "CUDAExecutionProvider") if p in providers]:
        session = onnxruntime.InferenceSession(str(onnx_path), providers=[provider])
        (got,) = session.run(None, {INPUT_NAME: pixels.numpy()})
        differences[provider] = float(np.abs(got - expected).max())
    smoke.results.update(onnxruntime_providers=providers, vs_encoder_on_device=differences)
    return differences


@contextmanager
def _no_tf32() -> Iterator[None]:
    """TF32 matmuls and convolutions off, restored after. Set and restored by hand: these flags are
    properties of torch's backend modules, which pytest 9.2's monkeypatch deletes on undo (an error)."""
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn)
    before = [flag.allow_tf32 for flag in flags]
    for flag in flags:
        flag.allow_tf32 = False
    try:
        yield
    finally:
        for flag, value in zip(flags, before, strict=True):
            flag.allow_tf32 = value


def test_the_encoder_trains_on_the_device(differences: dict[str, float], smoke: SmokePart) -> None:
    results = smoke.results
    assert results["trained_on"].startswith(smoke.device), f"trained on {results['trained_on']}"
    trained_steps = (results["steps"], results["tensors_changed_by_training"] > 0)
    assert trained_steps == (results["expected_steps"], True), f"(steps, changed tensors) {trained_steps}"


def test_onnxruntime_matches_the_encoder_on_the_device(
    differences: dict[str, float], smoke: SmokePart
) -> None:
    assert differences, "no onnxruntime provider ran the file"
    off = {p: d for p, d in differences.items() if not d <= TOLERANCE}
    assert not off, f"onnxruntime differs from the encoder on {smoke.device} by {off}"


def test_it_records_the_results(differences: dict[str, float], smoke: SmokePart) -> None:
    """The results the docs read."""
    assert not smoke.missing_records(), smoke.missing_records()
