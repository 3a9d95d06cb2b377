"""Device-dependent training settings: precision, attention kernel, allocator."""

import pytest
import torch

from mae.models import create_model
from mae.training import runtime
from mae.training.runtime import TrainingSettings, set_attention_kernel, training_settings
from tests.helpers import LabelledImages, RandomImages, finetune_module, make_trainer, pretrain_module


def test_attention_kernels__same_loss_and_gradients():
    torch.manual_seed(0)
    model = create_model("mae_vit_tiny_patch4", img_size=32, depth=2, decoder_depth=1)
    imgs = torch.randn(3, 3, 32, 32)
    noise = torch.rand(3, model.num_patches)
    results = {}
    for kernel in ("sdpa", "explicit"):
        set_attention_kernel(model, kernel)
        assert all(b.attn.fused_attn == (kernel == "sdpa") for b in [*model.blocks, *model.decoder_blocks])
        model.zero_grad()
        loss = model(imgs, 0.75, noise)[0]
        loss.backward()
        results[kernel] = (loss.detach(), model.blocks[0].attn.qkv.weight.grad.clone())
    torch.testing.assert_close(results["sdpa"][0], results["explicit"][0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(results["sdpa"][1], results["explicit"][1], atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="'sdpa' or 'explicit'"):
        set_attention_kernel(model, "flash")


@pytest.mark.parametrize("bf16", [True, False])
def test_training_settings__per_device(monkeypatch, bf16):
    monkeypatch.setattr(runtime, "native_bf16", lambda device: bf16)
    cpu = training_settings("cpu")
    assert cpu.precision == ("bf16" if bf16 else "fp32")
    assert cpu.attention == ("explicit" if bf16 else "sdpa")  # SDPA's CPU bf16 path is the slow one
    gpu = training_settings("cuda")
    assert gpu.attention == "sdpa" and gpu.fused_adamw
    assert (
        TrainingSettings("bf16", "explicit", True, True).describe()
        == "bf16 + explicit + compile + fused AdamW"
    )


def test_native_bf16__matches_the_machine():
    flags = open("/proc/cpuinfo").read()
    assert runtime.native_bf16("cpu") == any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


def test_keep_freed_memory__set_on_linux_glibc():
    assert runtime.keep_freed_memory() is True


def test_training_settings__compile_only_for_runs_that_repay_it():
    assert not training_settings("cpu", "fp32", steps=runtime.COMPILE_MIN_STEPS - 1).compile
    assert training_settings("cpu", "fp32", steps=runtime.COMPILE_MIN_STEPS).compile
    assert training_settings("cpu", "fp32").compile  # a long run


def _fit(tmp_path, precision, **module_kwargs):
    module = pretrain_module(optim=dict(warmup_epochs=0), **module_kwargs)
    trainer = make_trainer(tmp_path, max_steps=2, precision=precision, limit_val_batches=0)
    trainer.fit(module, datamodule=RandomImages(n=8))
    return module, trainer


def test_pretrain_module__resolves_settings_for_device_precision_and_length(tmp_path):
    module, _ = _fit(tmp_path, "bf16-mixed")
    assert module.settings == TrainingSettings("bf16", "explicit", compile=False, fused_adamw=True)  # 2 steps
    assert all(not b.attn.fused_attn for b in module.model.blocks)
    module, trainer = _fit(tmp_path, "32-true", kernels=dict(attention="explicit", fused_adamw=False))
    assert module.settings == TrainingSettings("fp32", "explicit", compile=False, fused_adamw=False)
    assert not trainer.optimizers[0].defaults["fused"]
    with pytest.raises(ValueError, match="model.kernels.attention"):
        pretrain_module(kernels=dict(attention="flash"))


@pytest.mark.slow
def test_pretrain_module__compiled_model_trains_and_saves_plain_names(tmp_path):
    torch.manual_seed(0)
    eager, _ = _fit(tmp_path, "32-true", kernels=dict(compile=False))
    torch.manual_seed(0)
    compiled, trainer = _fit(tmp_path, "32-true", kernels=dict(compile=True))
    assert compiled.settings.compile and compiled.model._compiled_call_impl is not None
    imgs, noise = torch.randn(4, 3, 16, 16), torch.rand(4, compiled.model.num_patches)
    torch.testing.assert_close(
        compiled.model(imgs, 0.75, noise)[0], eager.model(imgs, 0.75, noise)[0], atol=1e-5, rtol=1e-5
    )
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    keys = torch.load(tmp_path / "c.ckpt", weights_only=True)["state_dict"]
    assert "model.cls_token" in keys and not any("_orig_mod" in k for k in keys)


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_finetune_module__uses_the_settings_of_its_device_and_precision(tmp_path, precision):
    module = finetune_module()
    trainer = make_trainer(tmp_path, max_steps=1, precision=precision, limit_val_batches=0)
    trainer.fit(module, datamodule=LabelledImages())
    bf16 = precision == "bf16-mixed"
    assert module.settings.precision == ("bf16" if bf16 else "fp32")
    assert module.settings.attention == ("explicit" if bf16 else "sdpa")  # on CPU
    assert all(b.attn.fused_attn == (not bf16) for b in module.vit.blocks)
    assert trainer.optimizers[0].defaults["fused"] == module.settings.fused_adamw
