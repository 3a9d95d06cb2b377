"""The pixel-kNN baseline (``mae.apps.anomaly.baseline``): each patch's difference to the nearest normal
image, patch by patch."""

import torch

from mae.apps.anomaly.baseline import nearest_normal_errors


def test_pixel_knn_baseline__per_patch_difference_to_the_nearest_normal_image():
    rng = torch.Generator().manual_seed(0)
    normal = torch.randn(5, 3, 8, 8, generator=rng)
    test = normal[[3, 1]] + 0.01 * torch.randn(2, 3, 8, 8, generator=rng)
    test[1, :, 4:, :4] += 2.0  # bottom-left patch of image 1 differs
    errors = nearest_normal_errors(test, normal, patch_size=4, chunk=1)
    for n, nearest in enumerate((3, 1)):  # independently, patch by patch
        for row in range(2):
            for col in range(2):
                patch = (slice(None), slice(4 * row, 4 * row + 4), slice(4 * col, 4 * col + 4))
                expected = ((test[n][patch] - normal[nearest][patch]) ** 2).mean()
                torch.testing.assert_close(errors[n, 2 * row + col], expected)
    assert int(errors[1].argmax()) == 2
