"""``mae.training.teacher``: a frozen teacher read from our checkpoints, a timm safetensors export and a
Hugging Face folder (the same tokens as ``load_backbone``'s encoder), its identity and hash; and the
pretraining module that reads it for ``model.target features``: refused settings at start-up, the teacher
out of the state dict and the checkpoint, a resume with another teacher refused naming both hashes."""

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from mae.convert.architecture import mae_record
from mae.convert.backbone import load_backbone, load_mae
from mae.convert.export import export_encoder
from mae.convert.exports import huggingface as hf_target
from mae.convert.folders import export_folder
from mae.convert.sources import read_checkpoint
from mae.errors import ConfigError, InputError, MissingFileError
from mae.models import MaskedAutoencoderViT
from mae.training.settings import TeacherSettings
from mae.training.teacher import check_same_teacher, check_teacher_settings, checkpoint_sha256, load_teacher
from tests.helpers import RandomImages, make_trainer, pretrain_module, untrained_cnn_checkpoint

SMALL = dict(
    img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, decoder_embed_dim=16, decoder_depth=1
)


@pytest.fixture(scope="module")
def teacher_ckpt(tmp_path_factory) -> Path:
    """Our Lightning checkpoint layout (architecture record, state dict under ``model.``) of a seeded MAE."""
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(decoder_num_heads=2, **SMALL)
    path = tmp_path_factory.mktemp("teacher") / "teacher.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save(
        {
            "state_dict": state,
            "pytorch-lightning_version": "2.6.6",
            "mae_architecture": mae_record(model.config),
        },
        path,
    )
    return path


def _tokens(vit, imgs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return vit.forward_intermediates(imgs, indices=[1], output_fmt="NLC", intermediates_only=True)[0]


def _exported(kind: str, ckpt: Path, folder: Path) -> Path:
    if kind == "timm safetensors":
        return export_encoder(ckpt, folder / "encoder.safetensors")[0]
    export_folder(ckpt, folder / "hf", hf_target.FOLDER, encoder_only=True)
    return folder / "hf"


@pytest.mark.parametrize("kind", ["lightning", "timm safetensors", "huggingface folder"])
def test_load_teacher__each_format_gives_the_encoders_tokens_frozen_with_its_identity(
    kind, teacher_ckpt, tmp_path
):
    source = teacher_ckpt if kind == "lightning" else _exported(kind, teacher_ckpt, tmp_path)
    teacher, identity = load_teacher(source)
    imgs = torch.randn(2, 3, 16, 16)
    assert (_tokens(teacher, imgs) - _tokens(load_backbone(teacher_ckpt).eval(), imgs)).abs().max() <= 1e-5
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    assert (identity.embed_dim, identity.patch_size, identity.depth, identity.num_heads) == (24, 4, 2, 2)
    assert identity.path == str(source.resolve())
    assert identity.format == {"lightning": "lightning", "huggingface folder": "huggingface"}.get(
        kind, "timm"
    )
    if source.is_file():
        assert identity.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()


def test_load_teacher__a_students_grid_resamples_the_position_embeddings_once(teacher_ckpt):
    teacher, _ = load_teacher(teacher_ckpt, grid_size=(8, 6))
    assert tuple(teacher.patch_embed.grid_size) == (8, 6) and teacher.pos_embed.shape[1] == 1 + 48
    expected = load_backbone(teacher_ckpt, img_size=(32, 24)).pos_embed
    assert (teacher.pos_embed - expected).abs().max() == 0


def test_checkpoint_sha256__a_folder_copied_elsewhere_has_the_same_hash_and_new_weights_another(
    teacher_ckpt, tmp_path
):
    folder = _exported("huggingface folder", teacher_ckpt, tmp_path / "a")
    copy = shutil.copytree(folder, tmp_path / "b")
    (copy / "README.md").write_text("edited card")  # not a weight file
    assert checkpoint_sha256(folder) == checkpoint_sha256(copy)
    weights = next(copy.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b" ")
    assert checkpoint_sha256(folder) != checkpoint_sha256(copy)


def test_load_teacher__a_missing_file_names_the_key(tmp_path):
    with pytest.raises(MissingFileError, match=r"model.teacher.checkpoint .*nope.ckpt does not exist"):
        load_teacher(tmp_path / "nope.ckpt")


def test_load_teacher__a_cnn_checkpoint_is_refused_naming_its_encoder(tmp_path):
    cnn = untrained_cnn_checkpoint(tmp_path / "spark.ckpt", encoder="resnet10t")
    with pytest.raises(ConfigError, match=r"spark.ckpt holds the CNN resnet10t; a teacher must be a ViT"):
        load_teacher(cnn)


def test_check_teacher_settings__a_teacher_without_features_and_features_without_a_teacher_are_refused():
    with pytest.raises(
        ConfigError, match="model.teacher.checkpoint, model.teacher.block set, but model.target is hog"
    ):
        check_teacher_settings("hog", TeacherSettings(checkpoint="t.ckpt", block=3))
    with pytest.raises(ConfigError, match="model.target features .* model.teacher.checkpoint is not set"):
        check_teacher_settings("features", TeacherSettings())
    check_teacher_settings("features", TeacherSettings(checkpoint="t.ckpt"))
    check_teacher_settings("norm_pix", TeacherSettings())


def test_check_same_teacher__another_hash_is_refused_naming_both(teacher_ckpt):
    _, identity = load_teacher(teacher_ckpt)
    recorded = {**identity.record(), "sha256": "0" * 64}
    with pytest.raises(ConfigError, match=rf"sha256 {identity.sha256}, but .* of sha256 {'0' * 64}"):
        check_same_teacher(recorded, identity)
    check_same_teacher(identity.record(), identity)


def test_pretrain__features_trains_a_step_and_its_checkpoint_holds_no_teacher(teacher_ckpt, tmp_path):
    module = pretrain_module(
        target="features", teacher=dict(checkpoint=str(teacher_ckpt), block=0), optim=dict(warmup_epochs=0)
    )
    pixel = pretrain_module(target="pixel")
    teacher = module.model.target.teacher
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    assert list(module.state_dict()) == list(pixel.state_dict())
    trainer = make_trainer(tmp_path, max_steps=2, limit_val_batches=0)
    trainer.fit(module, datamodule=RandomImages(n=4))
    assert all((teacher.state_dict()[k] == v).all() for k, v in before.items())
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    saved = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)
    assert sorted(saved["state_dict"]) == sorted(f"model.{k}" for k in pixel.model.state_dict())
    assert not any(
        torch.equal(t, v) for t in saved["state_dict"].values() for v in before.values() if t.shape == v.shape
    )
    options = saved["mae_architecture"]["args"]["target_options"]
    assert (
        options["dim"] == 24
        and options["block"] == 0
        and options["teacher"]["sha256"] == checkpoint_sha256(teacher_ckpt)
    )
    assert saved["hyper_parameters"]["teacher_identity"] == options["teacher"]
    model, _ = load_mae(tmp_path / "last.ckpt")  # without the teacher
    assert (
        model.target.name == "features"
        and model.target.teacher is None
        and model.decoder_pred.out_features == 24
    )
    saved["mae_architecture"]["args"]["target_options"]["dim"] = 2**20  # a damaged record: refused, not built
    torch.save(saved, tmp_path / "edited.ckpt")
    with pytest.raises(
        InputError, match=r"record says target_options dim=1048576, but its decoder_pred predicts 24"
    ):
        read_checkpoint(tmp_path / "edited.ckpt")


def test_pretrain__a_resume_with_another_teacher_is_refused_naming_both_hashes(teacher_ckpt, tmp_path):
    module = pretrain_module(target="features", teacher=dict(checkpoint=str(teacher_ckpt)))
    checkpoint = {"mae_architecture": module.architecture_record()}
    module.on_load_checkpoint(checkpoint)  # the same teacher: goes on
    checkpoint["mae_architecture"]["args"]["target_options"]["teacher"]["sha256"] = "f" * 64
    with pytest.raises(
        ConfigError, match=rf"sha256 {module.teacher_identity.sha256}, but .* sha256 {'f' * 64}"
    ):
        module.on_load_checkpoint(checkpoint)


def test_pretrain__a_teacher_block_beyond_its_depth_is_refused_at_start_up(teacher_ckpt):
    with pytest.raises(ConfigError, match=r"model.teacher.block 2 is not a block .* depth 2"):
        pretrain_module(target="features", teacher=dict(checkpoint=str(teacher_ckpt), block=2))
