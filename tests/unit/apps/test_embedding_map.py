"""``mae map``: the 2-D t-SNE map of an embedding index, through the command line (``mae embed --map`` is
tested with the embedding tests, which have a checkpoint)."""

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mae.apps.embeddings.embedding_index import IndexMeta, Rows, write_index
from mae.apps.embeddings.embedding_map import PALETTE, UNLABELLED, map_record
from mae.cli.main import main
from tests.helpers import run_mae


def write_index_of(folder: Path, labels: list[str | None], name: str = "index.npy", nan_row=None) -> Path:
    """An index (``write_index``) of one 16x16 PNG of random pixels per label, its 64-long vector drawn
    around +1 or -1 by its label's class ("a" or anything else), seed 0."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(len(labels)):
        path = folder / "images" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    centres = np.array([1.0 if label == "a" else -1.0 for label in labels])[:, None]
    vectors = (centres + 0.3 * rng.normal(size=(len(labels), 64))).astype(np.float32)
    if nan_row is not None:
        vectors[nan_row] = np.nan
    meta = IndexMeta("tiny.ckpt", "0" * 64, "cls", 64, [16, 16], 3, [0.5] * 3, [0.25] * 3, count=len(labels))
    return write_index(folder / name, meta, [Rows(paths, labels, vectors)])


def pixels_of(path: Path, colour: str) -> int:
    """How many pixels of the PNG at ``path`` are exactly ``colour`` ("#rrggbb")."""
    rgb = np.array(Image.open(path).convert("RGB")).reshape(-1, 3)
    return int((rgb == [int(colour[i : i + 2], 16) for i in (1, 3, 5)]).all(axis=1).sum())


@pytest.mark.slow  # two maps drawn
def test_map__labelled_index_coloured_by_label_rerun_replaces_it_and_a_deleted_thumbnail_is_skipped(
    tmp_path,
):
    index = write_index_of(tmp_path, ["a", "b"] * 12, "index.parquet")
    out = tmp_path / "maps" / "map.png"
    result = run_mae("map", str(index), "--out", str(out), "--thumbnails", "--title", "tiny", timeout=120)
    assert "t-SNE of all 24 cls-pooled vectors" in result.stdout and "coloured by label" in result.stdout
    record = map_record(out)
    assert record["colours"] == {"a": PALETTE[0], "b": PALETTE[1]} and record["panels"][0]["labelled"]
    assert pixels_of(out, PALETTE[0]) > 50 and pixels_of(out, PALETTE[1]) > 50  # dots and frames of each
    assert pixels_of(out, UNLABELLED) == 0
    thumbnails = record["thumbnails"]
    assert len(thumbnails) >= 2 and record["skipped"] == []

    # a rerun replaces its own map; an image deleted since the index was built loses only its thumbnail
    Path(thumbnails[0]).unlink()
    again = run_mae("map", str(index), "--out", str(out), "--thumbnails", timeout=120)
    record = map_record(out)
    assert [skip["path"] for skip in record["skipped"]] == [thumbnails[0]]
    assert record["thumbnails"] == thumbnails[1:]
    assert f"thumbnail skipped, {thumbnails[0]}: " in again.stderr


@pytest.mark.slow  # a map drawn
def test_map__an_index_without_labels_is_drawn_in_one_colour_from_a_stated_sample(tmp_path):
    index = write_index_of(tmp_path, [None] * 24)
    out = tmp_path / "map.png"
    result = run_mae("map", str(index), "--out", str(out), "--max-points", "10", "--seed", "3", timeout=120)
    assert "a random sample of 10 of 24" in result.stdout and "no labels: one colour" in result.stdout
    record = map_record(out)
    assert record["colours"] == {} and not record["panels"][0]["labelled"]
    assert record["panels"][0]["points"] == 10 and record["panels"][0]["perplexity"] == 9  # clipped below 10
    assert pixels_of(out, UNLABELLED) > 20 and all(pixels_of(out, colour) == 0 for colour in PALETTE[:2])


def test_map__a_file_it_did_not_write_is_refused_and_bad_inputs_are_named(tmp_path):
    index = write_index_of(tmp_path, ["a", "b", "a"])
    unrelated = tmp_path / "photo.png"
    unrelated.write_bytes(b"not ours")

    def error(*args: str) -> str:
        result = run_mae("map", *args, check=False, timeout=120)
        assert result.returncode == 2, result.stderr
        return result.stderr.strip().splitlines()[-1]

    assert error(str(index), "--out", str(unrelated)) == (
        f"error: --out {unrelated} holds a file that no run of mae map wrote; choose another path, or move "
        "it away: mae map replaces only its own outputs"
    )
    assert unrelated.read_bytes() == b"not ours"
    out = str(tmp_path / "map.png")
    assert "index.jpg: the map is written as a PNG image" in error(
        str(index), "--out", str(tmp_path / "index.jpg")
    )
    assert "--max-points must be at least 3, got 0" in error(str(index), "--out", out, "--max-points", "0")
    assert f"index {tmp_path / 'no.npy'} does not exist" in error(str(tmp_path / "no.npy"), "--out", out)
    np.save(tmp_path / "vectors.npy", np.zeros((4, 2), np.float32))
    assert "vectors.csv is missing: an .npy index is" in error(str(tmp_path / "vectors.npy"), "--out", out)
    two = write_index_of(tmp_path, ["a", "b"], "two.npy")
    assert f"{two} holds 2 vector(s): a map needs at least 3" in error(str(two), "--out", out)
    broken = write_index_of(tmp_path, ["a", "b", "a", "b"], "nan.npy", nan_row=2)
    assert f"{broken} has 1 vector(s) with NaN or infinite values (the first: row 2, " in error(
        str(broken), "--out", out
    )
    assert not Path(out).exists()


def test_map__without_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    index = write_index_of(tmp_path, ["a", "b", "a"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setattr(sys, "argv", ["mae", "map", str(index), "--out", str(tmp_path / "map.png")])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    assert 'error: the embedding map needs matplotlib: pip install -e ".[embed]"' in capsys.readouterr().err
    assert not (tmp_path / "map.png").exists()


@pytest.mark.slow  # a map drawn
def test_map__vectors_with_no_spread_are_drawn_at_one_place_with_a_note(tmp_path):
    """An index of copies of one image (one vector, or one direction at other lengths): t-SNE's PCA start
    would divide by their zero spread; the map draws every point at one place and says so."""
    index = write_index_of(tmp_path, ["a", "b", "a", "b", "a"])
    copies = tmp_path / "copies.npy"
    vectors = np.load(index)
    vectors[:] = vectors[0] * np.array([1, 1, 2, 0.5, 1], np.float32)[:, None]  # one direction
    np.save(copies, vectors)
    for suffix in (".csv", ".json"):
        (tmp_path / f"copies{suffix}").write_bytes(index.with_suffix(suffix).read_bytes())
    out = tmp_path / "map.png"
    result = run_mae("map", str(copies), "--out", str(out), "--thumbnails", timeout=120, check=False)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (
        f"wrote {out}: all 5 cls-pooled vectors (64 values) point the same way (copies of one image?): no "
        "t-SNE, every point drawn at one place" in result.stdout
    )
    record = map_record(out)
    assert record["panels"][0]["same_direction"] and len(record["thumbnails"]) == 1
    assert pixels_of(out, PALETTE[0]) > 0
