import math

import pytest
import torch

from mae.models import MaskedAutoencoderViT
from mae.training.optim import (
    effective_batch_size,
    official_lr,
    scaled_lr,
    warmup_cosine_scheduler,
    weight_decay_groups,
)
from tests.helpers import TINY


def _lrs(total: int, warmup: int, lr: float, min_lr: float) -> list[float]:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = warmup_cosine_scheduler(opt, total, warmup, min_lr)
    out = []
    for step in range(total + 1):
        out.append(opt.param_groups[0]["lr"])
        sched.step_update(step + 1)
    return out


def test_schedule__warmup_start_end_mid_cosine_and_end():
    lr, min_lr = 1e-3, 1e-5
    lrs = _lrs(total=100, warmup=10, lr=lr, min_lr=min_lr)
    assert lrs[0] == 0.0
    assert lrs[5] == pytest.approx(lr / 2)
    assert lrs[10] == pytest.approx(lr)  # warmup end
    assert lrs[55] == pytest.approx((lr + min_lr) / 2)  # middle of the cosine
    assert lrs[100] == pytest.approx(min_lr)


def test_schedule__equals_official_formula_at_fractional_epochs():
    steps_per_epoch, epochs, warmup_epochs, lr, min_lr = 7, 5, 1.5, 2e-3, 1e-6
    total = steps_per_epoch * epochs
    warmup_steps = round(warmup_epochs * steps_per_epoch)  # 10.5 -> 10; exact when whole
    lrs = _lrs(total, warmup_steps, lr, min_lr)
    for step in range(total):
        expected = official_lr(step / steps_per_epoch, lr, min_lr, warmup_steps / steps_per_epoch, epochs)
        assert lrs[step] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_schedule__warmup_longer_than_run_is_an_error():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="warmup"):
        warmup_cosine_scheduler(opt, total_steps=10, warmup_steps=10)


def test_lr_scaling__counts_devices_nodes_and_accumulation():
    assert effective_batch_size(64, devices=8, nodes=8) == 4096
    assert effective_batch_size(64, devices=8, nodes=1, accumulate=8) == 4096
    assert effective_batch_size(512, devices=1, accumulate=8) == 4096
    assert scaled_lr(1.5e-4, 4096) == pytest.approx(2.4e-3)  # the paper's ViT-B lr
    assert math.isclose(scaled_lr(1.5e-4, effective_batch_size(32, 2, 1, 4)), 1.5e-4)


def test_weight_decay_groups__official_grouping():
    model = MaskedAutoencoderViT(**TINY)
    groups = weight_decay_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    by_decay = {g["weight_decay"]: {names[id(p)] for p in g["params"]} for g in groups}
    decay, no_decay = by_decay[0.05], by_decay[0.0]
    assert "blocks.0.attn.qkv.weight" in decay and "decoder_pred.weight" in decay
    assert "patch_embed.proj.weight" in decay
    # the official grouping excludes only biases and 1-D tensors: tokens (1, 1, D) are decayed
    assert {"cls_token", "mask_token"} <= decay
    assert "blocks.0.attn.qkv.bias" in no_decay and "norm.weight" in no_decay and "decoder_norm.bias" in no_decay
    assert all(n.endswith(".bias") or model.get_parameter(n).ndim == 1 for n in no_decay)
    assert len(decay) + len(no_decay) == len(list(model.parameters()))  # pos embeds are buffers
