"""``mae search``'s job (``mae.apps.embeddings.search_job``): each query's neighbours printed best first
and drawn, the checks that come before the index is read, and what the figure's caption says."""

import pytest

from mae.apps.embeddings.embed_job import EmbedSettings, embed_files
from mae.apps.embeddings.embedding_index import IndexMeta
from mae.apps.embeddings.search_job import SearchSettings, caption, search_files
from mae.errors import UsageError
from mae.io.outputs import png_is_from
from tests.helpers import tiny_pretraining_checkpoint, write_image_folder


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """(the image folder, its index) by the tiny checkpoint."""
    tmp = tmp_path_factory.mktemp("search")
    root = write_image_folder(tmp / "root", ["a", "b"], per_class=2, size=(16, 16))
    ckpt = tiny_pretraining_checkpoint(tmp)
    embed_files(EmbedSettings([str(root)], ckpt, tmp / "index.npy", workers=0, no_progress=True))
    return root, tmp / "index.npy"


def test_search_files__an_indexed_image_is_its_own_nearest_neighbour(indexed, tmp_path, capsys):
    root, index = indexed
    query = sorted((root / "a").iterdir())[0]
    capsys.readouterr()
    matches = search_files(SearchSettings([str(query)], index, tmp_path / "n.png", k=2))
    first = matches[0].neighbours[0]
    assert (
        first.path.endswith(query.name) and first.label == "a" and first.score == pytest.approx(1.0, abs=1e-5)
    )
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == str(query.resolve())
        and out[1].startswith("  #1 1.0000")
        and out[-1] == f"wrote {tmp_path / 'n.png'}"
    )
    assert png_is_from("mae.search")(tmp_path / "n.png")


def test_search_files__k_below_1_is_refused_before_the_index_is_read(tmp_path):
    with pytest.raises(UsageError, match="-k and --chunk-rows must be at least 1, got 0 and 5"):
        search_files(SearchSettings(["q.png"], tmp_path / "none.npy", tmp_path / "n.png", k=0, chunk_rows=5))


def test_caption__names_the_pooling_the_encoder_the_rows_and_the_input_size():
    meta = IndexMeta("/runs/last.ckpt", "f", "both", 128, [16, 24], 3, [0.5] * 3, [0.2] * 3)
    assert caption(meta, 12345) == (
        "Cosine similarity of both-pooled embeddings (128 values) by last.ckpt, exact, over 12,345 images; "
        "images shown as the model saw them (24x16)."
    )
