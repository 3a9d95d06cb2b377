"""Export, import of every checkpoint format, and the backbone path."""

import argparse
import json
import os

import pytest
import torch
import torch.nn.functional as F

from mae.cli.main import invoke
from mae.convert.backbone import load_backbone, load_mae
from mae.convert.export import export_encoder
from mae.convert.huggingface import save_hf_pretrained
from mae.convert.sources import read_checkpoint
from mae.models import MaskedAutoencoderViT, create_model


@pytest.fixture
def mae_model() -> MaskedAutoencoderViT:
    torch.manual_seed(0)  # a real named size (so official "args" name it), made shallow
    model = create_model("mae_vit_tiny_patch4", depth=2, decoder_depth=1, norm_pix_loss=True).eval()
    with torch.no_grad():  # non-trivial norms, so loading mistakes show
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_(1.0, 0.1)
                m.bias.normal_(0.0, 0.1)
    return model


def _official_full(model: MaskedAutoencoderViT, tmp_path, with_args: bool = True):
    path = tmp_path / "checkpoint-799.pth"
    payload = {"model": model.state_dict(), "epoch": 799, "optimizer": {"state": {}, "param_groups": []}}
    if with_args:  # what the official main_pretrain.py writes
        payload["args"] = argparse.Namespace(
            model="mae_vit_tiny_patch4", input_size=32, norm_pix_loss=True, blr=1.5e-4
        )
    torch.save(payload, path)
    return path


def _pre_norm_tokens(model: MaskedAutoencoderViT, imgs: torch.Tensor) -> torch.Tensor:
    x = model.patch_embed(imgs) + model.pos_embed[:, 1:]
    x = torch.cat([(model.cls_token + model.pos_embed[:, :1]).expand(len(x), -1, -1), x], dim=1)
    return model.blocks(x)


def test_export__timm_alone_gives_our_encoder_features(mae_model, tmp_path):
    import timm

    ckpt = _official_full(mae_model, tmp_path)
    weights, sidecar = export_encoder(ckpt, tmp_path / "export" / "encoder.safetensors")
    args = json.loads(sidecar.read_text())
    imgs = torch.randn(2, 3, 32, 32)

    # no mae code below: timm and the two files only
    vit = timm.create_model(
        args["architecture"],
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(weights)),
        **args["model_args"],
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(vit.forward_features(imgs), mae_model.forward_features(imgs))
        clf = timm.create_model(
            args["architecture"],
            pretrained=True,
            pretrained_cfg_overlay=dict(file=str(weights)),
            **{**args["model_args"], "num_classes": 10, "global_pool": "avg"},
        ).eval()
        torch.testing.assert_close(clf.forward_features(imgs), _pre_norm_tokens(mae_model, imgs))
        assert clf(imgs).shape == (2, 10)
    assert sorted(p.name for p in weights.parent.iterdir()) == ["encoder.json", "encoder.safetensors"]


def test_export__command_line(mae_model, tmp_path, capsys):
    ckpt = _official_full(mae_model, tmp_path)
    invoke("export", ["--checkpoint", str(ckpt), "--out", str(tmp_path / "enc.safetensors")])
    out = capsys.readouterr().out
    assert "timm.create_model" in out and (tmp_path / "enc.json").exists()


def test_export__of_our_lightning_checkpoint_roundtrips_to_mae(mae_model, tmp_path):
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {
            "pytorch-lightning_version": "2.6.6",
            "state_dict": {f"model.{k}": v for k, v in mae_model.state_dict().items()},
            "hyper_parameters": {
                "model": "mae_vit_tiny_patch4",
                "img_size": 32,
                "norm_pix_loss": True,
                "model_kwargs": {"depth": 2, "decoder_depth": 1},
            },
        },
        ckpt,
    )
    loaded, report = load_mae(ckpt)
    assert report.format == "lightning" and not report.missing and not report.ignored and not report.notes
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    with torch.no_grad():
        for a, b in zip(loaded.eval()(imgs, 0.75, noise), mae_model(imgs, 0.75, noise), strict=True):
            torch.testing.assert_close(a, b)
    # ours -> timm -> ours: the exported encoder loads back as a backbone with the same features
    weights, _ = export_encoder(ckpt, tmp_path / "enc.safetensors")
    backbone = load_backbone(weights).eval()
    with torch.no_grad():
        torch.testing.assert_close(backbone.forward_features(imgs), mae_model.forward_features(imgs))


@pytest.mark.parametrize("with_args", [True, False])
def test_official__full_checkpoint_loads_as_mae_and_backbone(mae_model, tmp_path, with_args):
    ckpt = _official_full(mae_model, tmp_path, with_args)
    loaded, report = load_mae(ckpt)
    assert report.format == "official" and loaded.config["num_heads"] == 3
    assert loaded.config["decoder_num_heads"] == (4 if with_args else 4)
    assumed = [n for n in report.notes if "assumed" in n]
    assert bool(assumed) == (not with_args)  # without args, heads come from the standard width table
    backbone = load_backbone(ckpt).eval()
    assert any(k.startswith("decoder_blocks") for k in backbone.load_report.ignored)
    imgs = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(backbone.forward_features(imgs), mae_model.forward_features(imgs))


def test_official__encoder_only_loads_as_backbone_not_as_mae(mae_model, tmp_path):
    encoder = {
        k: v for k, v in mae_model.state_dict().items() if not k.startswith("decoder") and k != "mask_token"
    }
    path = tmp_path / "mae_pretrain_vit_tiny.pth"
    torch.save({"model": encoder}, path)
    backbone = load_backbone(path, num_classes=5, global_pool="avg")
    assert set(backbone.load_report.missing) == {"fc_norm.weight", "fc_norm.bias", "head.weight", "head.bias"}
    assert set(backbone.load_report.ignored) == {"norm.weight", "norm.bias"}
    with pytest.raises(ValueError, match="encoder only"):
        load_mae(path)


def test_official__fine_tuned_checkpoint_with_fc_norm_and_head(mae_model, tmp_path):
    state = {
        k: v for k, v in mae_model.state_dict().items() if not k.startswith(("decoder", "mask", "norm."))
    }
    state.update({"fc_norm.weight": torch.rand(192), "fc_norm.bias": torch.rand(192)})
    state.update({"head.weight": torch.randn(7, 192), "head.bias": torch.randn(7)})
    path = tmp_path / "finetuned.pth"
    torch.save({"model": state, "args": argparse.Namespace(model="vit_tiny_patch4", input_size=32)}, path)
    model = load_backbone(path, global_pool="avg", num_classes=7)
    assert model.load_report.missing == [] and model.load_report.ignored == []
    torch.testing.assert_close(model.head.weight, state["head.weight"])
    with pytest.raises(ValueError, match="norm"):  # token pooling needs the final norm this file lacks
        load_backbone(path, global_pool="token")


def test_backbone__new_image_size_resamples_like_the_official_interpolation(mae_model, tmp_path):
    ckpt = _official_full(mae_model, tmp_path)
    model = load_backbone(ckpt, img_size=48)
    assert model.pos_embed.shape == (1, 1 + 12 * 12, 192)
    old = mae_model.pos_embed
    grid = old[:, 1:].reshape(1, 8, 8, 192).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(12, 12), mode="bicubic", align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(model.pos_embed[:, 1:], expected.reshape(1, 144, 192))
    torch.testing.assert_close(model.pos_embed[:, :1], old[:, :1])
    assert any("resampled" in n for n in model.load_report.notes)
    feats = model.forward_features(torch.randn(1, 3, 48, 48))
    assert feats.shape == (1, 145, 192)  # every patch: no masking on the backbone path


def test_backbone__tokens_in_spatial_order_and_intermediates(mae_model, tmp_path):
    model = load_backbone(_official_full(mae_model, tmp_path)).eval()
    imgs = torch.randn(1, 3, 32, 32)
    shifted = imgs.clone()
    shifted[..., :4, :4] += 5.0  # change only patch 0 (top-left)
    with torch.no_grad():
        a, b = model.patch_embed(imgs), model.patch_embed(shifted)
        changed = (a - b).abs().sum(-1).flatten().nonzero().flatten().tolist()
        assert changed == [0]
        final, inter = model.forward_intermediates(imgs, indices=2)
        assert [t.shape for t in inter] == [(1, 192, 8, 8)] * 2


def test_huggingface__pretraining_folder_roundtrip_same_outputs(mae_model, tmp_path):
    transformers = pytest.importorskip("transformers")
    save_hf_pretrained(mae_model, tmp_path / "hf")
    hf = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path / "hf").eval()
    hf.save_pretrained(tmp_path / "resaved")  # written by transformers itself
    loaded, report = load_mae(tmp_path / "resaved")
    assert report.format == "huggingface" and not report.missing
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    with torch.no_grad():
        out = hf(pixel_values=imgs, noise=noise)
        loss, pred, mask = loaded.eval()(imgs, 0.75, noise)
    torch.testing.assert_close(pred, out.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, out.loss, rtol=1e-5, atol=1e-6)


def test_huggingface__vit_model_with_its_own_eps_and_pooler(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        image_size=32,
        patch_size=4,
    )
    hf = transformers.ViTModel(config).eval()
    hf.save_pretrained(tmp_path / "vit")
    model = load_backbone(tmp_path / "vit").eval()
    assert model.norm.eps == config.layer_norm_eps
    assert any(k.startswith("pooler") for k in model.load_report.ignored)
    imgs = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(imgs), hf(pixel_values=imgs).last_hidden_state)
    with pytest.raises(ValueError, match="eps"):
        export_encoder(tmp_path / "vit", tmp_path / "x.safetensors")


def test_safety__malicious_pickle_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pth"
    torch.save({"model": {"cls_token": torch.zeros(1)}, "x": Payload()}, path)
    with pytest.raises(ValueError, match="evil.pth would run code when loaded: it names .*system"):
        read_checkpoint(path)
    assert not marker.exists()


def test_errors__missing_truncated_and_foreign_files(mae_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pth does not exist"):
        read_checkpoint(tmp_path / "nope.pth")
    good = _official_full(mae_model, tmp_path)
    broken = tmp_path / "broken.pth"
    broken.write_bytes(good.read_bytes()[:1000])
    with pytest.raises(ValueError, match="truncated"):
        read_checkpoint(broken)
    resnet = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7), "fc.weight": torch.zeros(10, 512)}, resnet)
    with pytest.raises(ValueError, match="not a ViT / MAE state dict"):
        read_checkpoint(resnet)
    with pytest.raises(ValueError, match="format 'onnx' is unknown"):
        read_checkpoint(good, format="onnx")


def test_errors__shape_mismatch_names_key_shapes_and_cause(mae_model, tmp_path):
    ckpt = _official_full(mae_model, tmp_path)
    with pytest.raises(
        ValueError, match=r"patch_embed.proj.weight has shape \(192, 3, 4, 4\).*\(192, 3, 8, 8\).*patch"
    ):
        load_mae(ckpt, patch_size=8)
    with pytest.raises(ValueError, match="2 blocks but the model 3"):
        load_mae(ckpt, depth=3)


def test_init_mae_from__a_decoder_of_another_target_starts_fresh_a_pixel_one_is_kept(tmp_path):
    """With 6-px RGB patches pixel and HOG targets are both 108 wide: the target, not the shape, decides."""
    from mae.convert.backbone import init_mae_from

    sizes = dict(img_size=24, patch_size=6, embed_dim=32, depth=1, num_heads=2, decoder_embed_dim=32)
    sizes.update(decoder_depth=1, decoder_num_heads=2)
    torch.manual_seed(0)
    pixel = MaskedAutoencoderViT(**sizes, target="pixel")
    torch.save({"model": pixel.state_dict()}, tmp_path / "pixel.pth")  # the official layout: a pixel model
    torch.manual_seed(1)
    hog = MaskedAutoencoderViT(**sizes, target="hog")
    fresh = hog.decoder_pred.weight.clone()
    assert fresh.shape == pixel.decoder_pred.weight.shape
    report = init_mae_from(hog, tmp_path / "pixel.pth")
    assert torch.equal(hog.decoder_pred.weight, fresh)
    assert torch.equal(hog.decoder_embed.weight, pixel.decoder_embed.weight)
    assert "decoder_pred (the file's predicts target pixel of 3 channels) starts from its initialisation" in (
        report.notes
    )
    norm_pix = MaskedAutoencoderViT(**sizes, target="norm_pix")
    init_mae_from(norm_pix, tmp_path / "pixel.pth")
    assert torch.equal(norm_pix.decoder_pred.weight, pixel.decoder_pred.weight)  # pixels both
