"""Activation checkpointing (``model.grad_checkpointing``): every encoder and decoder block is run again in
the backward pass, and the loss and every gradient are those of the same step without it (same seed), for
pretraining with each decoder switch, a smaller phase of progressive resolution, ``torch.compile``,
fine-tuning with drop path, and segmentation."""

import pytest
import torch
from torch import nn

from mae.models import create_model
from tests.helpers import TINY, finetune_module

# each decoder switch: the paper's, partial reconstruction, CrossMAE, CrossMAE reading two encoder layers
SWITCHES = {
    "self": {},
    "partial": {"decoder_keep_ratio": 0.5},
    "cross": {"decoder_type": "cross"},
    "cross_layers": {"decoder_type": "cross", "decoder_encoder_layers": [0, 1]},
}
FP32 = dict(rtol=0, atol=1e-6)


def _count_block_runs(blocks: list[nn.Module]) -> list[int]:
    """A counter per block of the times it is called: forward pre-hooks, which also fire when a checkpointed
    block is recomputed in the backward pass."""
    runs = [0] * len(blocks)
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda *_, i=i: runs.__setitem__(i, runs[i] + 1))
    return runs


def _gradients(network: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in network.named_parameters() if p.grad is not None}


def _pretraining_step(
    checkpointing: bool, switches: dict, img_size: int | None = None, compile_backend: str | None = None
):
    """(loss, gradients, runs of each block) of one step of the seeded tiny MAE on a seeded batch."""
    torch.manual_seed(0)
    model = create_model("mae_vit_tiny_patch4", **{**TINY, **switches})
    model.set_grad_checkpointing(checkpointing)
    if img_size is not None:
        model.set_img_size(img_size)
    runs = _count_block_runs([*model.blocks, *model.decoder_blocks])
    imgs = torch.randn(3, 3, img_size or TINY["img_size"], img_size or TINY["img_size"])
    forward = torch.compile(model, backend=compile_backend) if compile_backend else model
    torch.manual_seed(1)  # the masks and the decoded patches
    loss, _, _ = forward(imgs, 0.75)
    loss.backward()
    return loss.detach(), _gradients(model), runs


def _assert_equal_steps(plain, checkpointed, tolerance=FP32) -> None:
    (loss, grads, runs), (loss_c, grads_c, runs_c) = plain, checkpointed
    assert runs == [1] * len(runs) and runs_c == [2] * len(runs_c)  # each block recomputed once
    torch.testing.assert_close(loss_c, loss, **tolerance)
    assert grads_c.keys() == grads.keys() and len(grads) > 10
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, **tolerance, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("switches", SWITCHES.values(), ids=SWITCHES.keys())
def test_pretraining__same_loss_and_gradients_with_every_block_recomputed(switches):
    _assert_equal_steps(_pretraining_step(False, switches), _pretraining_step(True, switches))


def test_pretraining_in_bf16__same_loss_and_gradients_as_bf16_allows():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, checkpointed = _pretraining_step(False, {}), _pretraining_step(True, {})
    # the recomputation runs under the same autocast, so the same bf16 roundings: equal up to bf16's step
    _assert_equal_steps(plain, checkpointed, tolerance=dict(rtol=8e-3, atol=1e-5))


def test_pretraining_at_a_smaller_resolution_phase__same_loss_and_gradients():
    _assert_equal_steps(_pretraining_step(False, {}, img_size=16), _pretraining_step(True, {}, img_size=16))


def test_pretraining_compiled__same_loss_and_gradients():
    """Dynamo traces the checkpointed blocks (``aot_eager``: the graph capture ``model.kernels.compile`` does,
    without inductor's code generation)."""
    plain = _pretraining_step(False, {"decoder_type": "cross"})
    compiled = _pretraining_step(True, {"decoder_type": "cross"}, compile_backend="aot_eager")
    _assert_equal_steps(plain, compiled)


def test_fine_tuning_with_drop_path__same_loss_and_gradients():
    """The recomputed blocks draw the same drop-path masks (the checkpoint restores the RNG state)."""
    steps = []
    for checkpointing in (False, True):
        module = finetune_module(grad_checkpointing=checkpointing, drop_path_rate=0.5, mixup=0, cutmix=0)
        assert (
            module.vit.grad_checkpointing == checkpointing
            and module.hparams.grad_checkpointing == checkpointing
        )
        runs = _count_block_runs(list(module.vit.blocks))
        module.train()
        torch.manual_seed(1)
        imgs, targets = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 0])
        loss = module.train_criterion(module(imgs), targets)
        loss.backward()
        steps.append((loss.detach(), _gradients(module.vit), runs))
    _assert_equal_steps(*steps)


def test_segmentation__same_loss_and_gradients():
    from mae.dense.tasks.segmentation import MAESegmentationModule

    steps = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model_kwargs = {key: value for key, value in TINY.items() if key != "img_size"}
        encoder = {"model": "mae_vit_tiny_patch4", "model_kwargs": model_kwargs}
        module = MAESegmentationModule(
            encoder=encoder,
            img_size=16,
            num_classes=3,
            out_channels=16,
            drop_path_rate=0.5,
            grad_checkpointing=checkpointing,
        ).train()
        assert module.pyramid.grad_checkpointing == checkpointing
        runs = _count_block_runs(list(module.encoder.blocks))
        torch.manual_seed(1)
        images, masks = torch.rand(2, 3, 16, 16), torch.randint(0, 3, (2, 16, 16))
        loss = module.loss(module(images), masks)
        loss.backward()
        steps.append((loss.detach(), _gradients(module), runs))
    _assert_equal_steps(*steps)
