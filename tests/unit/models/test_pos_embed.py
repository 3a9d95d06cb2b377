import numpy as np
import torch

from mae.models.pos_embed import sincos_2d


def _official_formula(embed_dim: int, grid: int) -> np.ndarray:
    """The official MAE construction, written out with numpy (meshgrid in x-first order)."""
    gw, gh = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64))
    omega = 1.0 / 10000 ** (np.arange(embed_dim // 4, dtype=np.float64) / (embed_dim / 4))

    def one_d(pos):
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    emb = np.concatenate([one_d(gw), one_d(gh)], axis=1)
    return np.concatenate([np.zeros([1, embed_dim]), emb], axis=0)


def test_sincos_2d__matches_official_channel_order():
    ours = sincos_2d(64, (8, 8)).numpy()
    np.testing.assert_allclose(ours, _official_formula(64, 8), atol=1e-6)


def test_sincos_2d__matches_hugging_face_initialisation():
    from transformers import ViTMAEConfig
    from transformers.models.vit_mae.modeling_vit_mae import ViTMAEEmbeddings

    emb = ViTMAEEmbeddings(ViTMAEConfig(hidden_size=64, image_size=32, patch_size=4))
    emb.initialize_weights()
    torch.testing.assert_close(sincos_2d(64, (8, 8)), emb.position_embeddings[0].detach(), rtol=0, atol=1e-6)


def test_sincos_2d__cls_row_zero_and_non_square_grid_row_major():
    emb = sincos_2d(16, (2, 3))
    assert emb.shape == (1 + 6, 16)
    assert torch.all(emb[0] == 0)
    patches = emb[1:].reshape(2, 3, 16)
    # first half encodes the column: equal down a column, second half encodes the row.
    torch.testing.assert_close(patches[0, :, :8], patches[1, :, :8])
    torch.testing.assert_close(patches[:, 0, 8:], patches[:, 2, 8:])
    assert not torch.allclose(patches[0, 0, :8], patches[0, 1, :8])
