"""The joint objective (``mae.training.joint``, ``mae finetune`` mode joint): its loss against a plain MAE and
timm's classifier computed by hand on the same masks, the visible-token classifier, the network's lr
groups and drop path, its start from a checkpoint, its refusals, and its checkpoint read back as an MAE,
a classifier and an encoder."""

import pytest
import torch
from timm.layers import DropPath
from torch import nn

from mae.convert.backbone import build_vit, load_backbone, load_mae
from mae.convert.classifier import Classifier, classifier_of
from mae.convert.sources import read_checkpoint
from mae.errors import ConfigError
from mae.models import MaskedAutoencoderViT
from mae.models.masking import sample_noise
from mae.training.finetune import MAEFinetuneModule
from mae.training.joint import JointMAE, JointSettings, build_joint_network
from mae.training.transfer import EncoderSource
from tests.helpers import LabelledImages, finetune_module, make_trainer, tiny_pretraining_checkpoint

CLASSES = 3
# JointMAE arguments of a small 16x16 model (its depth aside).
SMALL = dict(img_size=16, patch_size=4, embed_dim=32, num_heads=2)
SMALL.update(decoder_embed_dim=16, decoder_depth=1, decoder_num_heads=2)


def joint_module(**kwargs) -> MAEFinetuneModule:
    """A seeded tiny joint module from scratch (3 blocks, 16x16 inputs, 3 classes), no drop path unless
    ``kwargs`` say."""
    return finetune_module(**{"mode": "joint", "mixup": 0.0, "cutmix": 0.0, "drop_path_rate": 0.0, **kwargs})


def _batch(seed: int = 0, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.arange(n) % CLASSES


def _noise(network: JointMAE, n: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return sample_noise(network.mask_strategy, n, network.grid_size, 0.75, "cpu")


def _plain_mae(network: JointMAE) -> MaskedAutoencoderViT:
    """The MAE of ``network``'s weights, as a plain ``MaskedAutoencoderViT`` (the classifier left out)."""
    mae = MaskedAutoencoderViT(**network.config)
    state = {k: v for k, v in network.state_dict().items() if not k.startswith(("fc_norm.", "head."))}
    mae.load_state_dict(state)
    return mae


def _timm_classifier(network: JointMAE) -> nn.Module:
    """timm's average-pooling ViT classifier with ``network``'s encoder and head (no final norm)."""
    vit = build_vit(network.config, global_pool="avg", num_classes=CLASSES)
    own = network.state_dict()
    vit.load_state_dict({k: own[k] for k in vit.state_dict()})
    return vit


def _by_hand_visible_logits(network: JointMAE, imgs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The visible patches of ``noise`` through the plain MAE's embedding and blocks, their mean through
    fc_norm and head."""
    mae = _plain_mae(network)
    tokens, _, _ = mae.visible_tokens(imgs, 0.75, noise)
    pooled = mae.blocks(tokens)[:, 1:].mean(dim=1)
    return network.head(network.fc_norm(pooled))


@pytest.mark.parametrize("classify", ["full", "visible"])
def test_training_step__loss_is_the_weighted_sum_of_cross_entropy_and_the_mae_loss_on_the_same_masks(
    classify, monkeypatch
):
    module = joint_module(joint=dict(reconstruction_weight=0.3, classify=classify))
    logged = {}
    monkeypatch.setattr(module, "log_training_loss", lambda loss, n: logged.setdefault("loss", loss))
    monkeypatch.setattr(module, "log_dict", lambda parts, **kw: logged.update(parts))
    imgs, labels = _batch()
    torch.manual_seed(7)  # the step draws its masks from the global generator
    loss = module.training_step((imgs, labels), 0)
    network = module.vit
    noise = _noise(network, len(imgs), seed=7)
    with torch.no_grad():
        mae_loss = _plain_mae(network)(imgs, 0.75, noise)[0]
        logits = (
            _timm_classifier(network)(imgs)
            if classify == "full"
            else _by_hand_visible_logits(network, imgs, noise)
        )
    cross_entropy = nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    torch.testing.assert_close(loss, 0.7 * cross_entropy + 0.3 * mae_loss)
    torch.testing.assert_close(logged["train/mae_loss"], mae_loss)
    torch.testing.assert_close(logged["train/cls_loss"], cross_entropy)
    assert logged["loss"] is loss


def test_visible_classification__reads_only_the_visible_patches():
    """Masked pixels changed: the visible-token logits stay, the whole-image logits and the MAE loss move."""
    torch.manual_seed(0)
    network = JointMAE(CLASSES, **SMALL, depth=2).eval()
    imgs, _ = _batch()
    noise = _noise(network, len(imgs), seed=1)
    _, mask, _ = network.visible_tokens(imgs, 0.75, noise)  # (N, L), 1 = masked
    pixel_mask = network.unpatchify(mask.unsqueeze(-1).expand(-1, -1, 4 * 4 * 3))
    changed = imgs + 5.0 * pixel_mask * torch.randn_like(imgs)
    with torch.no_grad():
        before = network.forward_joint(imgs, 0.75, "visible", noise)
        after = network.forward_joint(changed, 0.75, "visible", noise)
        full = [network.forward_joint(x, 0.75, "full", noise)[0] for x in (imgs, changed)]
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    assert not torch.allclose(full[0], full[1]) and not torch.allclose(after[1], before[1])


def test_network__layer_decay_over_the_encoder_the_decoder_and_head_at_full_lr_tokens_without_decay():
    module = joint_module(layer_decay=0.5)
    names = {id(p): n for n, p in module.vit.named_parameters()}
    scale = {
        names[id(p)]: (group["lr_scale"], group["weight_decay"])
        for group in module._param_groups()
        for p in group["params"]
    }
    assert set(scale) == set(names.values())  # every parameter trained
    depth = 3  # blocks.i -> 0.5 ** (depth - i); embeddings 0.5 ** (depth + 1); everything else 1
    assert scale["blocks.0.attn.qkv.weight"] == (0.5**3, 0.05) and scale["blocks.2.mlp.fc1.weight"][0] == 0.5
    assert scale["patch_embed.proj.weight"][0] == 0.5 ** (depth + 1) and scale["cls_token"] == (0.5**4, 0.0)
    assert scale["head.weight"] == (1.0, 0.05) and scale["fc_norm.weight"] == (1.0, 0.0)
    assert scale["norm.weight"] == (1.0, 0.0) and scale["decoder_blocks.0.attn.qkv.weight"] == (1.0, 0.05)
    assert scale["decoder_pred.weight"] == (1.0, 0.05) and scale["mask_token"] == (1.0, 0.0)


def test_network__drop_path_in_the_encoder_blocks_only_by_timms_linear_rule():
    network = JointMAE(CLASSES, 0.2, **SMALL, depth=3)
    rates = [getattr(b.drop_path1, "drop_prob", 0.0) for b in network.blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2]) and isinstance(network.blocks[2].drop_path2, DropPath)
    assert not any(isinstance(m, DropPath) for m in network.decoder_blocks.modules())


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(reconstruction_weight=1.5), r"model.joint.reconstruction_weight must be in \[0, 1\].*got 1.5"),
        (dict(reconstruction_weight=-0.1), r"model.joint.reconstruction_weight must be in \[0, 1\]"),
        (dict(classify="cls"), "model.joint.classify must be 'full'.*or 'visible'.*got 'cls'"),
        (dict(mask_ratio=1.0), r"model.joint.mask_ratio must be in \[0, 1\), got 1.0"),
    ],
)
def test_settings__out_of_range_refused_naming_the_key(settings, message):
    with pytest.raises(ConfigError, match=message):
        JointSettings(**settings)
    with pytest.raises(ConfigError, match=message):
        joint_module(joint=settings)


def test_module__refuses_what_the_joint_objective_cannot_train_with():
    with pytest.raises(ConfigError, match="model.mixup 0.8 / model.cutmix 1.0: the joint objective"):
        finetune_module(mode="joint")  # fine-tuning's mixup and cutmix defaults
    with pytest.raises(ConfigError, match="model.global_pool 'token': the joint objective"):
        joint_module(global_pool="token")
    with pytest.raises(ConfigError, match="model.joint sets the joint objective of model.mode joint"):
        finetune_module(joint=dict(reconstruction_weight=0.5))
    with pytest.raises(ConfigError, match="decoder_type 'cross'; the joint objective trains the paper's"):
        joint_module(encoder=dict(model_kwargs=dict(decoder_type="cross")))


def test_start__a_file_without_a_decoder_starts_a_new_one_with_a_note(tmp_path):
    """An exported encoder (no decoder): its encoder loaded; the decoder (sized by model_kwargs) and the
    classifier new, said so."""
    from mae.convert.export import export_encoder

    start = tiny_pretraining_checkpoint(tmp_path / "pre")
    export_encoder(start, tmp_path / "encoder.safetensors")
    sized = dict(decoder_embed_dim=16, decoder_depth=1, decoder_num_heads=2, target="pixel", depth=9)
    source = EncoderSource(checkpoint=str(tmp_path / "encoder.safetensors"), model_kwargs=sized)
    network, report = build_joint_network(source, None, 16, 3, CLASSES, 0.0, head_init_std=2e-5)
    assert "no decoder: a new one (1 blocks, 16 wide, target pixel) starts from its init" in str(report)
    assert len(network.blocks) == 1  # the encoder is the file's
    assert {"decoder_embed.weight", "mask_token", "head.weight", "fc_norm.weight"} <= set(report.missing)
    pretrained = read_checkpoint(start).state_dict
    torch.testing.assert_close(network.blocks[0].attn.qkv.weight, pretrained["blocks.0.attn.qkv.weight"])
    torch.testing.assert_close(network.norm.weight, pretrained["norm.weight"])
    assert not torch.equal(network.decoder_embed.weight, pretrained["decoder_embed.weight"])
    assert network.head.weight.abs().max() < 1e-4  # a new head, drawn as fine-tuning draws it


@pytest.fixture(scope="module")
def joint_checkpoint(tmp_path_factory):
    """A joint module started from the tiny pretraining checkpoint, one step trained, saved."""
    tmp = tmp_path_factory.mktemp("joint")
    start = tiny_pretraining_checkpoint(tmp / "pre")
    module = joint_module(encoder=dict(checkpoint=str(start)), drop_path_rate=0.1)
    trainer = make_trainer(tmp, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=LabelledImages(batch_size=8))
    trainer.save_checkpoint(tmp / "joint.ckpt")
    return module.eval(), tmp / "joint.ckpt"


def test_checkpoint__reads_back_as_the_mae_with_its_decoder(joint_checkpoint):
    module, path = joint_checkpoint
    mae, report = load_mae(path)
    assert type(mae) is MaskedAutoencoderViT and report.ignored == sorted(
        ["fc_norm.bias", "fc_norm.weight", "head.bias", "head.weight"]
    )
    imgs, _ = _batch()
    noise = _noise(module.vit, len(imgs), seed=3)
    with torch.no_grad():
        torch.testing.assert_close(
            mae.eval()(imgs, 0.75, noise)[0], module.vit.reconstruction_loss(imgs, 0.75, noise)
        )


def test_checkpoint__reads_back_as_the_trained_classifier_and_as_the_encoder(joint_checkpoint):
    module, path = joint_checkpoint
    ckpt = read_checkpoint(path)
    assert classifier_of(ckpt) == Classifier(CLASSES, "avg", probe=False)
    classifier = load_backbone(path, global_pool="avg", num_classes=CLASSES).eval()
    report = classifier.load_report
    assert report.missing == [] and report.ignored[:2] == ["norm.bias", "norm.weight"]  # the MAE's norm
    features = load_backbone(path).eval()  # kNN, embed: the encoder through its final norm
    imgs, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(classifier(imgs), module(imgs))
        torch.testing.assert_close(features.forward_features(imgs), module.vit.forward_features(imgs))
        loaded = MAEFinetuneModule.load_from_checkpoint(path).eval()
        assert loaded.mode == "joint" and loaded.joint == module.joint
        assert torch.equal(loaded(imgs), module(imgs))
    assert not torch.equal(module.vit.head.weight, torch.zeros_like(module.vit.head.weight))
