"""Round trips of ``mae.convert.folders``: our checkpoint -> timm / transformers folder -> their loaders,
the same features (and, with the decoder, the same loss; for a fine-tuned classifier, the same logits) in
fp32; what a target cannot hold is refused; a link is written through."""

import json
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image

from mae.convert.architecture import mae_record
from mae.convert.backbone import load_backbone
from mae.convert.exports import huggingface as hf_target
from mae.convert.exports import timm as timm_target
from mae.convert.folders import export_folder, is_export_folder
from mae.data.views.recipes import eval_transform
from mae.errors import ConfigError
from mae.io.outputs import OutputError
from mae.models import MaskedAutoencoderViT
from tests.unit.convert.test_classifier import PROBE, classifier_checkpoint

transformers = pytest.importorskip("transformers")

SMALL = dict(patch_size=4, embed_dim=32, depth=2, num_heads=2, decoder_embed_dim=16, decoder_depth=1)
# A 4-channel 16-bit model's normalisation, in [0, 1] units (values / 65535).
BANDS = {"mean": [0.11, 0.22, 0.33, 0.44], "std": [0.05, 0.06, 0.07, 0.08]}


def _checkpoint(
    tmp_path: Path, img_size, in_chans: int, data: dict | None = None
) -> tuple[Path, MaskedAutoencoderViT]:
    """Our Lightning checkpoint layout (record, data) of a seeded random MAE, written as ``tmp/x.ckpt``."""
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(img_size=img_size, in_chans=in_chans, decoder_num_heads=2, **SMALL).eval()
    size = [img_size, img_size] if isinstance(img_size, int) else list(img_size)
    record = {"in_chans": in_chans, "img_size": size, **(data or BANDS)}
    path = tmp_path / "x.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "pytorch-lightning_version": "2.6.6",
            "mae_architecture": mae_record(model.config),
            "mae_data": record,
        },
        path,
    )
    return path, model


def _raster_noise(n: int, patches: int) -> torch.Tensor:
    """Noise whose argsort keeps every patch in raster order (transformers' ViTMAE shuffles by it)."""
    return torch.arange(patches, dtype=torch.float).expand(n, patches)


def test_timm_folder__four_channels_non_square__same_features_and_preprocessing_config(tmp_path):
    ckpt, model = _checkpoint(tmp_path, (16, 24), 4)
    export_folder(ckpt, tmp_path / "timm", timm_target.FOLDER)
    assert is_export_folder(tmp_path / "timm")
    loaded = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    images = torch.randn(2, 4, 16, 24)
    with torch.no_grad():
        ours = load_backbone(ckpt).eval().forward_features(images)
        theirs = loaded.forward_features(images)
        again = load_backbone(tmp_path / "timm").eval().forward_features(images)
    assert (ours - theirs).abs().max() <= 1e-5
    assert (ours - again).abs().max() <= 1e-5
    config = timm.data.resolve_data_config({}, model=loaded)
    assert config["input_size"] == (4, 16, 24)
    assert list(config["mean"]) == BANDS["mean"] and list(config["std"]) == BANDS["std"]
    assert config["interpolation"] == "bicubic" and config["crop_pct"] == pytest.approx(224 / 256)
    assert load_backbone(tmp_path / "timm").load_report.format == "timm"


def test_timm_folder__resolve_data_config_and_create_transform_prepare_images_as_we_do(tmp_path):
    stats = {"mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}
    ckpt, _ = _checkpoint(tmp_path, 16, 3, stats)
    export_folder(ckpt, tmp_path / "timm", timm_target.FOLDER)
    loaded = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True)
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=loaded))
    image = Image.fromarray(torch.randint(0, 256, (30, 41, 3), dtype=torch.uint8).numpy())
    ours = eval_transform(16, 224 / 256, stats["mean"], stats["std"])(image)
    torch.testing.assert_close(transform(image), ours, rtol=0, atol=1e-6)


def test_huggingface_folder__four_channels_non_square_encoder__same_hidden_states(tmp_path):
    ckpt, _ = _checkpoint(tmp_path, (16, 24), 4)
    export = export_folder(ckpt, tmp_path / "hf", hf_target.FOLDER, encoder_only=True)
    assert not export.has_decoder
    hf = transformers.ViTMAEModel.from_pretrained(tmp_path / "hf", mask_ratio=0.0).eval()
    images = torch.randn(2, 4, 16, 24)
    with torch.no_grad():
        ours = load_backbone(ckpt).eval().forward_features(images)
        theirs = hf(pixel_values=images, noise=_raster_noise(2, 24)).last_hidden_state
        again = load_backbone(tmp_path / "hf").eval().forward_features(images)
    assert (ours - theirs).abs().max() <= 1e-5
    assert (ours - again).abs().max() <= 1e-5
    processor = transformers.ViTImageProcessor.from_pretrained(tmp_path / "hf")
    assert (processor.size.height, processor.size.width) == (16, 24)
    assert list(processor.image_mean) == BANDS["mean"]


def test_huggingface_folder__four_channels_with_decoder__same_loss_on_the_same_noise(tmp_path):
    ckpt, model = _checkpoint(tmp_path, 16, 4)
    export = export_folder(ckpt, tmp_path / "hf", hf_target.FOLDER)
    assert export.has_decoder
    hf = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path / "hf").eval()
    images, noise = torch.randn(2, 4, 16, 16), torch.rand(2, 16)
    with torch.no_grad():
        loss, pred, mask = model(images, 0.75, noise)
        out = hf(pixel_values=images, noise=noise)
    torch.testing.assert_close(mask, out.mask)
    assert (pred - out.logits).abs().max() <= 1e-5
    assert abs(loss.item() - out.loss.item()) <= 1e-5


def test_huggingface_folder__non_square_with_decoder_is_refused_naming_the_size(tmp_path):
    ckpt, _ = _checkpoint(tmp_path, (16, 24), 3)
    with pytest.raises(ConfigError, match=r"square inputs only, got img_size 16x24.*--encoder-only"):
        export_folder(ckpt, tmp_path / "hf", hf_target.FOLDER)
    assert not (tmp_path / "hf").exists() and list(tmp_path.iterdir()) == [ckpt]


def test_timm_folder__another_layer_norm_eps_is_refused_naming_it(tmp_path):
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(img_size=16, decoder_num_heads=2, layer_norm_eps=1e-12, **SMALL)
    transformers_dir = tmp_path / "src"
    from mae.convert.huggingface import save_hf_pretrained

    save_hf_pretrained(model, transformers_dir)
    with pytest.raises(ConfigError, match="LayerNorm eps 1e-12; a timm ViT uses 1e-6"):
        export_folder(transformers_dir, tmp_path / "timm", timm_target.FOLDER)


@pytest.mark.parametrize(
    "kwargs", [{}, {"global_pool": "token"}, PROBE], ids=["avg-pool", "token-pool", "linear-probe"]
)
def test_timm_folder__a_finetuned_classifier_gives_the_same_logits(tmp_path, kwargs):
    ckpt, classifier = classifier_checkpoint(tmp_path, **kwargs)
    export = export_folder(ckpt, tmp_path / "timm", timm_target.FOLDER)
    assert export.classifier is not None and export.classifier.num_classes == 3
    loaded = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert (loaded(images) - classifier(images)).abs().max() <= 1e-5
    card = (tmp_path / "timm" / "README.md").read_text()
    assert "pipeline_tag: image-classification" in card and "(1, 3) class scores" in card


@pytest.mark.parametrize("kwargs", [{"global_pool": "token"}, PROBE], ids=["token-pool", "linear-probe"])
def test_huggingface_folder__a_classifier_on_the_cls_token_is_a_vit_for_image_classification(
    tmp_path, kwargs
):
    ckpt, classifier = classifier_checkpoint(tmp_path, **kwargs)
    export_folder(ckpt, tmp_path / "hf", hf_target.FOLDER)
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert (hf(pixel_values=images).logits - classifier(images)).abs().max() <= 1e-5
    assert "ViTForImageClassification.from_pretrained" in (tmp_path / "hf" / "README.md").read_text()

    export_folder(ckpt, tmp_path / "hf", hf_target.FOLDER, encoder_only=True)  # its encoder's features
    encoder = transformers.ViTMAEModel.from_pretrained(tmp_path / "hf", mask_ratio=0.0).eval()
    with torch.no_grad():
        theirs = encoder(pixel_values=images, noise=_raster_noise(2, 16)).last_hidden_state
        ours = classifier.forward_features(images)  # after the final norm, as the cls token is classified
    assert (theirs - ours).abs().max() <= 1e-5


def test_huggingface_folder__an_average_pooling_classifier_is_refused_before_anything_is_written(tmp_path):
    ckpt, _ = classifier_checkpoint(tmp_path)
    for encoder_only in (False, True):
        with pytest.raises(ConfigError, match=r"3-class classifier \(global average pooling\).*--to timm"):
            export_folder(ckpt, tmp_path / "hf", hf_target.FOLDER, encoder_only=encoder_only)
    assert sorted(p.name for p in tmp_path.iterdir()) == [ckpt.name]


def test_export_folder__a_link_is_written_through_to_its_folder(tmp_path):
    ckpt, _ = _checkpoint(tmp_path, 16, 3, {"mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]})
    target, link = tmp_path / "real" / "timm", tmp_path / "link"
    target.parent.mkdir()
    export_folder(ckpt, target, hf_target.FOLDER)
    link.symlink_to(target)
    export = export_folder(ckpt, link, timm_target.FOLDER)
    assert export.folder == link and link.is_symlink() and is_export_folder(target)
    assert not (target / "preprocessor_config.json").exists()  # the timm export replaced the other whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "x.ckpt"]
    assert [p.name for p in target.parent.iterdir()] == ["timm"]


def test_export_folder__the_current_folder_is_refused_before_anything_is_read(tmp_path, monkeypatch):
    ckpt, _ = _checkpoint(tmp_path, 16, 3)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(
        OutputError, match=r"--out \. is the current folder .* run it from .* with --out here"
    ):
        export_folder(ckpt, ".", timm_target.FOLDER)
    assert list((tmp_path / "here").iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "here",
        "x.ckpt",
    ]


def test_timm_folder__a_cnn_encoder_timm_builds_by_itself_and_huggingface_is_refused(tmp_path):
    from tests.helpers import untrained_cnn_checkpoint

    checkpoint = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt")
    export_folder(checkpoint, tmp_path / "timm", timm_target.FOLDER)
    config = json.loads((tmp_path / "timm" / "config.json").read_text())
    assert config["architecture"] == "resnet10t" and config["num_classes"] == 0
    assert config["pretrained_cfg"]["input_size"] == [3, 32, 32] and "mean" in config["pretrained_cfg"]
    loaded = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    reference = load_backbone(checkpoint).eval()
    imgs = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.forward_features(imgs), reference.forward_features(imgs))
    with pytest.raises(
        ConfigError, match="holds the convolutional network resnet10t: --to huggingface writes"
    ):
        export_folder(checkpoint, tmp_path / "hf", hf_target.FOLDER)
    assert not (tmp_path / "hf").exists()
