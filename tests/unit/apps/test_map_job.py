"""``mae map``'s job (``mae.apps.embeddings.map_job``): the output checked before any work, the map of an
index written and described in one line."""

import numpy as np
import pytest

from mae.apps.embeddings.embedding_index import IndexMeta, Rows, write_index
from mae.apps.embeddings.embedding_map import is_map
from mae.apps.embeddings.map_job import MapSettings, map_index
from mae.errors import UsageError
from mae.io.outputs import OutputError

pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")


def _index(path):
    meta = IndexMeta("model.ckpt", "0" * 64, "cls", 4, [16, 16], 3, [0.5] * 3, [0.2] * 3, "x", count=6)
    vectors = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    rows = Rows([f"{i}.png" for i in range(6)], ["a", "a", "a", "b", "b", "b"], vectors)
    return write_index(path, meta, [rows])


def test_map_index__draws_the_map_and_says_what_it_shows(tmp_path, capsys):
    index, out = _index(tmp_path / "index.npy"), tmp_path / "map.png"
    map_index(index, out, MapSettings(seed=1, perplexity=2.0))
    assert is_map(out)
    line = capsys.readouterr().out
    assert line.startswith(f"wrote {out}: t-SNE of all 6 cls-pooled vectors (4 values), perplexity 2, seed 1")


def test_map_index__too_few_points_and_another_file_at_out_are_refused(tmp_path):
    index, out = _index(tmp_path / "index.npy"), tmp_path / "map.png"
    with pytest.raises(UsageError, match="--max-points must be at least 3, got 2"):
        map_index(index, out, MapSettings(max_points=2))
    out.write_bytes(b"someone else's picture")
    with pytest.raises(OutputError):
        map_index(index, out)
    assert out.read_bytes() == b"someone else's picture"
