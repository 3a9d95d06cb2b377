"""Progressive resolution (``model.resolution_schedule``): phases of input size in one pretraining run,
position embeddings recomputed per grid, resumes that continue in the right phase, and checkpoints that
describe the final-size model."""

import re

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from mae.convert.backbone import load_backbone
from mae.errors import ConfigError
from mae.models import MaskedAutoencoderViT
from mae.training.resolution import ResolutionSchedule
from tests.helpers import TINY, RandomImages, make_trainer, pretrain_module

SCHEDULE = [[0, 8], [0.5, 16]]  # 8 px (a 2x2 grid) for the first half of the epochs, then 16 px
STEPS_PER_EPOCH = 10  # RandomImages: 40 images, batch 4


def test_check_epochs__every_phase_needs_an_epoch_and_the_error_names_the_smallest_run():
    schedule = ResolutionSchedule.parse([[0, 8], [0.5, 16], [0.6, 32]], 32, 4)
    assert [schedule.epochs_of(i, 10) for i in range(3)] == [5, 1, 4]
    schedule.check_epochs(5)  # epochs 0-1, 2, 3-4
    for max_epochs, phase in [(1, r"\[0\] \[0, 8\]"), (2, r"\[1\] \[0.5, 16\]"), (4, r"\[1\] \[0.5, 16\]")]:
        with pytest.raises(ConfigError, match=rf"{phase}: this phase gets 0 epochs .* at least 5 ") as raised:
            schedule.check_epochs(max_epochs)
        assert f"trainer.max_epochs={max_epochs}" in str(raised.value)


@pytest.mark.parametrize("size", [16, 24, 64])
def test_set_img_size__position_embeddings_equal_a_fresh_model_built_at_that_size(size):
    model = MaskedAutoencoderViT(**TINY)  # built at 32
    weights = {k: v.clone() for k, v in model.state_dict().items() if "pos_embed" not in k}
    model.set_img_size(size)
    fresh = MaskedAutoencoderViT(**{**TINY, "img_size": size})
    assert torch.equal(model.pos_embed, fresh.pos_embed) and torch.equal(
        model.decoder_pos_embed, fresh.decoder_pos_embed
    )
    assert model.grid_size == fresh.grid_size and model.num_patches == fresh.num_patches
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())  # learned weights untouched
    loss, pred, mask = model(torch.randn(2, 3, size, size), 0.75)
    assert pred.shape == (2, (size // 4) ** 2, 48) and mask.sum(1).tolist() == [0.75 * (size // 4) ** 2] * 2
    assert model.config["img_size"] == (32, 32)  # the record still names the built size


def test_schedule__sizes_per_epoch_and_each_bad_phase_named():
    schedule = ResolutionSchedule.parse([[0, 16], [0.8, 32]], 32, 4)
    assert [schedule.size_at(e, 30)[0] for e in range(30)] == [16] * 24 + [32] * 6
    # 0.8 x 7 = 5.6: from epoch 5 (0-based)
    assert [schedule.size_at(e, 7)[0] for e in range(7)] == [16] * 5 + [32] * 2
    assert [schedule.size_at(e, 2)[0] for e in range(2)] == [16, 32]  # the final phase is never left out
    for value, message in [
        ([[0, 16], [0.8, 24]], r"\[1\] \[0.8, 24\]: the last phase's size 24x24 must be data.img_size 32x32"),
        (
            [[0.1, 16], [0.8, 32]],
            r"\[0\] \[0.1, 16\]: the first phase starts the run, so its start must be 0",
        ),
        ([[0, 16], [0, 32]], r"\[1\] \[0, 32\]: start 0 must be above the previous phase's start 0"),
        (
            [[0, 18], [0.5, 32]],
            r"\[0\] \[0, 18\]: the phase's img_size 18x18 is not divisible by patch_size 4",
        ),
        ([[0, 16.0], [0.5, 32]], r"\[0\] \[0, 16.0\]: size 16.0 must be a number of pixels"),
        ([[0, 64], [0.5, 32]], r"\[0\] \[0, 64\]: size 64x64 is above data.img_size 32x32.*at most 32"),
        ([[0, [16, 40]], [0.5, 32]], r"size 16x40 is above data.img_size 32x32"),
        ([[0, 16], [1.0, 32]], r"\[1\] \[1.0, 32\]: start 1.0 must be a fraction of the epochs in \[0, 1\)"),
        ([16, 32], r"resolution_schedule\[0\]: a \[start, size\] pair"),
        ([], r"a list of \[start, size\] phases"),
    ]:
        with pytest.raises(ValueError, match=r"^model\.resolution_schedule") as raised:
            ResolutionSchedule.parse(value, 32, 4)
        assert re.search(message, str(raised.value)), (message, str(raised.value))
    assert ResolutionSchedule.parse([[0, [8, 16]], [0.5, 32]], 32, 4).phases[0] == (0.0, (8, 16))


def test_schedule__a_phase_the_check_refuses_names_the_smallest_size_that_passes():
    def even_grid_of_at_least_3x3(size):
        if size[0] // 4 < 3 or size[0] // 4 % 2:
            raise ConfigError(f"cannot mask {size[0] // 4}x{size[1] // 4}")

    with pytest.raises(ValueError) as raised:
        ResolutionSchedule.parse([[0, 16], [0.4, 20], [0.8, 32]], 32, 4, check=even_grid_of_at_least_3x3)
    assert str(raised.value) == (
        "model.resolution_schedule[1] [0.4, 20]: at 20x20 px, a 5x5 patch grid: cannot mask 5x5; the "
        "smallest phase size that trains at these settings is 16 (a multiple of patch_size 4, at most "
        "data.img_size 32)"
    )


def test_schedule__max_steps_that_end_the_run_before_a_phase_are_refused_naming_its_first_step():
    schedule = ResolutionSchedule.parse([[0, 8], [0.25, 16], [0.8, 32]], 32, 4)
    # 10 epochs of 5 steps: the phases start at epochs 0, 2 and 8, steps 0, 10 and 40
    for max_steps in (-1, 41, 50, 1000):
        schedule.check_run_length(10, 5, max_steps)
    with pytest.raises(ValueError, match=r"\[2\] \[0.8, 32\]: trainer.max_steps=40 .* at step 40 \(epoch 9 "):
        schedule.check_run_length(10, 5, 40)
    with pytest.raises(ValueError, match=r"\[1\] \[0.25, 16\]: .*raise trainer.max_steps above 10"):
        schedule.check_run_length(10, 5, 7)
    assert [schedule.next_phase(e, 10) for e in (0, 1, 2, 7, 8, 9)] == [1, 1, 2, 2, None, None]


def test_schedule__a_phase_whose_grid_leaves_no_visible_patch_is_refused_at_build():
    with pytest.raises(ValueError, match="visible"):
        pretrain_module(resolution_schedule=[[0, 4], [0.5, 16]], mask_ratio=0.75)  # a 1x1 grid at 4 px


class RecordSizes(Callback):
    """The input size each training epoch and each validation ran at."""

    def __init__(self):
        self.train, self.val = {}, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train[trainer.current_epoch] = pl_module.img_size

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0:
            self.val.append(pl_module.img_size)


def _fit(tmp_path, epochs, ckpt_path=None, stop_after=None):
    record = RecordSizes()
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        every_n_epochs=1,
        save_top_k=-1,
        save_last=True,
        filename="epoch_{epoch}",
        auto_insert_metric_name=False,
    )
    module = pretrain_module(resolution_schedule=SCHEDULE, optim=dict(warmup_epochs=0))
    stop = [StopAfter(stop_after)] if stop_after else []
    trainer = make_trainer(
        tmp_path, max_epochs=epochs, enable_checkpointing=True, callbacks=[record, checkpoints, *stop]
    )
    trainer.fit(module, datamodule=RandomImages(), ckpt_path=ckpt_path)
    return module, record


def test_training__each_epoch_in_its_phase_validation_at_the_final_size_checkpoints_of_the_final_model(
    tmp_path,
):
    module, record = _fit(tmp_path, epochs=4)
    assert record.train == {0: (8, 8), 1: (8, 8), 2: (16, 16), 3: (16, 16)}
    assert record.val == [(16, 16)] * 4
    for epoch in range(4):  # saved in either phase: the final size's position embeddings, the final record
        saved = torch.load(tmp_path / "ckpts" / f"epoch_{epoch}.ckpt", weights_only=False)
        assert saved["state_dict"]["model.pos_embed"].shape == (1, 1 + 16, 32)
        assert tuple(saved["mae_architecture"]["args"]["img_size"]) == (16, 16)
        # the checkpoint records the schedule
        assert saved["hyper_parameters"]["resolution_schedule"] == SCHEDULE
    backbone = load_backbone(tmp_path / "ckpts" / "last.ckpt")
    assert backbone.patch_embed.img_size == (16, 16)
    fresh = MaskedAutoencoderViT(
        **{
            **TINY,
            "img_size": 16,
            "embed_dim": 32,
            "num_heads": 2,
            "decoder_embed_dim": 32,
            "decoder_num_heads": 2,
            "depth": 1,
            "decoder_depth": 1,
        }
    )
    assert torch.equal(module.model.pos_embed, fresh.pos_embed)  # ended at the final size


class StopAfter(Callback):
    """Ends the run after ``epochs`` epochs (as a preemption would), its schedule that of the whole run."""

    def __init__(self, epochs):
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module):
        trainer.should_stop = trainer.current_epoch + 1 >= self.epochs


@pytest.mark.parametrize("stopped_after", [1, 3])
def test_resume__continues_in_the_phase_of_its_epoch(tmp_path, stopped_after):
    """A 4-epoch run stopped after ``stopped_after`` epochs (in the 8 px phase, or in the 16 px one) and
    resumed from its last checkpoint trains each remaining epoch at that epoch's size."""
    _fit(tmp_path, epochs=4, stop_after=stopped_after)
    resumed, record = _fit(tmp_path, epochs=4, ckpt_path=tmp_path / "ckpts" / "last.ckpt")
    expected = {0: (8, 8), 1: (8, 8), 2: (16, 16), 3: (16, 16)}
    assert record.train == {e: expected[e] for e in range(stopped_after, 4)}
    assert resumed.global_step == 4 * STEPS_PER_EPOCH and resumed.img_size == (16, 16)


def test_schedule__a_cnn_trains_each_phase_at_its_size_and_a_size_off_its_stride_is_refused(tmp_path):
    """A CNN has no position embedding: a phase changes its mask grid only (16-px cells: 2x2, then 4x4);
    a size that is no multiple of resnet10t's stride 32 is refused at build, naming the phase."""
    from torch.utils.data import TensorDataset

    cnn = dict(
        model="spark", img_size=64, model_kwargs=dict(encoder="resnet10t", mask_unit=16, decoder_width=64)
    )
    with pytest.raises(
        ConfigError, match=r"^model.resolution_schedule\[0\] \[0, 48\]: at 48x48 px.*stride 32"
    ):
        pretrain_module(**cnn, resolution_schedule=[[0, 48], [0.5, 64]])
    module = pretrain_module(**cnn, mask_ratio=0.5, resolution_schedule=[[0, 32], [0.5, 64]])
    data = RandomImages(n=4, batch_size=4)
    data.data = TensorDataset(torch.randn(4, 3, 64, 64), torch.zeros(4, dtype=torch.long))
    grids = []
    record = Callback()
    record.on_train_batch_start = lambda trainer, pl_module, *_: grids.append(pl_module.model.grid_size)
    trainer = make_trainer(tmp_path, max_epochs=2, limit_val_batches=0, callbacks=[record])
    trainer.fit(module, datamodule=data)
    assert grids == [(2, 2), (4, 4)] and module.resolution_summary == "32x32 px (step 0), 64x64 px (step 1)"
