"""The attentive probe: one cross-attention layer with a learned query over cached tokens, then a linear
layer, chosen on held-out training images as the linear probe is."""

import numpy as np
import pytest
import timm
import torch

from mae.cli.main import invoke
from mae.convert.pooling import block_tokens
from mae.eval.attentive_probe import (
    AttentiveHead,
    AttentiveSettings,
    TokenEncoder,
    default_num_heads,
    train_attentive_probe,
)
from mae.eval.features import FeatureStore
from mae.eval.probe import train_probe
from mae.models import MaskedAutoencoderViT
from tests.helpers import (
    TINY,
    TWO_BLOCK_KWARGS,
    folder_flags,
    tiny_pretraining_checkpoint,
    untrained_cnn_checkpoint,
    write_image_folder,
)

CLASSES, TOKENS, WIDTH = 4, 8, 16


def _marked_token_problem(images: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (N, T, W), labels (N,)): every token carries the prototype of a random class (plus noise);
    one token at a random position is marked (its feature 0 is 3, others' 0) and its class is the label.
    The cls position (0) tells nothing, and the mean of the tokens mixes T random classes: only a pooling
    that finds the marked token reads the label."""
    rng = np.random.default_rng(seed)
    prototypes = np.random.default_rng(99).normal(size=(CLASSES, WIDTH - 1))
    classes = rng.integers(0, CLASSES, size=(images, TOKENS))
    marked = rng.integers(0, TOKENS, size=images)
    tokens = np.zeros((images, TOKENS, WIDTH), np.float32)
    tokens[..., 1:] = prototypes[classes] + 0.3 * rng.normal(size=(images, TOKENS, WIDTH - 1))
    tokens[np.arange(images), marked, 0] = 3.0
    return tokens, classes[np.arange(images), marked]


def _stores(pool=None) -> tuple[FeatureStore, FeatureStore]:
    """The marked-token problem's training (600 images) and validation (300) stores: the flat token rows
    (N, T * W), or the tokens pooled by ``pool`` ((N, T, W) -> (N, W))."""
    (train, train_labels), (val, val_labels) = _marked_token_problem(600, 0), _marked_token_problem(300, 1)
    shape = (lambda t: t.reshape(len(t), -1)) if pool is None else pool
    return FeatureStore(shape(train), train_labels), FeatureStore(shape(val), val_labels)


def test_attentive_probe__finds_the_one_token_that_carries_the_label_where_pooled_features_fail():
    train, val = _stores()
    settings = AttentiveSettings(lrs=(3e-3,), max_epochs=12)
    result = train_attentive_probe(train, val, (TOKENS, WIDTH), CLASSES, settings, num_heads=2)
    assert result.val_acc1 >= 90, result
    assert result.tokens == (TOKENS, WIDTH) and len(result.grid) == 1 and 1 <= result.epochs <= 12
    assert str(result).startswith(f"attentive probe: top-1 {result.val_acc1:.2f}%")
    for pool in (lambda t: t[:, 0], lambda t: t.mean(1)):  # cls pooling, average pooling: the linear probe
        linear = train_probe(*_stores(pool), CLASSES, max_epochs=30)
        assert linear.val_acc1 < 60, linear  # chance is 25 %


def test_attentive_probe__standardises_tokens_whose_differences_are_small_beside_a_shared_offset():
    """As an MAE's normed tokens are: each position's features carry a large offset shared by every image,
    the differences between images a few percent of it."""
    offset = 50 * np.random.default_rng(5).normal(size=(TOKENS, WIDTH)).astype(np.float32)
    shift = lambda tokens: (offset + tokens).reshape(len(tokens), -1)  # noqa: E731
    train, val = _stores(shift)
    settings = AttentiveSettings(lrs=(3e-3,), max_epochs=12)
    assert train_attentive_probe(train, val, (TOKENS, WIDTH), CLASSES, settings, num_heads=2).val_acc1 >= 90


def test_attentive_probe__seeded_and_chosen_without_looking_at_the_validation_split():
    train, val = _stores()
    settings = AttentiveSettings(lrs=(1e-3,), max_epochs=3)
    first = train_attentive_probe(train, val, (TOKENS, WIDTH), CLASSES, settings, num_heads=2)
    assert train_attentive_probe(train, val, (TOKENS, WIDTH), CLASSES, settings, num_heads=2) == first
    shuffled = FeatureStore(val.feats, np.random.default_rng(0).permutation(val.labels))
    blind = train_attentive_probe(train, shuffled, (TOKENS, WIDTH), CLASSES, settings, num_heads=2)
    assert (blind.epochs, blind.holdout_acc1, blind.grid) == (first.epochs, first.holdout_acc1, first.grid)


def test_attentive_head__timms_latent_attention_pool_with_vjepas_norms():
    head = AttentiveHead(WIDTH, CLASSES, num_heads=2)
    assert isinstance(head.pool, timm.layers.AttentionPoolLatent) and head.pool.latent.shape == (1, 1, WIDTH)
    assert isinstance(head.norm, torch.nn.LayerNorm) and isinstance(head.pool.norm, torch.nn.LayerNorm)
    assert head.pool.num_heads == 2 and head.pool.mlp.fc1.out_features == 4 * WIDTH
    assert head(torch.randn(5, TOKENS, WIDTH)).shape == (5, CLASSES)


def test_token_encoder__a_vits_blocks_concatenated_along_features_a_cnns_one_stage_positions():
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**TINY).eval()  # depth 2, width 64, 4 heads, 8 x 8 patches
    imgs = torch.randn(2, 3, 32, 32)
    last, both = TokenEncoder(model), TokenEncoder(model, [0, -1])
    with torch.no_grad():
        assert torch.equal(last(imgs), block_tokens(model, imgs, [1])[0].flatten(1))
        assert both(imgs).shape == (2, 65 * 128) and both.token_shape == (65, 128)
        assert torch.equal(both.tokens(imgs)[..., 64:], last.tokens(imgs))  # block order, last block second
    assert default_num_heads(model, 64) == 4 and default_num_heads(model, 128) == 4  # the encoder's own
    with pytest.raises(ValueError, match="--feature-blocks 2 is not a block of this encoder of depth 2"):
        TokenEncoder(model, [2])

    cnn = timm.create_model("resnet10t", num_classes=0).eval()
    encode = TokenEncoder(cnn)
    with torch.no_grad():
        assert encode(imgs).shape == (2, 512) and encode.token_shape == (1, 512)  # 32 px: one 1 x 1 position
        assert TokenEncoder(cnn, [2]).tokens(imgs).shape == (2, 16, 128)  # stride 8: 4 x 4 positions
    assert default_num_heads(cnn, 512) == 8  # its width / 64
    with pytest.raises(ValueError, match=r"--feature-blocks \[2, -1\]: the attentive probe reads one stage"):
        TokenEncoder(cnn, [2, -1])


def test_attentive_probe__settings_and_heads_refused_by_name():
    train, val = _stores()
    with pytest.raises(ValueError, match="probe.lrs must be positive"):
        AttentiveSettings(lrs=(1e-3, 0.0))
    with pytest.raises(ValueError, match="probe.max_epochs and probe.patience must be >= 1"):
        AttentiveSettings(max_epochs=0)
    with pytest.raises(ValueError, match="--attentive-heads 3 must divide the tokens' width 16"):
        train_attentive_probe(train, val, (TOKENS, WIDTH), CLASSES, AttentiveSettings(), num_heads=3)


@pytest.fixture(scope="module")
def two_blocks(tmp_path_factory):
    """A two-block tiny MAE's pretraining checkpoint (width 32, 2 heads, 16 px: 17 tokens) and an image
    folder of 3 classes."""
    tmp = tmp_path_factory.mktemp("attentive")
    tiny_pretraining_checkpoint(tmp, model_kwargs=TWO_BLOCK_KWARGS)
    write_image_folder(tmp / "data" / "train", ["a", "b", "c"], per_class=8, size=(20, 20))
    write_image_folder(tmp / "data" / "val", ["a", "b", "c"], per_class=3, size=(20, 20), seed=1)
    return tmp


def test_probe_command__attentive_head_on_two_blocks_of_a_checkpoint_cached_on_disk(
    two_blocks, tmp_path, capsys
):
    flags = ["--checkpoint", str(two_blocks / "last.ckpt"), *folder_flags(two_blocks / "data", batch_size=8)]
    flags += ["--head", "attentive", "--feature-blocks", "0", "-1", "--max-epochs", "2"]
    cached = invoke("probe", [*flags, "--cache", str(tmp_path / "tokens")])
    out = capsys.readouterr().out
    assert f"attentive probe: top-1 {cached.val_acc1:.2f}%" in out and "2 attention heads" in out
    assert "on 9 validation images, 17 tokens x 64 features of blocks 1+2 of 2 (concatenated)" in out
    assert np.load(tmp_path / "tokens.train.feats.npy", mmap_mode="r").shape == (24, 17 * 64)
    assert invoke("probe", flags) == cached  # in memory: the same tokens, the same heads


def test_probe_command__attentive_head_on_a_cnns_last_map(tmp_path, capsys):
    checkpoint = untrained_cnn_checkpoint(tmp_path / "spark.ckpt")
    write_image_folder(tmp_path / "data" / "train", ["a", "b"], per_class=6, size=(36, 36))
    write_image_folder(tmp_path / "data" / "val", ["a", "b"], per_class=2, size=(36, 36), seed=1)
    data = folder_flags(tmp_path / "data", img_size=32, batch_size=6)
    flags = ["--checkpoint", str(checkpoint), *data, "--head", "attentive", "--max-epochs", "1"]
    result = invoke("probe", flags)
    assert result.tokens == (1, 512) and result.num_heads == 8
    assert "1 tokens x 512 features of stage 5 of 5" in capsys.readouterr().out
    with pytest.raises(ValueError, match="the attentive probe reads one stage of a CNN"):
        invoke("probe", [*flags, "--feature-blocks", "-2", "-1"])


def test_probe_command__a_flag_of_the_other_head_is_refused(two_blocks):
    flags = ["--checkpoint", str(two_blocks / "last.ckpt"), *folder_flags(two_blocks / "data")]
    with pytest.raises(ValueError, match="--pool cls pools the linear head's features; --head attentive"):
        invoke("probe", [*flags, "--head", "attentive", "--pool", "cls"])
    with pytest.raises(ValueError, match="--attentive-heads 2 sets the attentive head; add --head attentive"):
        invoke("probe", [*flags, "--attentive-heads", "2"])


def test_probe_command__attention_heads_that_do_not_divide_the_width_fail_before_any_extraction(
    two_blocks, tmp_path
):
    flags = ["--checkpoint", str(two_blocks / "last.ckpt"), *folder_flags(two_blocks / "data")]
    flags += ["--head", "attentive", "--feature-blocks", "0", "1", "--cache", str(tmp_path / "tokens")]
    with pytest.raises(ValueError, match="--attentive-heads 3 must divide the tokens' width 64"):
        invoke("probe", [*flags, "--attentive-heads", "3"])
    assert not list(tmp_path.iterdir())
