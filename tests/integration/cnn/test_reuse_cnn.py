"""A pretrained CNN reused through the commands (issue 68, item 3): ``mae finetune``, ``mae embed``, ``mae
anomaly --method features`` and ``mae detect`` on one tiny ``mae pretrain`` run of a SparK ResNet
(``resnet10t``, 32 px), each reading the CNN's own maps where the ViT's are read."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from mae.apps.anomaly.digits import write_digit_anomalies
from mae.data.sources.digit_scenes import write_digit_scenes
from tests.helpers import cli_trainer, csv_logger, folder_data, read_metrics, run_mae, write_train_val_folders

CNN_MODEL = {
    "model": "spark",
    "model_kwargs": {"encoder": "resnet10t", "mask_unit": 8, "decoder_width": 64},
    "mask_ratio": 0.6,
    "optim": {"warmup_epochs": 0},
}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> tuple[Path, Path]:
    """(the folder, its CNN pretraining checkpoint): one epoch of ``mae pretrain`` of a SparK resnet10t on
    12 images of 32 px."""
    tmp = tmp_path_factory.mktemp("cnn_reuse")
    write_train_val_folders(tmp / "data")
    config = {
        "seed_everything": 0,
        "model": CNN_MODEL,
        "data": folder_data(tmp / "data", img_size=32),
        "trainer": cli_trainer(tmp, "pretrain", max_epochs=1),
    }
    run_mae("pretrain", config=config, tmp=tmp)
    return tmp, tmp / "runs" / "pretrain" / "version_0" / "checkpoints" / "last.ckpt"


def test_finetune__the_timm_resnet_with_the_pretrained_encoder_and_a_new_fc_head(pretrained):
    tmp, checkpoint = pretrained
    config = {
        "seed_everything": 0,
        "model": {
            "encoder": {"checkpoint": str(checkpoint)},
            "optim": {"warmup_epochs": 0},
            "layer_decay": 0.75,
        },
        "data": folder_data(tmp / "data", img_size=32, augmentation="finetune"),
        "trainer": cli_trainer(tmp, "finetune", max_epochs=1),
    }
    result = run_mae("finetune", config=config, tmp=tmp)
    assert "validation top-1" in result.stdout
    assert "not in the checkpoint (left as initialised): fc.bias, fc.weight" in result.stdout + result.stderr
    trained = tmp / "runs" / "finetune" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(trained, map_location="cpu", weights_only=False)
    record = saved["mae_architecture"]
    assert record["class"] == "TimmCNN" and record["args"]["encoder"] == "resnet10t"
    assert saved["state_dict"]["vit.fc.weight"].shape == (3, 512)  # timm's classifier, 3 classes


def test_embed__vectors_of_the_cnns_pooled_last_map(pretrained):
    tmp, checkpoint = pretrained
    out = tmp / "index.parquet"
    result = run_mae("embed", "--checkpoint", str(checkpoint), str(tmp / "data" / "val"), "--out", str(out))
    assert "6 vectors of length 512 (avg pooling, input 32x32)" in result.stdout
    assert json.loads(pq.read_schema(out).metadata[b"mae_embeddings"])["pool"] == "avg"


def test_anomaly_features__patchcore_on_the_cnns_stride_8_and_16_stages(pretrained):
    tmp, checkpoint = pretrained
    digits = write_digit_anomalies(tmp / "digits", seed=0, num_normal=6, num_test=6)
    args = [
        "--method",
        "features",
        "--checkpoint",
        str(checkpoint),
        "--normal",
        str(digits / "train" / "good"),
    ]
    args += ["--test", str(digits / "test"), "--out", str(tmp / "anomaly"), "--figures", "none"]
    result = run_mae("anomaly", *args)
    # layer2 (128 channels) + layer3 (256) on the 4 x 4 grid of stride 8 at 32 px: 4 normal images fitted
    assert "64 patch vectors of length 384" in result.stdout
    metrics = json.loads((tmp / "anomaly" / "metrics.json").read_text())
    assert metrics["settings"]["feature_blocks"] == [2, 3] and "image_auroc" in metrics


def test_detect__faster_rcnn_on_the_cnns_own_pyramid(pretrained):
    tmp, checkpoint = pretrained
    scenes = dict(num_train=4, num_val=2, canvas=64, seed=0)
    write_digit_scenes(tmp / "scenes", **scenes)
    config = {
        "seed_everything": 0,
        "model": {
            "encoder": {"checkpoint": str(checkpoint)},
            "detector": "faster_rcnn",
            "out_channels": 16,
            "head_channels": 16,
            "rois_per_image": 16,
            "optim": {"warmup_epochs": 0},
        },
        "data": {
            "class_path": "mae.dense.DigitScenesDataModule",
            "init_args": {"root": str(tmp / "scenes"), **scenes, "masks": False, "batch_size": 2},
        },
        "trainer": {**cli_trainer(tmp, "detect", max_epochs=1), "logger": csv_logger(tmp, "detect")},
        "checkpoint": {"dirpath": str(tmp / "detect")},
        "figures": {"every_n_epochs": 0},
    }
    run_mae("detect", config=config, tmp=tmp)
    assert any(r.get("val/map") for r in read_metrics(tmp / "runs" / "detect" / "version_0"))
    saved = torch.load(tmp / "detect" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["mae_architecture"]["args"]["pyramid"] == "CNNFeaturePyramid"
    assert "detector.backbone.encoder.layer4.0.conv1.weight" in saved["state_dict"]
