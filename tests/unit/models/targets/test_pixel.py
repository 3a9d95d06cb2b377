import torch

from mae.models.targets.pixel import PixelTarget


def test_pixel_target__each_patch_row_major_its_pixels_ordered_p_p_c():
    imgs = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).reshape(2, 3, 8, 12)
    target = PixelTarget(4, 3)(imgs)
    assert target.shape == (2, 6, 48) and PixelTarget(4, 3).dim == 48
    for row in range(2):
        for col in range(3):
            patch = imgs[:, :, 4 * row : 4 * row + 4, 4 * col : 4 * col + 4]  # (N, C, p, p)
            assert torch.equal(target[:, row * 3 + col], patch.permute(0, 2, 3, 1).reshape(2, 48))
