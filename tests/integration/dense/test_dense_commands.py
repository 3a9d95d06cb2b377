"""``mae detect`` and ``mae segment`` end to end on tiny digit scenes, the dense modules' parameter groups and
settings, and the paper recipes (COCO Mask R-CNN, ADE20K UperNet) parsed and built on a tiny input."""

import os
import re
from pathlib import Path

import pytest
import torch

from mae.cli.main import invoke
from mae.data.sources.digit_scenes import write_digit_scenes
from mae.dense.tasks.detection import MAEDetectionModule
from mae.dense.tasks.segmentation import MAESegmentationModule
from tests.helpers import (
    CPU_TRAINER,
    REPO,
    TINY_KWARGS,
    csv_logger,
    read_metrics,
    run_mae,
    run_slurm_tasks,
    tensorboard_events,
    tensorboard_tracker,
    tiny_pretraining_checkpoint,
    with_defaults,
    write_config,
)

_ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on two cores
SCENES = dict(num_train=8, num_val=4, canvas=64, seed=0)
TINY_HEADS = {"out_channels": 16, "scales": [2, 1, 0.5, 0.25], "optim": {"warmup_epochs": 0, "base_lr": 1e-2}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dense")
    checkpoint = tiny_pretraining_checkpoint(tmp / "pretrain")
    write_digit_scenes(tmp / "scenes", **SCENES)
    return tmp, checkpoint


def _trainer(tmp: Path, name: str, epochs: int = 2) -> dict:
    return {
        "max_epochs": epochs,
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "log_every_n_steps": 1,
        "precision": "32-true",
        "logger": csv_logger(tmp, name),
    }


def _detect_config(tmp: Path, checkpoint: Path, name: str) -> dict:
    return {
        "seed_everything": 0,
        "model": {
            "encoder": {"checkpoint": str(checkpoint)},
            "detector": "mask_rcnn",
            "head_channels": 16,
            "rois_per_image": 16,
            **TINY_HEADS,
        },
        "data": {
            "class_path": "mae.dense.DigitScenesDataModule",
            "init_args": {"root": str(tmp / "scenes"), **SCENES, "masks": True, "batch_size": 4},
        },
        "trainer": _trainer(tmp, name),
        "checkpoint": {"dirpath": str(tmp / name / "ckpts")},
        "figures": {"every_n_epochs": 1, "num_images": 2, "score_threshold": 0.0},
        "tracker": tensorboard_tracker(tmp / "tb"),
    }


@pytest.mark.slow
def test_detect__trains_mask_rcnn_logs_coco_map_draws_predictions_then_evaluates_only(setup):
    tmp, checkpoint = setup
    config = _detect_config(tmp, checkpoint, "detect")
    result = run_mae("detect", config=config, tmp=tmp)
    run = tmp / "runs" / "detect" / "version_0"
    rows = read_metrics(run)
    for name in (
        "val/map",
        "val/map_50",
        "val/mask_map",
        "train/loss_mask_epoch",
        "train/loss_objectness_epoch",
    ):
        assert any(r.get(name) for r in rows), name
    epoch_map = [float(r["val/map"]) for r in rows if r.get("val/map")]
    assert len(epoch_map) == 2 and all(0 <= m <= 1 for m in epoch_map)
    assert sorted(p.name for p in (run / "predictions").iterdir()) == ["epoch_0001.png", "epoch_0002.png"]
    assert f"predictions:      {run / 'predictions' / 'epoch_0002.png'}" in result.stdout
    assert re.search(r"validation: .*val/map [\d.]+", result.stdout)
    # the tracker: mAP and prediction figures
    tracked = tensorboard_events(tmp / "tb" / "detect" / "version_0")
    assert [e.value for e in tracked.Scalars("val/map")] == pytest.approx(epoch_map)
    assert len(tracked.Images("predictions")) == 2
    saved = torch.load(tmp / "detect" / "ckpts" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["mae_architecture"]["class"] == "SimpleFeaturePyramid"
    assert saved["mae_data"]["mean"] == pytest.approx([0.485, 0.456, 0.406])  # the pretraining run's record

    # Evaluating the checkpoint again gives the last epoch's mAP.
    last = str(tmp / "detect" / "ckpts" / "last.ckpt")
    again = run_mae(
        "detect",
        "--validate_only",
        "true",
        "--ckpt_path",
        last,
        config={**config, "trainer": _trainer(tmp, "detect_eval")},
        tmp=tmp,
    )
    shown = float(re.search(r"val/map ([\d.]+)", again.stdout).group(1))
    assert shown == pytest.approx(epoch_map[-1], abs=1e-4)


@pytest.mark.slow  # two epochs of UperNet training (about 10 s)
def test_segment__trains_upernet_logs_miou_and_draws_predictions(setup):
    tmp, checkpoint = setup
    config = {
        "seed_everything": 0,
        "model": {"encoder": {"checkpoint": str(checkpoint)}, "head_channels": 16, **TINY_HEADS},
        "data": {
            "class_path": "mae.dense.DigitScenesSegmentation",
            "init_args": {"root": str(tmp / "scenes"), **SCENES, "batch_size": 4},
        },
        "trainer": _trainer(tmp, "segment", epochs=3),
        "figures": {"every_n_epochs": 3, "num_images": 2},
        "tracker": tensorboard_tracker(tmp / "tb"),
    }
    result = run_mae("segment", config=config, tmp=tmp)
    rows = read_metrics(tmp / "runs" / "segment" / "version_0")
    losses = [float(r["train/loss_epoch"]) for r in rows if r.get("train/loss_epoch")]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert any(r.get("val/miou") for r in rows) and any(r.get("val/acc") for r in rows)
    assert (tmp / "runs" / "segment" / "version_0" / "predictions" / "epoch_0003.png").exists()
    assert re.search(r"validation: .*val/miou [\d.]+", result.stdout)
    # the tracker: mIoU and prediction figures
    tracked = tensorboard_events(tmp / "tb" / "segment" / "version_0")
    assert len(tracked.Scalars("val/miou")) == 3 and len(tracked.Images("predictions")) == 1


def _module(cls, **kwargs):
    model = {
        "encoder": {"model": "mae_vit_tiny_patch4", "model_kwargs": {**TINY_KWARGS, "depth": 3}},
        "img_size": 32,
        "num_classes": 3,
        "out_channels": 16,
        "optim": {"warmup_epochs": 0},
    }
    if cls is MAEDetectionModule:
        model.update(head_channels=16, rois_per_image=8)
    return cls(**with_defaults(model, kwargs))


@pytest.mark.parametrize("cls", [MAEDetectionModule, MAESegmentationModule])
def test_dense_modules__a_checkpoint_of_another_network_is_refused_naming_the_setting(cls):
    trained = _module(cls, window_size=4, global_blocks=[2], relative_position=True)
    checkpoint = {"state_dict": trained.state_dict(), "hyper_parameters": dict(trained.hparams)}
    _module(
        cls, window_size=4, global_blocks=[2], relative_position=True, optim=dict(lr=0.5)
    ).on_load_checkpoint(checkpoint)
    with pytest.raises(
        ValueError, match=r"window_position_bias.*model\.relative_position: True there, False here"
    ):
        _module(cls, window_size=4, global_blocks=[2]).on_load_checkpoint(checkpoint)
    loose = _module(cls, window_size=4, global_blocks=[2])
    loose.strict_loading = False
    loose.on_load_checkpoint(checkpoint)  # a loose load (Lightning's strict_loading off) is left alone


@pytest.mark.parametrize("cls", [MAEDetectionModule, MAESegmentationModule])
def test_dense_modules__layer_decay_on_the_encoder_heads_at_full_lr_no_decay_on_norms(cls):
    module = _module(cls, layer_decay=0.5, optim=dict(weight_decay=0.05))
    groups = module.param_groups.groups(module.network)
    names = {id(p): n for n, p in module.network.named_parameters()}
    grouped = [names[id(p)] for g in groups for p in g["params"]]
    assert sorted(grouped) == sorted(n for n, p in module.network.named_parameters() if p.requires_grad)
    scale = {names[id(p)]: g["lr_scale"] for g in groups for p in g["params"]}
    decay = {names[id(p)]: g["weight_decay"] for g in groups for p in g["params"]}
    vit = [n for n in scale if ".vit." in f".{n}"]
    block = lambda i: next(n for n in vit if f"blocks.{i}." in n)  # noqa: E731
    # 3 blocks: the last at 0.5, each one below another factor, the patch embedding the most (0.5^4).
    assert [scale[block(i)] for i in range(3)] == [0.125, 0.25, 0.5]
    assert scale[next(n for n in vit if "patch_embed" in n)] == 0.0625
    assert all(scale[n] == 1.0 for n in scale if n not in vit)  # pyramid and heads
    assert all(decay[n] == 0 for n in decay if n.endswith(".bias") or "norm" in n.split(".")[-2])
    assert any(decay[n] == 0.05 for n in decay if n not in vit)


def test_dense_modules__bad_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="model.detector must be one of mask_rcnn, faster_rcnn, retinanet"):
        _module(MAEDetectionModule, detector="yolo")
    with pytest.raises(ValueError, match="data.in_chans must be 3"):
        _module(MAEDetectionModule, in_chans=4)
    with pytest.raises(ValueError, match="model.layer_decay must be in"):
        _module(MAESegmentationModule, layer_decay=0)
    with pytest.raises(
        FileNotFoundError, match=f"model.encoder.checkpoint {tmp_path / 'nope.ckpt'} does not exist"
    ):
        _module(MAESegmentationModule, encoder=dict(checkpoint=str(tmp_path / "nope.ckpt")))
    with pytest.raises(ValueError, match="model.anchor_sizes needs one size per pyramid map"):
        _module(MAEDetectionModule, anchor_sizes=[8, 16])


def test_detect__mask_rcnn_on_data_without_masks_is_refused_at_start_up(setup):
    tmp, checkpoint = setup
    config = _detect_config(tmp, checkpoint, "no_masks")
    config["data"]["init_args"]["masks"] = False
    result = run_mae("detect", config=config, tmp=tmp, check=False)
    assert result.returncode == 2
    assert "model.detector is mask_rcnn" in result.stderr and "data.masks is false" in result.stderr


def _scenes_as_recipe_data(scenes: Path, segmentation: bool) -> list[str]:
    if segmentation:
        return [
            "--data.init_args.root",
            str(scenes),
            "--data.init_args.masks",
            "masks/{split}",
            "--data.init_args.train_split",
            "train",
            "--data.init_args.val_split",
            "val",
            "--data.init_args.num_classes",
            "11",
            "--data.init_args.reduce_zero_label",
            "false",
            "--data.init_args.img_size",
            "64",
            "--data.init_args.num_workers",
            "0",
        ]
    return [
        "--data.init_args.root",
        str(scenes),
        "--data.init_args.train_annotations",
        "annotations/instances_train.json",
        "--data.init_args.val_annotations",
        "annotations/instances_val.json",
        "--data.init_args.train_images",
        "images/train",
        "--data.init_args.val_images",
        "images/val",
        "--data.init_args.img_size",
        "128",
        "--data.init_args.num_workers",
        "0",
    ]


@pytest.mark.parametrize(
    "command, recipe",
    [
        pytest.param("detect", "configs/detect/coco_vitdet_base_mask_rcnn.yaml", marks=pytest.mark.slow),
        pytest.param("segment", "configs/segment/ade20k_upernet_vit_base.yaml", marks=pytest.mark.slow),
    ],
)
def test_recipes__the_papers_settings_parse_build_and_train_a_step_on_a_tiny_input(
    setup, command, recipe, monkeypatch
):
    tmp, _ = setup
    monkeypatch.chdir(tmp)
    args = [
        "--config",
        str(REPO / recipe),
        "--model.encoder.checkpoint",
        "null",
        *CPU_TRAINER,
        "--trainer.max_steps",
        "1",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.enable_progress_bar",
        "false",
        "--figures.every_n_epochs",
        "0",
        "--trainer.logger",
        "false",
        "--data.init_args.batch_size",
        "2",
        "--trainer.sync_batchnorm",
        "false",
        "--model.optim.warmup_epochs",
        "0",
        *_scenes_as_recipe_data(tmp / "scenes", command == "segment"),
    ]
    cli = invoke(command, args)
    model = cli.model
    assert model.encoder.embed_dim == 768 and len(model.encoder.blocks) == 12  # ViT-B
    if command == "detect":
        assert model.pyramid.window_size == 14 and model.pyramid.global_blocks == (2, 5, 8, 11)
        assert model.pyramid.relative_position and hasattr(model.encoder.blocks[0], "window_position_bias")
        assert model.pyramid.grad_checkpointing and model.hparams.layer_decay == 0.7
    else:
        assert model.pyramid.blocks == (3, 5, 7, 11) and model.hparams.layer_decay == 0.65
    assert cli.trainer.global_step == 1


@pytest.mark.parametrize(
    "command, config", [("detect", "detect/default.yaml"), ("segment", "segment/default.yaml")]
)
def test_default_configs__parse(command, config, capsys):
    with pytest.raises(SystemExit) as exit:
        invoke(command, ["--config", str(REPO / "configs" / config), "--print_config"])
    assert exit.value.code == 0
    assert "class_path: mae.dense." in capsys.readouterr().out


@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", ["segment", "detect"])
def test_ddp__two_processes_train_and_score_every_validation_image_once(setup, command):
    tmp, checkpoint = setup
    scenes = dict(num_train=8, num_val=3, canvas=64, seed=1)  # 3 validation scenes: shards of 2 and 1
    name = f"ddp_{command}"
    if command == "detect":
        config = _detect_config(tmp, checkpoint, name)
        metric = "val/map"
    else:
        config = {
            "seed_everything": 0,
            "model": {"encoder": {"checkpoint": str(checkpoint)}, "head_channels": 16, **TINY_HEADS},
            "data": {"class_path": "mae.dense.DigitScenesSegmentation", "init_args": {}},
            "checkpoint": {"dirpath": str(tmp / name / "ckpts")},
            "figures": {"every_n_epochs": 1},
        }
        metric = "val/miou"
    config["data"]["init_args"].update(root=str(tmp / "scenes_ddp"), **scenes, batch_size=2)
    config["trainer"] = {**_trainer(tmp, name, epochs=1), "devices": 2, "strategy": "ddp"}
    # the tasks of a one-node SLURM job, forked (Lightning's own launcher: tests/integration/pretrain/
    # test_preemption.py)
    run_slurm_tasks(command, "--config", str(write_config(tmp, config, name)), env=_ONE_THREAD)
    logged = [float(r[metric]) for r in read_metrics(tmp / "runs" / name / "version_0") if r.get(metric)][-1]
    single = {**config, "trainer": _trainer(tmp, f"{name}_single", epochs=1)}
    last = str(tmp / name / "ckpts" / "last.ckpt")
    again = run_mae(command, "--validate_only", "true", "--ckpt_path", last, config=single, tmp=tmp)
    assert float(re.search(rf"{metric} ([\d.]+)", again.stdout).group(1)) == pytest.approx(logged, abs=1e-4)


@pytest.mark.slow  # trains a step of each network (about 8 s)
@pytest.mark.parametrize("module_class", [MAEDetectionModule, MAESegmentationModule])
def test_trained_checkpoint__rebuilds_with_lightnings_load_from_checkpoint_elsewhere_without_its_start(
    setup, tmp_path, monkeypatch, module_class
):
    """A trained checkpoint holds every weight and its hyperparameters record what the pretraining file
    gave (the encoder's architecture, the input normalisation): Lightning's own load_from_checkpoint
    rebuilds the network in another folder, the pretraining file (named relative to the run's folder)
    gone, and it predicts exactly what the module that saved it did."""
    import inspect
    import shutil

    import lightning.pytorch as pl

    from mae.dense import DigitScenesDataModule, DigitScenesSegmentation
    from tests.helpers import make_trainer

    own = inspect.getattr_static(pl.LightningModule, "load_from_checkpoint")
    assert inspect.getattr_static(module_class, "load_from_checkpoint") is own
    tmp, checkpoint = setup
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir(), elsewhere.mkdir()
    pretrained = torch.load(checkpoint, map_location="cpu", weights_only=True)
    normalisation = {"mean": [0.2, 0.3, 0.4], "std": [0.5, 0.6, 0.7]}  # the pretraining run's, not ImageNet's
    pretrained["mae_data"] = {"in_chans": 3, "img_size": [16, 16], **normalisation}
    torch.save(pretrained, run / "pretrained.ckpt")
    monkeypatch.chdir(run)
    detection = module_class is MAEDetectionModule
    extra = {"detector": "faster_rcnn", "head_channels": 16, "rois_per_image": 16} if detection else {}
    module = module_class(
        encoder=dict(checkpoint="pretrained.ckpt"), img_size=64, num_classes=11, **TINY_HEADS, **extra
    )
    assert list(module.mean) == normalisation["mean"] and list(module.std) == normalisation["std"]
    data_class = DigitScenesDataModule if detection else DigitScenesSegmentation
    data = data_class(root=str(tmp / "scenes"), **SCENES, batch_size=4)
    trainer = make_trainer(run, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    trainer.save_checkpoint(elsewhere / "trained.ckpt")
    shutil.rmtree(run)
    monkeypatch.chdir(elsewhere)
    loaded = module_class.load_from_checkpoint("trained.ckpt")
    assert loaded.hparams.encoder["checkpoint"] == "pretrained.ckpt"
    theirs, ours = loaded.state_dict(), module.state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in ours)
    assert list(loaded.mean) == normalisation["mean"] and list(loaded.std) == normalisation["std"]
    module.eval(), loaded.eval()
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        if detection:
            first, second = module.network(list(images)), loaded.network(list(images))
            for a, b in zip(first, second, strict=True):
                assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
        else:
            assert torch.equal(module.network(images), loaded.network(images))


def test_detection_run__says_its_augmentation_and_why_an_empty_validation_scores_map_0(
    setup, tmp_path, monkeypatch
):
    from mae.dense import DigitScenesDataModule
    from mae.dense.data import detection as data_module
    from mae.dense.tasks import detection as task_module
    from tests.helpers import make_trainer

    said = []
    monkeypatch.setattr(data_module, "rank_zero_info", said.append)
    monkeypatch.setattr(task_module, "rank_zero_info", said.append)

    tmp, checkpoint = setup
    module = MAEDetectionModule(
        encoder=dict(checkpoint=str(checkpoint)),
        img_size=64,
        num_classes=11,
        detector="faster_rcnn",
        head_channels=16,
        rois_per_image=16,
        **TINY_HEADS,
    )
    module.detector.roi_heads.score_thresh = 1.1  # no detection can pass
    data = DigitScenesDataModule(root=str(tmp / "scenes"), **SCENES, batch_size=4)
    trainer = make_trainer(tmp_path, max_epochs=2, limit_train_batches=1)
    trainer.fit(module, datamodule=data)
    assert "training augmentation: data.augmentation none (the images as they are)" in said
    # two validations, once
    assert sum("this validation found no object at all" in line for line in said) == 1
    assert trainer.callback_metrics["val/map"] == 0


def test_detect__a_polygon_of_more_points_than_pycocotools_can_afford_is_refused_at_start_up(setup, tmp_path):
    """A polygon inside its image but of 100,000 points would make pycocotools allocate in proportion to
    points x image size for every mask it draws: the annotation is refused by id and image file before
    any step, as the other polygon checks refuse theirs."""
    import json
    import shutil

    from mae.dense.data.coco import MAX_POLYGON_POINTS

    tmp, checkpoint = setup
    scenes = shutil.copytree(tmp / "scenes", tmp_path / "scenes")
    annotations = scenes / "annotations" / "instances_train.json"
    data = json.loads(annotations.read_text())
    first = data["annotations"][0]
    x, y, width, height = first["bbox"]
    # a zigzag from side to side of the annotation's own box: every point inside the image
    points = 100_000
    zigzag = [v for i in range(points) for v in (x + width * (i % 2), y + height * i / points)]
    first["segmentation"] = [zigzag]
    annotations.write_text(json.dumps(data))
    image = next(i for i in data["images"] if i["id"] == first["image_id"])

    config = _detect_config(tmp, checkpoint, "many_points")
    config["data"] = {
        "class_path": "mae.dense.DetectionDataModule",
        "init_args": {"root": str(scenes), "masks": True, "img_size": 64, "batch_size": 4, "num_workers": 0},
    }
    config["trainer"] |= {"max_steps": 1, "limit_val_batches": 0}
    result = run_mae("detect", config=config, tmp=tmp, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {annotations}: polygons of more than {MAX_POLYGON_POINTS:,} points"), last
    named = f"annotation id {first['id']} in image id {image['id']} ({image['file_name']}): 100,000 points"
    assert named in last
    assert not (tmp / "runs" / "many_points").exists()  # refused before the run started
