"""A CNN checkpoint loaded as the plain timm model (``load_backbone``), as the whole MAE (``load_mae``), and
any timm checkpoint of a CNN's architecture as the start of its pretraining (``init_mae_from``), every load
strict and the other architectures refused naming both (``mae.convert.cnn_loading``)."""

import re

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file
from timm.models import save_for_hf

from mae import load_backbone, load_mae
from mae.convert.backbone import init_mae_from
from mae.convert.sources import read_checkpoint
from mae.errors import ConfigError
from mae.models import MaskedAutoencoderCNN, create_model
from tests.helpers import untrained_cnn_checkpoint

IMGS = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _cnn_mae(encoder: str = "resnet10t", decoder: str = "spark", seed: int = 1) -> MaskedAutoencoderCNN:
    torch.manual_seed(seed)
    return create_model(
        "spark" if decoder == "spark" else "fcmae",
        encoder=encoder,
        img_size=32,
        mask_unit=8,
        decoder_width=64,
    )


def _timm(name: str, seed: int = 0, **kwargs) -> torch.nn.Module:
    """A seeded timm model with non-trivial BatchNorm statistics (so that a load that skips them shows)."""
    torch.manual_seed(seed)
    model = timm.create_model(name, **kwargs)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _same_state(module: torch.nn.Module, state: dict[str, torch.Tensor], prefix: str = "") -> bool:
    own = module.state_dict()
    return all(torch.equal(own[f"{prefix}{k}"], v) for k, v in state.items())


# ------------------------------------------------------------------ load_backbone / load_mae
def test_load_backbone__the_timm_cnn_itself_equal_to_the_mae_encoder(tmp_path):
    path = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt")
    backbone = load_backbone(path).eval()
    assert type(backbone).__name__ == "ResNet" and backbone.num_classes == 0
    report = backbone.load_report
    assert report.missing == [] and len(report.loaded) == len(backbone.state_dict())
    assert "in the checkpoint but not used: decoder.* (" in str(report)  # the MAE's decoder, in one line
    model, _ = load_mae(path)
    with torch.no_grad():
        assert torch.equal(backbone.forward_features(IMGS), model.eval().forward_features(IMGS)[-1])


def test_load_backbone__num_classes_gives_a_new_head_and_in_chans_adapts_the_first_convolution(tmp_path):
    backbone = load_backbone(untrained_cnn_checkpoint(tmp_path / "cnn.ckpt"), num_classes=5, in_chans=1)
    report = backbone.load_report
    assert backbone.fc.out_features == 5 and report.missing == ["fc.bias", "fc.weight"]
    assert backbone.conv1[0].in_channels == 1 and any("first convolution adapted" in n for n in report.notes)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"global_pool": "token"}, "global_pool 'token' pools a ViT's cls token; .* CNN resnet10t"),
        ({"num_heads": 4}, "num_heads is a ViT's; .* CNN resnet10t"),
    ],
)
def test_load_backbone__a_vit_setting_is_refused_naming_the_cnn(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        load_backbone(untrained_cnn_checkpoint(tmp_path / "cnn.ckpt"), **kwargs)


def test_load_mae__the_cnn_mae_with_every_tensor_and_its_architecture_not_overridable(tmp_path):
    path = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt", seed=3)
    model, report = load_mae(path, mask_strategy="block")
    assert isinstance(model, MaskedAutoencoderCNN) and model.mask_strategy == "block"
    assert not report.missing and not report.ignored
    assert _same_state(model, read_checkpoint(path).state_dict)
    with pytest.raises(
        ConfigError, match=r"cannot rebuild them otherwise: encoder='resnet18' \(the file's: 'resnet10t'\)"
    ):
        load_mae(path, encoder="resnet18")


# ------------------------------------------------------------------ init_mae_from
def test_init_from__a_timm_state_dict_file_starts_the_encoder_its_head_left_out(tmp_path):
    reference = _timm("resnet10t", num_classes=10)
    torch.save(reference.state_dict(), tmp_path / "resnet10t.pth")
    model = _cnn_mae()
    report = init_mae_from(model, tmp_path / "resnet10t.pth")
    encoder = {k: v for k, v in reference.state_dict().items() if not k.startswith("fc.")}
    assert _same_state(model.encoder, encoder)
    assert any("classifier head (fc.*)" in n for n in report.notes)
    assert any("decoder starts from its initialisation" in n for n in report.notes)
    with torch.no_grad():
        reference.reset_classifier(0)
        assert torch.equal(model.eval().forward_features(IMGS)[-1], reference.forward_features(IMGS))


def test_init_from__a_safetensors_file_and_a_timm_folder_of_the_architecture(tmp_path):
    reference = _timm("resnet10t", num_classes=0)
    save_file(reference.state_dict(), str(tmp_path / "weights.safetensors"))
    save_for_hf(reference, str(tmp_path / "folder"), {}, {"num_classes": 0}, safe_serialization=True)
    for source in (tmp_path / "weights.safetensors", tmp_path / "folder"):
        model = _cnn_mae()
        init_mae_from(model, source)
        assert _same_state(model.encoder, reference.state_dict()), source


def test_init_from__timms_fcmae_weights_without_the_head_norm(tmp_path):
    """timm's ``convnextv2_*.fcmae`` weights: a ``num_classes=0`` state dict without ``head.norm``."""
    reference = _timm("convnextv2_atto", num_classes=0)
    state = {k: v for k, v in reference.state_dict().items() if not k.startswith("head.norm.")}
    save_file(state, str(tmp_path / "fcmae.safetensors"))
    model = _cnn_mae("convnextv2_atto", "fcmae")
    report = init_mae_from(model, tmp_path / "fcmae.safetensors")
    assert _same_state(model.encoder, state)
    assert {"encoder.head.norm.weight", "encoder.head.norm.bias"} <= set(report.missing)


def _official_convnext(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A timm ConvNeXt-V2 state dict in the official repository's names and shapes: timm's
    ``checkpoint_filter_fn`` (timm.models.convnext) read in reverse."""
    out = {}
    for key, value in state.items():
        key = key.replace("stem.", "downsample_layers.0.")
        key = re.sub(r"stages\.(\d+)\.downsample\.(\d+)", r"downsample_layers.\1.\2", key)
        key = re.sub(r"stages\.(\d+)\.blocks\.(\d+)", r"stages.\1.\2", key)
        key = key.replace("conv_dw", "dwconv").replace("mlp.fc", "pwconv")
        if "mlp.grn" in key:
            key = key.replace("mlp.grn.weight", "grn.gamma").replace("mlp.grn.bias", "grn.beta")
            value = value.reshape(1, 1, 1, -1)
        key = key.replace("head.norm.", "norm.").replace("head.fc.", "head.")
        out[key] = value
    return out


def test_init_from__the_official_convnext_v2_layout_through_timms_own_remapping(tmp_path):
    reference = _timm("convnextv2_atto", num_classes=7)
    official = _official_convnext(reference.state_dict())
    assert "downsample_layers.0.0.weight" in official and "stages.0.0.grn.gamma" in official
    torch.save({"model": official}, tmp_path / "convnextv2_atto_1k_224_ema.pt")
    model = _cnn_mae("convnextv2_atto", "fcmae")
    report = init_mae_from(model, tmp_path / "convnextv2_atto_1k_224_ema.pt")
    encoder = {k: v for k, v in reference.state_dict().items() if not k.startswith("head.fc.")}
    assert _same_state(model.encoder, encoder)  # the head norm too: the official "norm"
    assert not [key for key in report.missing if key.startswith("encoder.")]
    assert any("remapped to timm's" in n for n in report.notes)


def test_init_from__our_cnn_checkpoint_starts_encoder_and_decoder(tmp_path):
    path = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt", seed=5)
    model = _cnn_mae()
    report = init_mae_from(model, path)
    assert not report.missing and _same_state(model, read_checkpoint(path).state_dict)


def test_init_from__another_timm_architecture_is_refused_naming_the_encoder(tmp_path):
    torch.save(_timm("resnet18", num_classes=0).state_dict(), tmp_path / "resnet18.pth")
    with pytest.raises(
        ConfigError, match=r"resnet18.pth holds another architecture than this model's encoder resnet10t"
    ):
        init_mae_from(_cnn_mae(), tmp_path / "resnet18.pth")


def test_init_from__a_checkpoint_of_another_encoder_is_refused_naming_both(tmp_path):
    path = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt", encoder="resnet14t")
    with pytest.raises(
        ConfigError, match=r"cnn.ckpt holds a resnet14t encoder; this model's encoder is resnet10t"
    ):
        init_mae_from(_cnn_mae(), path)


def test_init_from__a_vit_is_refused_naming_both(tmp_path):
    from tests.helpers import tiny_mae

    torch.save(tiny_mae().state_dict(), tmp_path / "vit.pth")  # a plain state dict: the ViT's names
    with pytest.raises(
        ConfigError, match=r"vit.pth holds a ViT .*; this model's encoder is the CNN resnet10t"
    ):
        init_mae_from(_cnn_mae(), tmp_path / "vit.pth")
    torch.save({"model": tiny_mae().state_dict()}, tmp_path / "official.pth")  # the official MAE's file
    with pytest.raises(ConfigError, match=r"official.pth holds a ViT .*the CNN resnet10t"):
        init_mae_from(_cnn_mae(), tmp_path / "official.pth")


def test_a_finetuned_cnn_classifier__loads_with_its_head_and_exports_its_features(tmp_path):
    """``mae finetune``'s record of a CNN (``TimmCNN``: the timm model with its head, under ``vit.``)."""
    import lightning

    from mae.convert.export import export_encoder

    classifier = _timm("resnet10t", num_classes=3)
    args = {
        "encoder": "resnet10t",
        "num_classes": 3,
        "in_chans": 3,
        "global_pool": "avg",
        "img_size": [32, 32],
    }
    record = {"class": "TimmCNN", "args": {**args, "encoder_kwargs": {}, "head": "linear"}}
    torch.save(
        {
            "state_dict": {f"vit.{k}": v for k, v in classifier.state_dict().items()},
            "pytorch-lightning_version": lightning.__version__,
            "mae_architecture": {**record, "state_dict_prefix": "vit."},
        },
        tmp_path / "finetuned.ckpt",
    )
    ckpt = read_checkpoint(tmp_path / "finetuned.ckpt")
    assert ckpt.family == "cnn" and not ckpt.has_decoder and "encoder.fc.weight" in ckpt.state_dict
    logits = load_backbone(ckpt, num_classes=3).eval()
    features = load_backbone(ckpt).eval()  # the features: its head left out, noted
    assert any("another number of classes" in note for note in features.load_report.notes)
    weights, _ = export_encoder(tmp_path / "finetuned.ckpt", tmp_path / "features.safetensors")
    timm.create_model("resnet10t", num_classes=0).load_state_dict(load_file(weights), strict=True)
    with torch.no_grad():
        assert torch.equal(logits(IMGS), classifier(IMGS))
        assert torch.equal(
            features(IMGS), classifier.forward_head(classifier.forward_features(IMGS), pre_logits=True)
        )
