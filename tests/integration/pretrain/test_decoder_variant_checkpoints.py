"""Every decoder variant (partial reconstruction, the cross decoder) trains, checkpoints with its switches
recorded, loads back (``load_mae``), reconstructs, exports the same encoder and resumes; a checkpoint of one
variant in a config of another is refused naming the key."""

import pytest
import torch
from safetensors.torch import load_file

from mae import load_backbone, load_mae
from mae.convert.architecture import ARCHITECTURE_KEY
from mae.convert.export import export_encoder
from mae.convert.sources import read_checkpoint
from mae.inference.reconstruction import reconstruct
from mae.training.checkpointing import check_resume_checkpoint
from tests.helpers import TWO_BLOCK_KWARGS, RandomImages, make_trainer, pretrain_module

VARIANTS = {
    "paper": {},
    "partial": dict(decoder_keep_ratio=0.5),
    "cross": dict(decoder_type="cross"),
    "cross_partial_layers": dict(
        decoder_type="cross", decoder_keep_ratio=0.25, decoder_encoder_layers=[0, 1]
    ),
}


def _module(**switches):
    return pretrain_module(model_kwargs=TWO_BLOCK_KWARGS, optim=dict(warmup_epochs=0), **switches)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each variant after 2 training steps on 16x16 images: (module, checkpoint path)."""
    out = {}
    for name, switches in VARIANTS.items():
        folder = tmp_path_factory.mktemp(name)
        module = _module(**switches)
        trainer = make_trainer(folder, max_steps=2, limit_val_batches=0)
        trainer.fit(module, datamodule=RandomImages())
        trainer.save_checkpoint(folder / "last.ckpt")
        out[name] = module, folder / "last.ckpt"
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_variant__record_holds_the_switches_and_load_mae_rebuilds_the_model(checkpoints, name):
    module, path = checkpoints[name]
    args = torch.load(path, map_location="cpu", weights_only=True)[ARCHITECTURE_KEY]["args"]
    switches = {
        "decoder_type": "self",
        "decoder_keep_ratio": 1.0,
        "decoder_encoder_layers": None,
        **VARIANTS[name],
    }
    assert {key: args[key] for key in switches} == switches
    model, report = load_mae(path)
    assert model.config == module.model.config and not report.missing and not report.ignored
    for key, value in module.model.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    imgs = torch.randn(2, 3, 16, 16)
    noise = model.sample_noise(2, 0.75, generator=torch.Generator().manual_seed(0))
    views = reconstruct(model.eval(), imgs, 0.75, noise)  # evaluation: every masked patch reconstructed
    assert views["reconstruction"].shape == imgs.shape and torch.isfinite(views["loss"]).all()
    masked = model.unpatchify(
        model.patchify(torch.ones_like(imgs)) * (noise.argsort(1).argsort(1) >= 4)[..., None]
    )
    assert bool((views["reconstruction"][masked.bool()] != 0).all())


@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "paper"])
def test_variant__exports_the_same_encoder_as_the_paper_model(checkpoints, name, tmp_path):
    _, path = checkpoints[name]
    weights, sidecar = export_encoder(path, tmp_path / f"{name}.safetensors")
    paper, _ = export_encoder(checkpoints["paper"][1], tmp_path / "paper.safetensors")
    exported, reference = load_file(weights), load_file(paper)
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in reference.items()}
    encoder = read_checkpoint(path).encoder_state_dict()
    assert all(torch.equal(exported[k], encoder[k]) for k in exported) and set(exported) == set(encoder)
    backbone = load_backbone(weights).eval()  # a plain timm ViT, as for the paper's model
    imgs = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(
        backbone.forward_features(imgs), load_mae(path)[0].eval().forward_features(imgs)
    )


def test_resume__a_checkpoint_of_another_variant_is_refused_naming_the_key(checkpoints):
    _, cross = checkpoints["cross"]
    with pytest.raises(ValueError) as error:
        check_resume_checkpoint(cross, _module())
    assert (
        "model.decoder_type is 'cross' in the checkpoint but 'self' here (allowed: 'self' or 'cross')"
        in str(error.value)
    )
    _, partial = checkpoints["partial"]
    with pytest.raises(
        ValueError, match=r"model.decoder_keep_ratio is 0.5 in the checkpoint but 1.0 here \(allowed"
    ):
        check_resume_checkpoint(partial, _module())
    with pytest.raises(
        ValueError, match=r"model.decoder_encoder_layers is \[0, 1\] in the checkpoint but None here"
    ):
        check_resume_checkpoint(
            checkpoints["cross_partial_layers"][1], _module(decoder_type="cross", decoder_keep_ratio=0.25)
        )
    assert check_resume_checkpoint(partial, _module(decoder_keep_ratio=0.5)) == 2


def test_resume__a_record_written_before_the_switches_reads_as_the_paper(checkpoints, tmp_path):
    _, path = checkpoints["paper"]
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("decoder_type", "decoder_keep_ratio", "decoder_encoder_layers"):
        del ckpt[ARCHITECTURE_KEY]["args"][key]
    torch.save(ckpt, tmp_path / "older.ckpt")
    assert check_resume_checkpoint(tmp_path / "older.ckpt", _module()) == 2
    assert load_mae(tmp_path / "older.ckpt")[0].decoder_type == "self"
    with pytest.raises(ValueError, match="model.decoder_type is 'self' in the checkpoint but 'cross' here"):
        check_resume_checkpoint(tmp_path / "older.ckpt", _module(decoder_type="cross"))


def test_load_mae__the_trained_decoder_cannot_be_overridden_but_the_training_ratio_can(checkpoints):
    _, cross = checkpoints["cross"]
    with pytest.raises(ValueError, match="decoder_type is 'cross' in the checkpoint but 'self' here"):
        load_mae(cross, decoder_type="self")
    with pytest.raises(
        ValueError, match=r"decoder_encoder_layers is None in the checkpoint but \[0, 1\] here"
    ):
        load_mae(cross, decoder_encoder_layers=[0, 1])
    assert load_mae(cross, decoder_keep_ratio=0.5)[0].decoder_keep_ratio == 0.5


def test_init_from__a_decoder_of_another_type_is_refused_naming_the_key(checkpoints):
    with pytest.raises(
        ValueError, match="holds another decoder than this model: model.decoder_type is 'cross'"
    ):
        _module(init_from=str(checkpoints["cross"][1]))
    with pytest.raises(ValueError, match="model.decoder_type is 'self' in the checkpoint but 'cross' here"):
        _module(decoder_type="cross", init_from=str(checkpoints["partial"][1]))
    # another keep ratio or other layers: a new run's recipe, from the same weights
    assert _module(
        decoder_type="cross", decoder_encoder_layers=[0, 1], init_from=str(checkpoints["cross"][1])
    )


def test_record__a_decoder_type_that_disagrees_with_the_tensors_is_named(checkpoints, tmp_path):
    ckpt = torch.load(checkpoints["cross"][1], map_location="cpu", weights_only=True)
    ckpt[ARCHITECTURE_KEY]["args"]["decoder_type"] = "self"
    torch.save(ckpt, tmp_path / "edited.ckpt")
    with pytest.raises(
        ValueError, match="record says decoder_type='self', but its tensors are a 'cross' decoder's"
    ):
        read_checkpoint(tmp_path / "edited.ckpt")


def test_module__flops_per_batch_follow_the_switches(checkpoints):
    flops = {name: module.flops_per_batch for name, (module, _) in checkpoints.items()}
    assert flops["partial"] < flops["paper"] and flops["cross"] < flops["paper"]
    assert flops["cross_partial_layers"] < flops["cross"]


def test_anomaly_errors__run_on_the_cross_decoder_reading_several_layers(checkpoints):
    from mae.apps.anomaly.masks import complementary_masks
    from mae.apps.anomaly.scoring import reconstruction_errors

    model = load_mae(checkpoints["cross_partial_layers"][1])[0].eval()
    masks = complementary_masks(model.grid_size, 0.75, generator=torch.Generator().manual_seed(0))
    errors = reconstruction_errors(model, torch.randn(2, 3, 16, 16), masks)
    assert errors.shape == (2, 16) and bool(torch.isfinite(errors).all()) and bool((errors > 0).all())
