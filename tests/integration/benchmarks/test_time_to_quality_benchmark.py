"""Tiny runs of benchmarks/time_to_quality.py (the real numbers come from the command in README)."""

import json

import pytest
import shapes_folder
import time_to_quality as ttq
import yaml

from mae.convert.backbone import load_backbone
from mae.data import ImageFolderDataModule
from mae.eval.knn import knn_evaluate
from mae.models import create_model
from mae.models.flops import mae_train_flops
from tests.helpers import ONE_TIMED_STEP, REPO, TINY_KWARGS, write_image_folder


def test_time_to_quality__tiny_run_evaluates_what_each_budget_reached(tmp_path):
    write_image_folder(tmp_path / "data" / "train", ["a", "b", "c"], per_class=8, size=(20, 20))
    write_image_folder(tmp_path / "data" / "val", ["a", "b", "c"], per_class=3, size=(20, 20), seed=1)
    out = tmp_path / "out"
    table = ttq.main(
        [
            "--data",
            "imagefolder",
            "--root",
            str(tmp_path / "data"),
            "--img-size",
            "16",
            "--model-kwargs",
            json.dumps(TINY_KWARGS),
            "--batch-size",
            "8",
            "--epochs",
            "2",
            "--seeds",
            "0",
            "--budgets",
            "0.5",
            "1",
            "--variants",
            "low-res",
            "fast",
            "progressive",
            "--probe-max-epochs",
            "2",
            "--keep-checkpoints",
            "--out",
            str(out),
        ]
    )
    for name in ("default", "low-res", "fast", "progressive"):
        assert f"| {name} |" in table
    assert "default recipe's final linear probe" in table
    runs = json.loads((out / "results.json").read_text())["runs"][0]
    # the default first: it sets the budgets
    assert list(runs) == ["default", "low-res", "fast", "progressive"]
    assert (runs["low-res"]["img_size"], runs["fast"]["img_size"], runs["progressive"]["img_size"]) == (
        8,
        12,
        "8->16",
    )
    default_s = runs["default"]["wall_s"]
    for run in runs.values():
        assert run["epochs"] == 2 and run["steps"] == 6 and run["images_per_s"] > 0
        assert [s["epoch"] for s in run["snapshots"]] == [1, 2]
        for fraction, scores in run["budgets"].items():
            within = [s for s in run["snapshots"] if s["elapsed_s"] <= float(fraction) * default_s]
            assert (scores is None) == (not within)
            if scores is not None:
                assert scores["epoch"] == within[-1]["epoch"] and 0 <= scores["probe"] <= 100
    assert runs["default"]["budgets"]["1.0"]["epoch"] == 2  # the default reaches its end within 100 %
    assert runs["fast"]["gflops_per_step"] < runs["default"]["gflops_per_step"]
    assert runs["low-res"]["gflops_per_step"] < runs["default"]["gflops_per_step"]
    # progressive: its last epoch at the full size, so its FLOPs per step end at the default's
    assert runs["progressive"]["gflops_per_step"] == pytest.approx(runs["default"]["gflops_per_step"])

    # the final kNN, independently: the kept checkpoint through load_backbone at the full size
    final = runs["fast"]["snapshots"][-1]["path"]
    data = ImageFolderDataModule(
        tmp_path / "data", img_size=16, batch_size=256, augmentation="none", num_workers=0
    )
    knn = knn_evaluate(load_backbone(final, img_size=16).eval(), data)[0]
    assert runs["fast"]["final"]["knn"] == pytest.approx(knn)
    assert (out / "accuracy_vs_time.png").stat().st_size > 0 and (out / "table.md").is_file()


def test_reached__the_last_snapshot_within_the_budget():
    snapshots = [{"epoch": e, "elapsed_s": 10.0 * e, "path": str(e)} for e in (1, 2, 3)]
    assert ttq.reached(snapshots, 9.9) is None
    assert ttq.reached(snapshots, 20.0)["epoch"] == 2 and ttq.reached(snapshots, 99)["epoch"] == 3


def test_step_throughput__every_variant_with_its_flops(tmp_path):
    rows = ttq.main(
        [
            "--throughput-only",
            "--device",
            "cpu",
            "--model-kwargs",
            json.dumps(TINY_KWARGS),
            "--batch-size",
            "4",
            "--variants",
            "cross-partial-0.25",
            "low-res",
            *ONE_TIMED_STEP,
            "--json",
            str(tmp_path / "t.json"),
        ]
    )
    assert [r["variant"] for r in rows] == ["default", "cross-partial-0.25", "low-res"]
    assert json.loads((tmp_path / "t.json").read_text()) == rows
    for row in rows:
        switches = ttq.VARIANTS[row["variant"]].switches
        model = create_model("mae_vit_tiny_patch4", img_size=row["img_size"], **TINY_KWARGS, **switches)
        assert row["gflops_per_step"] == pytest.approx(mae_train_flops(model.train(), 4) / 1e9)
        assert row["img_s"] > 0


def test_variants__the_recipes_are_the_shipped_configs():
    base = yaml.safe_load((REPO / "configs" / "pretrain" / "default.yaml").read_text())
    full = base["data"]["init_args"]["img_size"]
    for name, config in (("low-res", "default_lowres.yaml"), ("fast", "default_fast.yaml")):
        stacked = yaml.safe_load((REPO / "configs" / "pretrain" / config).read_text())
        variant = ttq.VARIANTS[name]
        assert stacked["data"]["init_args"]["img_size"] == ttq.pretrain_size(full, 4, variant.resolution)
        assert stacked.get("model", {}) == variant.switches
    stacked = yaml.safe_load((REPO / "configs" / "pretrain" / "default_progressive.yaml").read_text())
    phases = ttq.VARIANTS["progressive"].phases
    assert stacked["model"]["resolution_schedule"] == [
        [start, ttq.pretrain_size(full, 4, r)] for start, r in phases
    ]


def test_shapes_folder__class_folders_of_each_shape_and_an_existing_folder_refused(tmp_path):
    shapes_folder.main(["--out", str(tmp_path / "shapes"), "--train", "3", "--val", "2", "--size", "24"])
    data = ImageFolderDataModule(
        tmp_path / "shapes", img_size=24, batch_size=4, augmentation="none", num_workers=0
    )
    data.setup()
    assert (len(data.train_set), len(data.val_set)) == (12, 8)
    images = sorted((tmp_path / "shapes" / "train").glob("*/*.png"))
    assert sorted({p.parent.name for p in images}) == sorted(shapes_folder.CLASSES)
    first = images[0].read_bytes()
    with pytest.raises(SystemExit, match="exists"):
        shapes_folder.main(["--out", str(tmp_path / "shapes")])
    assert images[0].read_bytes() == first  # nothing overwritten
