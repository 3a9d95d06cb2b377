import math

import pytest
import torch
from timm.optim import Lamb
from torch import nn

from mae.errors import ConfigError
from mae.models import MaskedAutoencoderViT
from mae.training.optim import (
    PRETRAIN_OPTIMIZERS,
    effective_batch_size,
    scaled_lr,
    warmup_cosine_scheduler,
    weight_decay_groups,
)
from mae.training.runtime import TrainingSettings
from mae.training.settings import PretrainOptimSettings
from tests.helpers import TINY, finetune_module, official_lr, pretrain_module


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
    assert (
        "blocks.0.attn.qkv.bias" in no_decay and "norm.weight" in no_decay and "decoder_norm.bias" in no_decay
    )
    assert all(n.endswith(".bias") or model.get_parameter(n).ndim == 1 for n in no_decay)
    assert len(decay) + len(no_decay) == len(list(model.parameters()))  # pos embeds are buffers


class _Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self._fsdp_wrapped_module = inner


def _as_fsdp_shards(module: nn.Module) -> nn.Module:
    """What FSDP (``use_orig_params=True``, Lightning's default) leaves when Lightning builds the
    optimizer: every parameter a 1-D view of its shard, names prefixed ``_fsdp_wrapped_module.``."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                sub._parameters[name] = nn.Parameter(p.detach().flatten(), requires_grad=p.requires_grad)
    return _Wrapper(module)


def _grouping(optimizer: torch.optim.Optimizer, module: nn.Module) -> dict[str, tuple]:
    """parameter name (wrappers removed) -> (weight decay, lr scale) in ``optimizer``."""
    names = {id(p): n.replace("_fsdp_wrapped_module.", "") for n, p in module.named_parameters()}
    return {
        names[id(p)]: (g["weight_decay"], g.get("lr_scale", 1.0))
        for g in optimizer.param_groups
        for p in g["params"]
    }


@pytest.mark.parametrize("kind", ["pretrain", "finetune"])
def test_param_groups__same_weight_decay_and_lr_scales_when_fsdp_flattened_the_parameters(kind):
    from timm.optim import param_groups_weight_decay

    from mae.training.runtime import TrainingSettings
    from tests.helpers import finetune_module, pretrain_module

    module = pretrain_module() if kind == "pretrain" else finetune_module()
    module.settings = TrainingSettings(precision="fp32", attention="sdpa", compile=False, fused_adamw=False)
    attribute = module.network_attribute
    plain = _grouping(module.build_optimizer(1e-3), getattr(module, attribute))
    assert any(wd > 0 for wd, _ in plain.values()) and any(wd == 0 for wd, _ in plain.values())

    wrapped = _as_fsdp_shards(getattr(module, attribute))
    # grouping the flattened parameters by ndim would decay nothing: the failure this guards against
    assert all(g["weight_decay"] == 0 for g in param_groups_weight_decay(wrapped, 0.05) if g["params"])
    setattr(module, attribute, wrapped)
    assert _grouping(module.build_optimizer(1e-3), wrapped) == plain


@pytest.mark.parametrize("kind", ["pretrain", "finetune", "linprobe"])
@pytest.mark.parametrize("fsdp", [False, True])
def test_param_groups__weight_decay_zero_builds_every_optimizer(kind, fsdp):
    """``weight_decay 0`` (timm then returns one group) and an empty no-decay set, on every optimizer
    path: AdamW for pretraining, layer-decay AdamW for fine-tuning, LARS for the linear probe."""
    from mae.training.runtime import TrainingSettings
    from tests.helpers import finetune_module, pretrain_module

    make = pretrain_module if kind == "pretrain" else finetune_module
    probe = dict(mode="linprobe", mixup=0.0, cutmix=0.0, drop_path_rate=0.0) if kind == "linprobe" else {}
    module = make(optim=dict(weight_decay=0.0), **probe)
    module.settings = TrainingSettings(precision="fp32", attention="sdpa", compile=False, fused_adamw=False)
    network = getattr(module, module.network_attribute)
    if fsdp:
        network = _as_fsdp_shards(network)
        setattr(module, module.network_attribute, network)
    optimizer = module.build_optimizer(1e-3)
    trained = {n for n, p in network.named_parameters() if p.requires_grad}
    assert set(_grouping(optimizer, network)) == {n.replace("_fsdp_wrapped_module.", "") for n in trained}
    assert all(g["weight_decay"] == 0 for g in optimizer.param_groups)


def test_weight_decay_groups__no_one_dimensional_parameters():
    groups = weight_decay_groups(nn.Sequential(nn.Linear(4, 4, bias=False)), 0.05)
    assert [(g["name"], g["weight_decay"], len(g["params"])) for g in groups] == [("decay", 0.05, 1)]
    groups = weight_decay_groups(nn.Sequential(nn.Linear(4, 4, bias=False)), 0.0)
    assert [(g["name"], g["weight_decay"], len(g["params"])) for g in groups] == [("no_decay", 0.0, 1)]


def test_schedule_settings__both_modules_refuse_them_at_build():
    for build in (pretrain_module, finetune_module):
        with pytest.raises(ValueError, match="need warmup_epochs >= 0, min_lr >= 0 and a positive lr"):
            build(optim=dict(warmup_epochs=-1))
        with pytest.raises(ValueError, match="need warmup_epochs >= 0"):
            build(optim=dict(lr=0.0))


# ---------------------------------------------------------------- CNN models, LAMB

CNN = dict(model="spark", img_size=32, model_kwargs=dict(encoder="resnet10t", mask_unit=8, decoder_width=64))


def test_encoder_decoder_groups__a_cnn_decoder_is_its_decoder_parameters_the_rest_its_timm_encoder():
    module = pretrain_module(**CNN, freeze_encoder_epochs=1)
    plan = module.param_groups
    part = {name: plan.settings[index]["encoder"] for name, index in plan.group_of.items()}
    names = dict(module.model.named_parameters())
    trained = {name for name, p in names.items() if p.requires_grad}
    assert {name for name in part if part[name]} == {name for name in trained if name.startswith("encoder.")}
    assert {name for name in part if not part[name]} == {
        name for name in trained if name.startswith("decoder.")
    }
    assert any("mask_token" in name for name in part if not part[name])  # SparK's per-scale mask tokens


def test_pretrain_optimizer__lamb_is_timms_lamb_without_its_own_clipping():
    """One LAMB step against the formula (You et al. 2020, Alg. 2): u = m / (sqrt(v) + eps) + wd * w (one
    bias-corrected step: m = g, v = g^2), then w - lr * (||w|| / ||u||) * u on a decayed tensor and w - lr * u
    on one without decay (timm and SparK adapt decayed tensors only). The gradient's norm (40) is far above
    timm's default clipping (1.0), which would change both."""
    torch.manual_seed(0)
    weight, bias = nn.Parameter(torch.randn(4, 5)), nn.Parameter(torch.randn(5))
    grads = [g * 40 / g.norm() for g in (torch.randn(4, 5), torch.randn(5))]
    for p, g in zip((weight, bias), grads, strict=True):
        p.grad = g.clone()
    start = [weight.detach().clone(), bias.detach().clone()]
    groups = [{"params": [weight], "weight_decay": 0.1}, {"params": [bias], "weight_decay": 0.0}]
    optimizer = PRETRAIN_OPTIMIZERS["lamb"](groups, 0.1, (0.9, 0.95), True)
    assert isinstance(optimizer, Lamb)
    optimizer.step()
    update = grads[0] / (grads[0].abs() + 1e-6) + 0.1 * start[0]
    assert torch.allclose(
        weight.detach(), start[0] - 0.1 * (start[0].norm() / update.norm()) * update, atol=1e-6
    )
    assert torch.allclose(bias.detach(), start[1] - 0.1 * grads[1] / (grads[1].abs() + 1e-6), atol=1e-6)


def test_pretrain_optim__an_unknown_optimizer_is_refused_by_name():
    assert PretrainOptimSettings().optimizer == "adamw"  # the MAE paper's, the default
    with pytest.raises(ConfigError, match=r"^model.optim.optimizer must be one of adamw, lamb; got 'sgd'"):
        PretrainOptimSettings(optimizer="sgd")
    module = pretrain_module(optim=dict(optimizer="lamb", warmup_epochs=0))
    module.settings = TrainingSettings(precision="fp32", attention="sdpa", compile=False, fused_adamw=True)
    assert isinstance(module.build_optimizer(1e-3), Lamb)
