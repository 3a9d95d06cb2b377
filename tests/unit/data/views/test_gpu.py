"""Decoding pretraining batches in the batch hook (``mae.data.views.gpu``), checked on the CPU: the same
crops as the loader workers make, and the rule that picks where decoding runs."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from mae.data.decoding.formats import EncodedImage
from mae.data.views.crop import PretrainCrop
from mae.data.views.gpu import collate_encoded, decode_pretrain_batch, resolve_decode_on
from tests.helpers import jpeg_bytes


def test_gpu_decode__batch_path_gives_the_worker_path_crops():
    samples = [(EncodedImage(jpeg_bytes(i, (48 + 8 * i, 36)), f"img{i}"), i) for i in range(5)]
    png = io.BytesIO()
    Image.fromarray(np.full((20, 30, 3), 90, np.uint8)).save(png, "PNG")
    samples.append((EncodedImage(png.getvalue(), "img.png"), 5))  # not a JPEG: decoded by PIL, same crop
    torch.manual_seed(0)
    crop = PretrainCrop(16)
    workers = torch.stack([crop(image) for image, _ in samples])
    batch = collate_encoded(samples)
    torch.manual_seed(0)
    batched = decode_pretrain_batch(batch.images, batch.names, (16, 16), "cpu")
    assert batched.shape == (6, 3, 16, 16) and batched.dtype == torch.uint8
    assert torch.equal(batched, workers)
    assert batch.labels.tolist() == list(range(6))


def test_decode_on__auto_decodes_pretraining_batches_on_cuda_only_and_gpu_is_refused_elsewhere():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_decode_on("auto", cpu, "pretrain") is False
    assert resolve_decode_on("auto", cuda, "pretrain") is True
    assert resolve_decode_on("auto", cuda, "finetune") is False
    assert resolve_decode_on("cpu", cuda, "pretrain") is False
    with pytest.raises(ValueError, match="decode_on=gpu needs training on a CUDA GPU.*cpu"):
        resolve_decode_on("gpu", cpu, "pretrain")
    with pytest.raises(ValueError, match="data.augmentation is 'finetune'"):
        resolve_decode_on("gpu", cuda, "finetune")
