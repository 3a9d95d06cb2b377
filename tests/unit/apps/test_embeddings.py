"""``mae embed`` and ``mae search``: embeddings of image folders, resumable, and exact
cosine neighbours, checked against the encoder run directly and against numpy."""

import importlib.util
import json
import shutil
import signal
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from mae import create_model, load_mae
from mae.apps.embeddings import embed_run
from mae.apps.embeddings.embedding_index import EmbeddingIndex
from mae.apps.embeddings.similarity import cosine_top_k
from mae.apps.page.search import SearchSession
from mae.cli.main import invoke
from mae.convert.architecture import DATA_KEY
from mae.convert.export import export_encoder
from mae.convert.huggingface import save_hf_pretrained
from mae.inference import images
from tests.helpers import REPO, TINY_KWARGS, run_mae, start_mae, tiny_pretraining_checkpoint

MEAN, STD = (
    [0.2, 0.3, 0.4],
    [0.5, 0.6, 0.7],
)  # recorded in the checkpoint: not ImageNet's, so a default would show


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny 16x16 pretraining checkpoint, recording its data's mean and std."""
    path = tiny_pretraining_checkpoint(tmp_path_factory.mktemp("ckpt"))
    ckpt = torch.load(path, weights_only=False)
    ckpt[DATA_KEY] = {"in_chans": 3, "img_size": [16, 16], "mean": MEAN, "std": STD}
    torch.save(ckpt, path)
    return path


def write_png(path, seed: int, size: int = 16):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return pixels


@pytest.fixture
def folder(tmp_path):
    """An ImageFolder root: classes a (3 images) and b (2), 16x16 RGB PNGs of random pixels."""
    for i, name in enumerate(["a/0.png", "a/1.png", "a/2.png", "b/0.png", "b/1.png"]):
        write_png(tmp_path / "root" / name, seed=i)
    return tmp_path / "root"


def read_parquet(path):
    table = pq.read_table(path)
    return (
        table["path"].to_pylist(),
        table["label"].to_pylist(),
        np.stack(table["vector"].to_numpy(zero_copy_only=False)),
    )


def direct_features(checkpoint, files) -> torch.Tensor:
    """(N, 1 + L, D): the MAE's own encoder on images normalised here by hand with the recorded statistics."""
    model, _ = load_mae(checkpoint)
    pixels = torch.stack(
        [torch.from_numpy(np.array(Image.open(f))).permute(2, 0, 1).float() / 255 for f in files]
    )
    x = (pixels - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    with torch.no_grad():
        return model.eval().forward_features(x)


def test_embed__vectors_are_the_encoders_pooled_features_with_class_labels(
    checkpoint, folder, tmp_path, capsys
):
    loose = tmp_path / "loose.png"
    write_png(loose, seed=9)
    out = tmp_path / "index.parquet"
    meta = invoke(
        "embed",
        [
            "--checkpoint",
            str(checkpoint),
            str(folder),
            str(loose),
            "--out",
            str(out),
            "--pool",
            "both",
            "--batch-size",
            "2",
            "--workers",
            "0",
        ],
    )
    paths, labels, vectors = read_parquet(out)
    files = sorted(folder.rglob("*.png")) + [loose]
    assert paths == [str(f) for f in files] and labels == ["a", "a", "a", "b", "b", None]
    tokens = direct_features(checkpoint, files)
    expected = torch.cat(
        [tokens[:, 0], tokens[:, 1:].mean(1)], dim=1
    )  # "both": cls, then the mean patch token
    assert vectors.dtype == np.float32 and vectors.shape == (6, 64)
    np.testing.assert_allclose(vectors, expected.numpy(), atol=1e-5)
    record = json.loads(pq.read_schema(out).metadata[b"mae_embeddings"])
    assert (
        record["checkpoint"] == str(checkpoint)
        and len(record["fingerprint"]) == 64
        and record["pool"] == "both"
    )
    assert (
        record["dim"] == 64
        and record["img_size"] == [16, 16]
        and record["mean"] == MEAN
        and record["count"] == 6
    )
    assert meta.skipped == [] and "wrote" in capsys.readouterr().out
    assert not (tmp_path / "index.parquet.parts").exists()  # the parts are gone once the index is whole


def test_embed__bad_file_skipped_listed_and_recorded(checkpoint, folder, tmp_path, capsys):
    (folder / "b" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    out = tmp_path / "index.npy"
    meta = invoke(
        "embed", ["--checkpoint", str(checkpoint), str(folder), "--out", str(out), "--workers", "0"]
    )
    err = capsys.readouterr().err
    assert "skipped" in err and "broken.jpg" in err
    assert [s["path"] for s in meta.skipped] == [str(folder / "b" / "broken.jpg")] and meta.count == 5
    recorded = json.loads(out.with_suffix(".json").read_text())
    assert recorded["skipped"][0]["path"].endswith("broken.jpg") and recorded["skipped"][0]["error"]
    rows = out.with_suffix(".csv").read_text().splitlines()
    assert rows[0] == "path,label" and len(rows) == 6 and not any("broken" in row for row in rows)
    cls = direct_features(checkpoint, sorted(folder.rglob("*.png")))[:, 0]
    np.testing.assert_allclose(np.load(out), cls.numpy(), atol=1e-5)  # the .npy layout holds the same vectors


def test_embed__gray_16_bit_images_and_arrays_with_given_statistics(tmp_path):
    torch.manual_seed(0)
    model = create_model("mae_vit_tiny_patch4", img_size=16, in_chans=1, **TINY_KWARGS).eval()
    save_hf_pretrained(model, tmp_path / "gray")  # a Hugging Face folder: no statistics recorded
    pixels = np.random.default_rng(0).integers(0, 65536, (16, 16), dtype=np.uint16)
    Image.fromarray(pixels).save(tmp_path / "scan.png")
    np.save(tmp_path / "scan.npy", pixels)
    args = [
        "--checkpoint",
        str(tmp_path / "gray"),
        str(tmp_path / "scan.png"),
        str(tmp_path / "scan.npy"),
        "--out",
        str(tmp_path / "gray.parquet"),
        "--workers",
        "0",
    ]
    with pytest.raises(ValueError, match="does not record its data's mean and std: pass --mean and --std"):
        invoke("embed", args)
    invoke("embed", [*args, "--mean", "0.5", "--std", "0.25", "--pool", "avg"])
    _, labels, vectors = read_parquet(tmp_path / "gray.parquet")
    x = (torch.from_numpy(pixels.astype(np.float32) / 65535)[None, None] - 0.5) / 0.25
    with torch.no_grad():
        expected = model.forward_features(x)[:, 1:].mean(1)
    assert labels == [None, None]
    np.testing.assert_allclose(vectors, expected.expand(2, -1).numpy(), atol=1e-5)


def test_embed__empty_folder_bad_output_and_bad_sizes_are_clear_errors(checkpoint, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no image here")
    with pytest.raises(FileNotFoundError, match=r"empty holds no image file .*give a folder of images"):
        invoke(
            "embed",
            ["--checkpoint", str(checkpoint), str(tmp_path / "empty"), "--out", str(tmp_path / "x.parquet")],
        )
    with pytest.raises(ValueError, match=r"must end in \.parquet .* or \.npy"):
        invoke("embed", ["--checkpoint", str(checkpoint), str(tmp_path), "--out", str(tmp_path / "x.csv")])
    with pytest.raises(SystemExit):
        invoke(
            "embed",
            [
                "--checkpoint",
                str(checkpoint),
                str(tmp_path),
                "--out",
                str(tmp_path / "x.npy"),
                "--img-size=0",
            ],
        )
    assert "argument --img-size: must be at least 1, got 0" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # nothing written


@pytest.mark.slow  # starts a process of its own
def test_embed__a_run_killed_mid_way_resumes_to_exactly_the_uninterrupted_rows(
    checkpoint, tmp_path, monkeypatch
):
    for i in range(12):
        write_png(tmp_path / "root" / f"c{i % 2}" / f"{i:02d}.png", seed=i)
    # 192x192 inputs (2,304 patches) make each image slow enough to stop the run between its parts
    args = [
        "--checkpoint",
        str(checkpoint),
        str(tmp_path / "root"),
        "--img-size",
        "192",
        "--part-size",
        "2",
        "--batch-size",
        "1",
        "--workers",
        "0",
        "--no-progress",
    ]
    out = tmp_path / "resumed.parquet"
    parts = tmp_path / "resumed.parquet.parts"
    with start_mae("embed", *args, "--out", str(out)) as proc:  # a forked command, to SIGKILL
        deadline = time.monotonic() + 120
        while len(list(parts.glob("part-*.npz"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = sorted(p.name for p in parts.glob("part-*.npz"))
    assert 2 <= len(done) < 6 and not out.exists(), (done, proc.stderr()[-2000:])

    loaded = []

    def counted(path, *args):
        loaded.append(path)
        return images.load_image(path, *args)

    monkeypatch.setattr(embed_run, "load_image", counted)
    invoke("embed", [*args, "--out", str(out)])
    assert len(loaded) == 12 - 2 * len(done)  # the finished parts were not embedded again
    invoke("embed", [*args, "--out", str(tmp_path / "whole.parquet")])
    resumed, whole = read_parquet(out), read_parquet(tmp_path / "whole.parquet")
    assert resumed[0] == whole[0] and len(set(resumed[0])) == 12 and resumed[1] == whole[1]
    np.testing.assert_allclose(resumed[2], whole[2], atol=1e-6)
    assert not parts.exists()


def test_search__finds_an_images_copy_first_through_the_command_line(checkpoint, folder, tmp_path):
    out = tmp_path / "index.parquet"
    invoke(
        "embed",
        ["--checkpoint", str(checkpoint), str(folder), "--out", str(out), "--workers", "0", "--no-progress"],
    )
    shutil.copy(folder / "b" / "0.png", tmp_path / "copy.png")
    result = run_mae(
        "search",
        "--index",
        str(out),
        str(tmp_path / "copy.png"),
        "-k",
        "3",
        "--chunk-rows",
        "2",
        "--out",
        str(tmp_path / "grid.png"),
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == str(tmp_path / "copy.png")
    rank, score, path, *_ = lines[1].split()
    assert (
        rank == "#1" and float(score) == pytest.approx(1.0, abs=1e-4) and path == str(folder / "b" / "0.png")
    )
    assert len([line for line in lines if line.startswith("  #")]) == 3 and (tmp_path / "grid.png").is_file()
    assert Image.open(tmp_path / "grid.png").width >= 4 * 128  # the query and 3 neighbours, enlarged

    # the scores and order are numpy's exact cosine similarities of the copy's vector
    paths, _, vectors = read_parquet(out)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cosine = unit @ unit[paths.index(str(folder / "b" / "0.png"))]
    printed = [(line.split()[2], float(line.split()[1])) for line in lines[1:4]]
    expected = [(paths[i], cosine[i]) for i in np.argsort(-cosine)[:3]]
    assert [p for p, _ in printed] == [p for p, _ in expected]
    np.testing.assert_allclose([s for _, s in printed], [s for _, s in expected], atol=1e-4)


def test_search__refuses_an_index_of_other_weights_and_accepts_the_same_weights_in_another_format(
    checkpoint, folder, tmp_path
):
    out = tmp_path / "index.npy"
    invoke(
        "embed",
        ["--checkpoint", str(checkpoint), str(folder), "--out", str(out), "--workers", "0", "--no-progress"],
    )
    query = [str(folder / "a" / "1.png"), "--index", str(out), "-k", "2", "--out", str(tmp_path / "g.png")]
    wide = create_model("mae_vit_tiny_patch4", img_size=16, **{**TINY_KWARGS, "embed_dim": 64})
    torch.save({"model": wide.state_dict()}, tmp_path / "wide.pth")
    with pytest.raises(ValueError, match=r"holds vectors of length 32 .* gives vectors of length 64"):
        invoke("search", [*query, "--checkpoint", str(tmp_path / "wide.pth")])
    other = create_model("mae_vit_tiny_patch4", img_size=16, **TINY_KWARGS)
    torch.save({"model": other.state_dict()}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"other weights .* not comparable"):
        invoke("search", [*query, "--checkpoint", str(tmp_path / "other.pth")])

    export_encoder(checkpoint, tmp_path / "encoder.safetensors")  # the same weights, another format
    matches = invoke("search", [*query, "--checkpoint", str(tmp_path / "encoder.safetensors")])
    assert (
        matches[0].neighbours[0].path == str(folder / "a" / "1.png") and not (tmp_path / "g.png.tmp").exists()
    )

    recorded = tmp_path / "recorded.ckpt"  # the checkpoint the index records, trained further since
    shutil.copy(checkpoint, recorded)
    invoke(
        "embed",
        ["--checkpoint", str(recorded), str(folder), "--out", str(out), "--workers", "0", "--no-progress"],
    )
    changed = torch.load(recorded, weights_only=False)
    changed["state_dict"]["model.cls_token"] += 1
    torch.save(changed, recorded)
    with pytest.raises(ValueError, match=r"the file was changed since"):
        invoke("search", query)
    recorded.unlink()
    with pytest.raises(
        FileNotFoundError, match=r"recorded.ckpt, which does not exist here: pass --checkpoint"
    ):
        invoke("search", query)


def test_cosine_top_k__chunked_equals_all_at_once():
    g = torch.Generator().manual_seed(0)
    rows, queries = torch.randn(50, 8, generator=g), torch.randn(3, 8, generator=g)
    rows[7] = 0  # a zero vector scores 0
    chunks = [(start, rows[start : start + 7]) for start in range(0, 50, 7)]
    scores, found = cosine_top_k(queries, reversed(chunks), k=5)  # any chunk order
    cosine = torch.nn.functional.normalize(queries, dim=1) @ torch.nn.functional.normalize(rows, dim=1).T
    expected_scores, expected_rows = cosine.topk(5, dim=1)
    assert torch.equal(found, expected_rows)
    torch.testing.assert_close(scores, expected_scores)
    assert cosine_top_k(queries, chunks[:1], k=20)[1].shape == (3, 7)  # fewer rows than k


def test_search_page__the_tab_callback_shows_neighbours_or_a_message(checkpoint, folder, tmp_path):
    out = tmp_path / "index.parquet"
    invoke(
        "embed",
        ["--checkpoint", str(checkpoint), str(folder), "--out", str(out), "--workers", "0", "--no-progress"],
    )
    session = SearchSession(out)
    shutil.copy(folder / "a" / "2.png", tmp_path / "upload.png")
    items, details = session.show(tmp_path / "upload.png", "upload.png", 3)
    assert (
        len(items) == 4
        and items[0][1] == "query: upload.png"
        and items[1][1].startswith("#1 1.000: 2.png, label a")
    )
    assert all(isinstance(picture, Image.Image) for picture, _ in items)
    assert "3 nearest of 5 images" in details and str(tmp_path) not in details
    (tmp_path / "broken.png").write_bytes(b"not a png")
    items, details = session.show(tmp_path / "broken.png", "broken.png", 3)
    assert items == [] and "broken.png" in details and str(tmp_path) not in details
    assert session.show(tmp_path / "upload.png", "upload.png", 0)[1].startswith("**Check the settings:**")
    assert session.show(None, None, 3) == ([], "**Upload an image or pick an example.**")
    assert len(EmbeddingIndex(out)) == 5


def test_embed_search_benchmark__tiny_run(checkpoint):
    spec = importlib.util.spec_from_file_location("embed_search", REPO / "benchmarks" / "embed_search.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    result = benchmark.main(
        [
            "--checkpoint",
            str(checkpoint),
            "--images",
            "12",
            "--workers",
            "0",
            "--rows",
            "3000",
            "--dim",
            "16",
            "--chunk-rows",
            "1000",
        ]
    )
    assert result["embed"]["images"] == 12 and result["embed"]["img_s"] > 0 and result["embed"]["dim"] == 32
    assert result["search"]["rows"] == 3000 and result["search"]["seconds"] > 0


def search_error(index, query, tmp_path) -> str:
    result = run_mae(
        "search",
        "--index",
        str(index),
        str(query),
        "--out",
        str(tmp_path / "grid.png"),
        "--device",
        "cpu",
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_search__an_index_cut_short_or_lying_is_named_with_the_fix(checkpoint, folder, tmp_path):
    good = tmp_path / "good"
    invoke(
        "embed",
        ["--checkpoint", str(checkpoint), str(folder), "--out", str(good / "i.npy"), "--workers", "0"],
    )
    invoke(
        "embed",
        ["--checkpoint", str(checkpoint), str(folder), "--out", str(good / "i.parquet"), "--workers", "0"],
    )
    query = folder / "a" / "0.png"

    def copy(name: str):
        bad = tmp_path / name
        shutil.copytree(good, bad)
        return bad

    half = copy("half")  # the vectors cut to half their bytes
    data = (half / "i.npy").read_bytes()
    (half / "i.npy").write_bytes(data[: len(data) // 2])
    assert f"{half / 'i.npy'} is damaged or cut short" in search_error(half / "i.npy", query, tmp_path)

    lying = copy("lying")  # a header that claims 1,000,000 rows
    np.save(lying / "i.npy", np.zeros((4, 32), np.float32))
    text = (lying / "i.npy").read_bytes().replace(b"(4, 32)", b"(1000000, 32)")
    (lying / "i.npy").write_bytes(text)
    assert f"{lying / 'i.npy'} is damaged or cut short" in search_error(lying / "i.npy", query, tmp_path)

    short = copy("short")  # the CSV of paths shorter than the vectors
    lines = (short / "i.csv").read_text().splitlines()
    (short / "i.csv").write_text("\n".join(lines[:-2]) + "\n")
    error = search_error(short / "i.npy", query, tmp_path)
    assert f"{short / 'i.csv'} lists 3 image(s) but i.npy holds 5 vectors" in error and "mae embed" in error

    damaged = copy("damaged")  # a Parquet data page overwritten, the footer intact
    data = bytearray((damaged / "i.parquet").read_bytes())
    data[4:200] = bytes(range(196))
    (damaged / "i.parquet").write_bytes(bytes(data))
    error = search_error(damaged / "i.parquet", query, tmp_path)
    assert str(damaged / "i.parquet") in error and "mae embed" in error


def test_embed__a_file_name_that_is_not_utf8_is_kept_with_escapes(checkpoint, tmp_path):
    import os
    from pathlib import Path

    root = os.fsencode(tmp_path / "root")
    for name in (b"cl\xe4ss/caf\xe9.png", b"cl\xe4ss/plain.png"):
        write_png(Path(os.fsdecode(os.path.join(root, name))), seed=len(name))
    for out in (tmp_path / "i.npy", tmp_path / "i.parquet"):
        result = run_mae(
            "embed",
            "--checkpoint",
            str(checkpoint),
            os.fsdecode(root),
            "--out",
            str(out),
            "--workers",
            "0",
            "--no-progress",
        )
        assert "2 vectors" in result.stdout
        rows = EmbeddingIndex(out).rows_at([0, 1])
        assert sorted(rows.values()) == [
            (str(tmp_path / "root" / "cl\\xe4ss" / "caf\\xe9.png"), "cl\\xe4ss"),
            (str(tmp_path / "root" / "cl\\xe4ss" / "plain.png"), "cl\\xe4ss"),
        ]


@pytest.mark.slow  # an index embedded and mapped
def test_embed__map_of_the_index_it_wrote_checked_before_embedding(checkpoint, folder, tmp_path):
    from mae.apps.embeddings.embedding_map import map_record

    out, figure = tmp_path / "index.npy", tmp_path / "map.png"
    args = ["--checkpoint", str(checkpoint), str(folder), "--out", str(out), "--workers", "0"]
    figure.write_bytes(b"someone else's picture")
    refused = run_mae("embed", *args, "--map", str(figure), check=False)
    assert refused.returncode == 2 and f"error: --map {figure} holds a file that no run of mae embed" in (
        refused.stderr
    )
    assert not out.exists() and figure.read_bytes() == b"someone else's picture"  # refused before embedding
    figure.unlink()
    result = run_mae("embed", *args, "--map", str(figure), timeout=120)
    assert f"wrote {figure}: t-SNE of all 5 cls-pooled vectors" in result.stdout
    record = map_record(figure)
    assert record["panels"][0]["index"] == str(out) and record["colours"] == {"a": "#1f77b4", "b": "#ff7f0e"}


@pytest.mark.slow  # an index embedded and mapped
def test_embed__map_of_copies_of_one_image_draws_every_point_at_one_place(checkpoint, tmp_path):
    """N copies of one image embed to one vector: the index is written and so is its map, every point at one
    place with a note, where t-SNE's PCA start failed with a traceback after the index was written."""
    from mae.apps.embeddings.embedding_map import map_record

    write_png(tmp_path / "copies" / "0.png", seed=0)
    for i in range(1, 5):
        shutil.copy(tmp_path / "copies" / "0.png", tmp_path / "copies" / f"{i}.png")
    out, figure = tmp_path / "index.npy", tmp_path / "map.png"
    args = ["--checkpoint", str(checkpoint), str(tmp_path / "copies"), "--out", str(out), "--workers", "0"]
    result = run_mae("embed", *args, "--map", str(figure), "--batch-size", "3", timeout=120, check=False)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"wrote {figure}: all 5 cls-pooled vectors" in result.stdout
    assert (
        "point the same way (copies of one image?): no t-SNE, every point drawn at one place" in result.stdout
    )
    assert len(EmbeddingIndex(out)) == 5 and map_record(figure)["panels"][0]["same_direction"]


def test_embed__a_cnn_checkpoint_embeds_its_pooled_last_map_avg_by_default_and_refuses_cls(tmp_path, capsys):
    """A CNN's vectors: timm's own pooling of its last map (``forward_head(pre_logits=True)``) of a timm
    model loaded here with the checkpoint's encoder tensors; their length its channels (512), its input
    size the pretraining's (32 px), "avg" recorded; the cls token asked for is refused, naming the pool."""
    import timm

    from mae.apps.embeddings.image_search import index_embedder
    from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD
    from tests.helpers import untrained_cnn_checkpoint

    checkpoint = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt", "resnet10t")
    files = [tmp_path / "root" / "a" / f"{i}.png" for i in range(3)]
    pixels = [write_png(f, seed=i, size=32) for i, f in enumerate(files)]
    out = tmp_path / "index.parquet"
    invoke(
        "embed",
        ["--checkpoint", str(checkpoint), str(tmp_path / "root"), "--out", str(out), "--workers", "0"],
    )
    paths, _, vectors = read_parquet(out)
    assert paths == [str(f) for f in files] and vectors.shape == (3, 512)
    reference = timm.create_model("resnet10t", num_classes=0).eval()
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    reference.load_state_dict(
        {k[len("model.encoder.") :]: v for k, v in saved.items() if "model.encoder." in k}
    )
    x = torch.stack([torch.from_numpy(p).permute(2, 0, 1).float() / 255 for p in pixels])
    x = (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = reference.forward_head(reference.forward_features(x), pre_logits=True)
    np.testing.assert_allclose(vectors, expected.numpy(), atol=1e-5)
    record = json.loads(pq.read_schema(out).metadata[b"mae_embeddings"])
    assert record["pool"] == "avg" and record["dim"] == 512 and record["img_size"] == [32, 32]
    # a search's encoder: the index's width checked against the CNN's, its query embedded alike
    searcher = index_embedder(EmbeddingIndex(out), checkpoint)
    assert searcher.pool == "avg" and searcher.dim == 512 and searcher.img_size == (32, 32)
    query = searcher(searcher.load(files[1])[None])
    np.testing.assert_allclose(query.numpy(), vectors[1:2], atol=1e-5)
    with pytest.raises(ValueError, match="pool 'cls' reads a cls token, and the CNN resnet10t has none"):
        invoke(
            "embed",
            [
                "--checkpoint",
                str(checkpoint),
                str(files[0]),
                "--out",
                str(tmp_path / "x.parquet"),
                "--pool",
                "cls",
                "--workers",
                "0",
            ],
        )
