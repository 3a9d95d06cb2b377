"""Normalisation in one place (``mae.data.views.normalize``): the statistics a run normalises by, their
checks, the batch normalised on the device, and the pretraining module refusing a batch no data module
normalised."""

import pytest
import torch

from mae.data.views.normalize import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    check_statistics,
    normalization,
    normalize_batch,
)
from tests.helpers import pretrain_module


def test_normalisation__pretraining_refuses_a_batch_no_data_module_normalised():
    module = pretrain_module()
    batch = (torch.zeros(2, 3, 16, 16, dtype=torch.uint8), torch.zeros(2))
    with pytest.raises(
        TypeError, match="got a uint8 batch: a data module derived from mae.data.ImageDataModule"
    ):
        module.training_step(batch, 0)


def test_normalization__imagenet_for_rgb_given_statistics_for_other_channel_counts():
    assert normalization(3, None, None) == (tuple(IMAGENET_MEAN), tuple(IMAGENET_STD))
    assert normalization(2, [0.5, 1], [0.25, 2]) == ((0.5, 1.0), (0.25, 2.0))
    with pytest.raises(ValueError, match="data.in_chans must be >= 1, got 0"):
        normalization(0, None, None)
    with pytest.raises(ValueError, match="needed for 4-channel data .*mae stats ROOT --in-chans 4"):
        normalization(4, None, None)
    with pytest.raises(ValueError, match="need 2 values \\(data.in_chans\\), got 2 and 1"):
        normalization(2, [0.5, 0.5], [1.0])
    with pytest.raises(
        ValueError, match="positive, finite standard deviations; got mean \\[0.5\\], std \\[0.0\\]"
    ):
        normalization(1, [0.5], [0.0])


def test_check_statistics__names_the_keys_for_nan_or_non_positive_values():
    check_statistics([0.0, -3.0], [1e-6, 2.0])
    for mean, std in (([float("nan")], [1.0]), ([0.0], [-1.0]), ([0.0], [float("inf")])):
        with pytest.raises(ValueError, match="^knn.mean / knn.std need finite means"):
            check_statistics(mean, std, names="knn.mean / knn.std")


def test_normalize_batch__uint8_to_normalised_floats_per_channel_and_floats_unchanged():
    imgs = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1).expand(2, 3, 2, 2).contiguous()
    out = normalize_batch(imgs, mean=(0.0, 0.2, 0.5), std=(1.0, 0.1, 0.5))
    assert out.dtype == torch.float32 and out.shape == (2, 3, 2, 2)
    torch.testing.assert_close(out[0, :, 0, 0], torch.tensor([0.0, 0.0, 1.0]))
    floats = torch.rand(1, 3, 2, 2)
    assert normalize_batch(floats) is floats
