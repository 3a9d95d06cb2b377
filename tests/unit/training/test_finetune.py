"""Fine-tuning / linear probing module, kNN, and their configs."""

from pathlib import Path

import pytest
import torch
from torch import nn

from mae.convert.backbone import resample_pos_embed
from mae.eval.knn import knn_accuracy, knn_classify
from mae.training.finetune import MAEFinetuneModule
from tests.helpers import CPU_TRAINER, LabelledImages, finetune_module, make_trainer


def test_layer_decay__lr_scale_per_block_as_the_paper(tmp_path):
    module = finetune_module(layer_decay=0.5)
    trainer = make_trainer(tmp_path, max_steps=2, limit_val_batches=0)
    trainer.fit(module, datamodule=LabelledImages())
    names = {id(p): n for n, p in module.vit.named_parameters()}
    scale = {}
    for group in trainer.optimizers[0].param_groups:
        for p in group["params"]:
            scale[names[id(p)]] = (group["lr_scale"], group["weight_decay"])
    depth = 3  # blocks.i -> 0.5 ** (depth - i); embeddings 0.5 ** (depth + 1); head and norms 1
    assert scale["blocks.0.attn.qkv.weight"] == (0.5**3, 0.05)
    assert scale["blocks.2.mlp.fc1.weight"] == (0.5**1, 0.05)
    assert scale["blocks.1.norm1.weight"][0] == 0.5**2
    assert scale["patch_embed.proj.weight"][0] == 0.5 ** (depth + 1) and scale["cls_token"] == (0.5**4, 0.0)
    assert scale["head.weight"] == (1.0, 0.05) and scale["fc_norm.weight"] == (1.0, 0.0)
    lrs = {g["lr_scale"]: g["lr"] for g in trainer.optimizers[0].param_groups}
    assert len(lrs) == depth + 2 and lrs[1.0] > 0
    assert all(lr == pytest.approx(lrs[1.0] * s) for s, lr in lrs.items())  # the schedule applies the scales


def test_mixup__applied_to_training_batches_only(tmp_path):
    module = finetune_module()
    calls = []
    mixup = module.mixup

    def spy(x, y):
        calls.append(y.shape)
        return mixup(x, y)

    module.mixup = spy
    seen_val = []
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=2)
    original = module.validation_step
    module.validation_step = lambda batch, batch_idx: (
        seen_val.append(batch[1].dtype),
        original(batch, batch_idx),
    )[1]
    trainer.fit(module, datamodule=LabelledImages())
    assert len(calls) == 2 and all(shape == (4,) for shape in calls)  # hard labels in, soft targets out
    assert seen_val and all(dtype == torch.long for dtype in seen_val)


def test_mixup__odd_batch_fails_at_start(tmp_path):
    with pytest.raises(ValueError, match="batch_size must be even"):
        make_trainer(tmp_path, max_steps=1).fit(finetune_module(), datamodule=LabelledImages(batch_size=3))


def test_linprobe__frozen_encoder_batchnorm_head_and_lars(tmp_path):
    module = finetune_module(
        mode="linprobe", global_pool="token", mixup=0, cutmix=0, drop_path_rate=0, label_smoothing=0
    )
    before = {k: v.clone() for k, v in module.vit.state_dict().items() if not k.startswith("head")}
    assert isinstance(module.vit.head[0], nn.BatchNorm1d) and not module.vit.head[0].affine
    trainer = make_trainer(tmp_path, max_steps=3, limit_val_batches=1)
    trainer.fit(module, datamodule=LabelledImages())
    assert type(trainer.optimizers[0]).__name__ == "Lars"
    trainable = {n for n, p in module.vit.named_parameters() if p.requires_grad}
    assert trainable == {"head.1.weight", "head.1.bias"}
    for key, value in before.items():
        torch.testing.assert_close(module.vit.state_dict()[key], value)
    with pytest.raises(ValueError, match="frozen features"):
        finetune_module(mode="linprobe")  # mixup / drop path make no sense on frozen features


def test_pos_embed_resampling__hand_computed_cases():
    cls = torch.randn(1, 1, 8)
    flat = torch.ones(1, 4, 8) * torch.arange(8.0)  # every position the same vector
    out = resample_pos_embed(torch.cat([cls, flat], 1), (4, 4), (2, 2))
    assert out.shape == (1, 17, 8)
    torch.testing.assert_close(out[:, :1], cls)  # cls position kept
    # a constant stays constant
    torch.testing.assert_close(out[:, 1:], torch.ones(1, 16, 8) * torch.arange(8.0))
    # 1x2 -> 1x4 (bicubic, a=-0.75, half-pixel centres): new x = 0.5*i - 0.25, border clamped
    pos = torch.tensor([[[0.0], [1.0]]])
    out = resample_pos_embed(torch.cat([torch.zeros(1, 1, 1), pos], 1), (1, 4), (1, 2))[0, 1:, 0]

    # the weights of the cubic convolution kernel at t = 0.75 and t = 0.25 (clamped neighbours)
    def w(t: float) -> tuple[float, float, float, float]:  # Keys' cubic kernel weights, a = -0.75
        return (
            -0.75 * t**3 + 1.5 * t**2 - 0.75 * t,
            1.25 * t**3 - 2.25 * t**2 + 1,
            -1.25 * t**3 + 1.5 * t**2 + 0.75 * t,
            0.75 * t**3 - 0.75 * t**2,
        )

    a = w(0.75)  # x = -0.25: neighbours -2,-1,0,1 -> values 0,0,0,1
    b = w(0.25)  # x = 0.25: neighbours -1,0,1,2 -> values 0,0,1,1
    expected = torch.tensor([a[3], b[2] + b[3], 1 - (b[2] + b[3]), 1 - a[3]])
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def test_finetune__missing_pretrained_checkpoint_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist: point it at pretrained weights.*null"):
        finetune_module(encoder=dict(checkpoint=str(tmp_path / "missing.ckpt")))


def test_finetune__wrong_architecture_checkpoint_is_refused(tmp_path):
    path = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, path)
    with pytest.raises(ValueError, match="not a ViT / MAE state dict"):
        finetune_module(encoder=dict(checkpoint=str(path)))


def test_knn__weighted_votes_hand_computed():
    train = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]), dim=1)
    labels = torch.tensor([0, 0, 1])
    query = torch.nn.functional.normalize(torch.tensor([[1.0, 0.05]]), dim=1)
    scores = knn_classify(train, labels, query, num_classes=2, k=2, temperature=0.5)
    sims = query @ train.T
    top2 = sims[0, :2]  # both class-0 points are the nearest two
    torch.testing.assert_close(scores[0], torch.tensor([(top2 / 0.5).exp().sum(), 0.0]))
    acc1, acc5 = knn_accuracy((train, labels), (train, labels), num_classes=2, k=1)
    assert acc1 == 100.0 and acc5 == 100.0


CONFIGS = sorted(
    p
    for folder in ("finetune", "linprobe")
    for p in (Path(__file__).resolve().parents[3] / "configs" / folder).glob("*.yaml")
)
LIGHT = [*CPU_TRAINER, "--trainer.logger", "false", "--model.encoder.checkpoint", "null"]


def test_finetune_configs__the_required_recipes_exist():
    names = {f"{p.parent.name}/{p.name}" for p in CONFIGS}
    assert {
        "finetune/default.yaml",
        "finetune/imagenet_vit_base.yaml",
        "finetune/cifar10_vit_base.yaml",
        "finetune/cifar10_vit_tiny.yaml",
        "finetune/cifar100_vit_base.yaml",
        "linprobe/imagenet_vit_base.yaml",
        "finetune/imagenet_vit_large.yaml",
        "finetune/imagenet_vit_huge.yaml",
        "finetune/default_joint.yaml",
        "finetune/photos_joint.yaml",
    } <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_finetune_config__parses_and_builds(config, monkeypatch, tmp_path):
    from mae.cli.finetune import FinetuneMonitorsCLI  # mae finetune's: the kNN and probe monitors too
    from mae.data import ImageDataModule
    from tests.helpers import write_cifar, write_image_folder

    monkeypatch.chdir(config.parents[2])
    monkeypatch.setattr("sys.argv", ["finetune.py"])
    data = []
    if "imagenet" in config.name or "photos" in config.name:  # image folders
        write_image_folder(tmp_path / "train", ["a", "b"], per_class=1)
        data = ["--data.root", str(tmp_path)]
    elif "cifar" in config.name:
        write_cifar(
            tmp_path, "cifar100" if "cifar100" in config.name else "cifar10", train_per_batch=1, test=1
        )
        data = ["--data.root", str(tmp_path)]
    light = []
    if "imagenet" in config.name or "vit_base" in config.name:
        light = ["--model.encoder.model_kwargs", '{"depth": 1}']
    cli = FinetuneMonitorsCLI(
        MAEFinetuneModule,
        ImageDataModule,
        subclass_mode_data=True,
        run=False,
        args=["--config", str(config), *LIGHT, *data, *light],
    )
    assert cli.model.hparams.num_classes == cli.datamodule.num_labels
    assert cli.model.hparams.img_size == cli.datamodule.img_size
    # none: the digits probe (plain scans); the joint objective trains with fine-tuning's augmentations
    assert cli.datamodule.augmentation in (cli.model.augmentation, "none")


def _uses_lightnings_own_load(module_class: type) -> bool:
    import inspect

    import lightning.pytorch as pl

    own = inspect.getattr_static(pl.LightningModule, "load_from_checkpoint")
    return inspect.getattr_static(module_class, "load_from_checkpoint") is own


@pytest.mark.parametrize("mode", ["finetune", "linprobe"])
def test_trained_classifier__rebuilds_with_lightnings_load_from_checkpoint_elsewhere_without_its_start(
    tmp_path, monkeypatch, mode
):
    """The fine-tuned checkpoint's hyperparameters record its encoder's architecture: Lightning's own
    load_from_checkpoint rebuilds the classifier in another folder, with the pretraining file (named
    relative to the run's folder) gone, and it computes exactly what the module that saved it did."""
    import shutil

    from tests.helpers import tiny_pretraining_checkpoint

    assert _uses_lightnings_own_load(MAEFinetuneModule)
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copytree(tiny_pretraining_checkpoint(tmp_path / "pre").parent, run)
    monkeypatch.chdir(run)
    settings = dict(mode=mode, img_size=16, num_classes=3, optim=dict(warmup_epochs=0))
    if mode == "linprobe":
        settings.update(mixup=0.0, cutmix=0.0, drop_path_rate=0.0)
    module = MAEFinetuneModule(encoder=dict(checkpoint="last.ckpt"), **settings)
    assert module.hparams.encoder_config["embed_dim"] == module.vit.embed_dim  # filled in from the file
    trainer = make_trainer(run, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=LabelledImages(batch_size=8))
    trainer.save_checkpoint(elsewhere / "trained.ckpt")
    shutil.rmtree(run)
    monkeypatch.chdir(elsewhere)
    loaded = MAEFinetuneModule.load_from_checkpoint("trained.ckpt")
    assert loaded.hparams.encoder["checkpoint"] == "last.ckpt" and loaded.mode == mode
    ours, theirs = module.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(module.eval()(images), loaded.eval()(images))


def test_trained_classifier_built_by_the_cli__loads_with_lightnings_load_from_checkpoint(
    tmp_path, monkeypatch
):
    """A module LightningCLI built records the CLI's instantiator with its hyperparameters, so
    load_from_checkpoint parses them back through jsonargparse: the encoder's architecture among them."""
    import shutil

    from mae.cli.lightning import FinetuneCLI
    from mae.data import ImageDataModule
    from tests.helpers import tiny_pretraining_checkpoint

    start = tmp_path / "start.ckpt"
    shutil.copy(tiny_pretraining_checkpoint(tmp_path / "pre"), start)
    monkeypatch.setattr("sys.argv", ["mae"])
    recipe = next(p for p in CONFIGS if p.parent.name == "finetune" and p.name == "default.yaml")
    args = ["--config", str(recipe), *LIGHT, "--model.encoder.checkpoint", str(start)]
    args += ["--model.optim.warmup_epochs", "0"]
    cli = FinetuneCLI(MAEFinetuneModule, ImageDataModule, subclass_mode_data=True, run=False, args=args)
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(cli.model, datamodule=cli.datamodule)
    trainer.save_checkpoint(tmp_path / "trained.ckpt")
    saved = torch.load(tmp_path / "trained.ckpt", map_location="cpu", weights_only=True)["hyper_parameters"]
    # the pretraining size
    assert "_instantiator" in saved and saved["encoder_config"]["img_size"] == [16, 16]
    start.unlink()
    loaded = MAEFinetuneModule.load_from_checkpoint(tmp_path / "trained.ckpt")
    ours, theirs = cli.model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    images = torch.randn(2, loaded.in_chans, loaded.img_size, loaded.img_size)
    with torch.no_grad():
        assert torch.equal(cli.model.eval()(images), loaded.eval()(images))


# ---------------------------------------------------------------------------------------------- a CNN encoder
def _labelled_32px(**kwargs) -> LabelledImages:
    """``LabelledImages`` at 32x32 px: a CNN model takes multiples of its largest stride."""
    data = LabelledImages(**kwargs)
    images, labels = data.data.tensors
    data.data.tensors = (nn.functional.interpolate(images, size=32), labels)
    return data


def test_cnn_finetune__random_timm_resnet_with_timms_head_layer_decay_per_block_and_its_record(
    tmp_path,
):
    """model.encoder.model spark without a checkpoint: the timm ResNet itself at random initialisation, its
    classifier timm's ``fc``, layer decay over timm's blocks (stem lowest, the head at 1), no decay on 1-D
    weights; the record rebuilds it in timm alone, and load_from_checkpoint without the record's file."""
    import timm

    encoder = dict(model="spark", model_kwargs=dict(encoder="resnet10t", mask_unit=8, decoder_width=64))
    module = finetune_module(encoder=encoder, img_size=32, layer_decay=0.5, drop_path_rate=0.0)
    assert type(module.vit) is type(timm.create_model("resnet10t")) and module.vit.fc.out_features == 3
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=_labelled_32px(batch_size=8))
    names = {id(p): n for n, p in module.vit.named_parameters()}
    scale = {
        names[id(p)]: (g["lr_scale"], g["weight_decay"])
        for g in trainer.optimizers[0].param_groups
        for p in g["params"]
    }
    # timm's group_matcher: stem 0, layer1.0 .. layer4.0 -> 1 .. 4, the head above: 0.5 ** (5 - id)
    assert scale["conv1.0.weight"] == (0.5**5, 0.05) and scale["layer1.0.conv1.weight"] == (0.5**4, 0.05)
    assert scale["layer4.0.conv2.weight"] == (0.5, 0.05) and scale["layer4.0.bn2.weight"] == (0.5, 0.0)
    assert scale["fc.weight"] == (1.0, 0.05) and scale["fc.bias"] == (1.0, 0.0)
    record = module.architecture_record()
    assert record["class"] == "TimmCNN" and record["state_dict_prefix"] == "vit."
    args = record["args"]
    assert args["encoder"] == "resnet10t" and args["head"] == "linear" and args["global_pool"] == "avg"
    rebuilt = timm.create_model(
        args["encoder"], num_classes=args["num_classes"], in_chans=args["in_chans"], **args["encoder_kwargs"]
    )
    rebuilt.load_state_dict(module.vit.state_dict(), strict=True)
    trainer.save_checkpoint(tmp_path / "trained.ckpt")
    loaded = MAEFinetuneModule.load_from_checkpoint(tmp_path / "trained.ckpt")
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(module.eval()(images), loaded.eval()(images))
        assert torch.equal(rebuilt.eval()(images), module(images))


def test_cnn_linprobe__batchnorm_before_timms_convnext_classifier_frozen_encoder_and_no_token_pool(tmp_path):
    from tests.helpers import untrained_cnn_checkpoint

    checkpoint = untrained_cnn_checkpoint(tmp_path / "pre.ckpt", "convnextv2_atto")
    settings = dict(encoder=dict(checkpoint=str(checkpoint)), img_size=32, num_classes=3)
    settings.update(optim=dict(warmup_epochs=0), mixup=0, cutmix=0, drop_path_rate=0, label_smoothing=0)
    module = MAEFinetuneModule(mode="linprobe", **settings)
    head = module.vit.head.fc
    assert isinstance(head[0], nn.BatchNorm1d) and not head[0].affine and head[1].out_features == 3
    before = {k: v.clone() for k, v in module.vit.state_dict().items() if not k.startswith("head.fc")}
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=_labelled_32px(batch_size=8))
    assert type(trainer.optimizers[0]).__name__ == "Lars"
    assert {n for n, p in module.vit.named_parameters() if p.requires_grad} == {
        "head.fc.1.weight",
        "head.fc.1.bias",
    }
    assert all(torch.equal(module.vit.state_dict()[k], v) for k, v in before.items())
    assert module.architecture_record()["args"]["head"] == "batchnorm_linear"
    with pytest.raises(
        ValueError, match="model.global_pool 'token' pools a ViT's cls token; convnextv2_atto is a CNN"
    ):
        MAEFinetuneModule(global_pool="token", **settings)
