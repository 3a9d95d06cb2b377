"""The distillation module (``mae.training.distill``): the teacher frozen and outside the module's state, its
identity recorded, the student's checkpoint record, the parameters the relations do not reach frozen, the
grids mapped, and every setting that cannot work refused when the module is built."""

import pytest
import torch

from mae.convert.backbone import load_backbone
from mae.errors import ConfigError, MissingFileError
from mae.training.distill import MAEDistillModule
from tests.helpers import RandomImages, make_trainer, tiny_pretraining_checkpoint

STUDENT = dict(patch_size=4, embed_dim=32, depth=2, num_heads=2)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A tiny pretraining checkpoint (16x16 inputs, 4-px patches, 2 heads)."""
    return str(tiny_pretraining_checkpoint(tmp_path_factory.mktemp("distill_teacher")))


def _module(checkpoint: str, **kwargs) -> MAEDistillModule:
    torch.manual_seed(0)
    defaults = dict(
        teacher={"checkpoint": checkpoint}, student_kwargs=STUDENT, img_size=16, optim={"warmup_epochs": 0}
    )
    return MAEDistillModule(**{**defaults, **kwargs})


def test_module__teacher_frozen_outside_the_state_identity_recorded(teacher, tmp_path):
    module = _module(teacher)
    assert all(not name.startswith("_teacher") for name in module.state_dict())
    assert not any(p is q for p in module.parameters() for q in module.teacher.parameters())
    assert not module.teacher.training and not any(p.requires_grad for p in module.teacher.parameters())
    identity = module.hparams.teacher_identity
    assert identity["path"] == teacher and len(identity["sha256"]) == 64 and identity["num_heads"] == 2
    # The relations use the last block up to its qkv: the rest of it and the final norm get no gradient.
    last = module.student.blocks[-1]
    assert last.attn.qkv.weight.requires_grad and last.norm1.weight.requires_grad
    assert not any(p.requires_grad for p in [*last.mlp.parameters(), *last.attn.proj.parameters()])
    assert not module.student.norm.weight.requires_grad
    trainer = make_trainer(tmp_path, max_steps=2, limit_val_batches=1)
    trainer.fit(module, datamodule=RandomImages())
    assert module.teacher.training is False
    trainer.save_checkpoint(tmp_path / "student.ckpt")
    saved = torch.load(tmp_path / "student.ckpt", weights_only=False)
    assert all(key.startswith("student.") for key in saved["state_dict"])
    assert saved["hyper_parameters"]["teacher_identity"] == identity
    vit = load_backbone(tmp_path / "student.ckpt").eval()
    imgs = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(vit.forward_features(imgs), module.student.eval().forward_features(imgs))


def test_module__teacher_with_other_patches_sees_the_images_on_the_students_grid(teacher):
    module = _module(teacher, student_kwargs={**STUDENT, "patch_size": 2})  # 8x8 grid at 16 px
    assert tuple(module.teacher.patch_embed.img_size) == (32, 32)  # its 4-px patches: the same 8x8 grid
    loss = module.distillation_loss(torch.randn(2, 3, 16, 16))
    assert torch.isfinite(loss.total) and loss.total > 0


def test_module__resuming_with_another_teacher_is_refused(teacher):
    module = _module(teacher)
    recorded = {**module.hparams.teacher_identity, "sha256": "0" * 64}
    with pytest.raises(ConfigError, match="was trained with the teacher .* of sha256 0000"):
        module.on_load_checkpoint({"hyper_parameters": {"teacher_identity": recorded}})
    module.on_load_checkpoint({"hyper_parameters": {"teacher_identity": module.hparams.teacher_identity}})


def test_module__refusals_at_start_up(teacher, tmp_path):
    with pytest.raises(MissingFileError, match="model.teacher.checkpoint /no/teacher.ckpt does not exist"):
        _module("/no/teacher.ckpt")
    with pytest.raises(ConfigError, match="model.teacher.checkpoint is not set"):
        _module(teacher, teacher={})
    with pytest.raises(ConfigError, match="model.teacher.normalize is true"):
        _module(teacher, teacher={"checkpoint": teacher, "normalize": True})
    with pytest.raises(ConfigError, match="model.teacher.block 3 is not a block of a 1-block ViT"):
        _module(teacher, teacher={"checkpoint": teacher, "block": 3})
    with pytest.raises(ConfigError, match="data.img_size 18x18 is not a whole number of the student's 4-px"):
        _module(teacher, img_size=18)
    with pytest.raises(ConfigError, match="model.student is not a plain ViT .*'reg_token'"):
        _module(teacher, student_kwargs={**STUDENT, "reg_tokens": 1})
    three_heads = tiny_pretraining_checkpoint(
        tmp_path,
        steps=1,
        model_kwargs=dict(
            embed_dim=48, depth=1, num_heads=3, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2
        ),
    )
    with pytest.raises(ConfigError, match="cannot be split into the teacher's 3 relation heads"):
        _module(str(three_heads))


def test_module__fsdp2_is_refused_by_name(teacher, monkeypatch):
    from types import SimpleNamespace

    from mae.training.sharding import FSDP2Strategy

    module = _module(teacher)
    sharded = SimpleNamespace(strategy=FSDP2Strategy.__new__(FSDP2Strategy))
    monkeypatch.setattr(MAEDistillModule, "trainer", property(lambda self: sharded))
    with pytest.raises(ConfigError, match="mae distill cannot train under FSDP2"):
        module.setup("fit")
