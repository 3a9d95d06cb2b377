import lightning.pytorch as pl
import pytest
import torch

from tests.helpers import RandomImages, RecordLR, make_trainer, official_lr, pretrain_module


def test_module__lr_every_step_follows_the_official_schedule(tmp_path):
    record = RecordLR()
    module = pretrain_module(optim=dict(base_lr=1e-3, min_lr=1e-5))
    trainer = make_trainer(
        tmp_path, max_epochs=3, limit_train_batches=5, limit_val_batches=0, callbacks=[record]
    )
    trainer.fit(module, datamodule=RandomImages(batch_size=4))
    assert module.effective_batch == 4 and module.resolved_lr == pytest.approx(1e-3 * 4 / 256)
    assert len(record.lrs) == 15
    for step, lr in enumerate(record.lrs):
        assert lr == pytest.approx(official_lr(step / 5, module.resolved_lr, 1e-5, 1, 3), rel=1e-9, abs=1e-15)


def test_module__accumulation_scales_lr_and_steps_on_a_short_last_window(tmp_path):
    module = pretrain_module(optim=dict(base_lr=1e-3))
    trainer = make_trainer(
        tmp_path, max_epochs=2, limit_train_batches=5, limit_val_batches=0, accumulate_grad_batches=2
    )
    trainer.fit(module, datamodule=RandomImages(batch_size=4))
    assert module.effective_batch == 8 and module.resolved_lr == pytest.approx(1e-3 * 8 / 256)
    assert trainer.global_step == 2 * 3  # 5 batches with accumulation 2 -> 3 optimizer steps per epoch


def test_module__validation_loss_is_the_same_each_time(tmp_path):
    module = pretrain_module()
    trainer = make_trainer(tmp_path, max_epochs=1, limit_val_batches=3)
    dm = RandomImages()
    first = trainer.validate(module, datamodule=dm, verbose=False)[0]["val/loss"]
    second = trainer.validate(module, datamodule=dm, verbose=False)[0]["val/loss"]
    assert first == second


def test_module__bad_settings_fail_at_construction():
    with pytest.raises(ValueError, match=r"mask_ratio must be in \[0, 1\)"):
        pretrain_module(mask_ratio=1.0)
    with pytest.raises(ValueError, match="set model.img_size"):
        pretrain_module(model_kwargs={"img_size": 64})
    with pytest.raises(ValueError, match="unknown model argument"):
        pretrain_module(model_kwargs={"dept": 2})
    with pytest.raises(ValueError, match="valid names"):
        pretrain_module(model="vit_base")


def test_module__warmup_longer_than_run_fails_before_training(tmp_path):
    module = pretrain_module(optim=dict(warmup_epochs=5))
    trainer = make_trainer(tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=0)
    with pytest.raises(ValueError, match="warmup_epochs=5"):
        trainer.fit(module, datamodule=RandomImages())


def test_module__bf16_mixed_precision_trains(tmp_path):
    module = pretrain_module(optim=dict(warmup_epochs=0))
    trainer = make_trainer(tmp_path, max_steps=2, limit_val_batches=1, precision="bf16-mixed")
    trainer.fit(module, datamodule=RandomImages())
    assert trainer.global_step == 2
    assert torch.isfinite(trainer.callback_metrics["train/loss_step"])
    assert next(module.model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_monitoring_callbacks__do_not_change_the_training_run(tmp_path):
    from mae.training.callbacks import KNNCallback, ReconstructionCallback

    class Monitored(RandomImages):
        num_labels = 1
        num_workers = 0

        def feature_datasets(self):
            return self.data, self.data

    losses = []
    for callbacks in ([], [KNNCallback(every_n_epochs=1, k=2), ReconstructionCallback(every_n_epochs=1)]):
        pl.seed_everything(0)
        module = pretrain_module(optim=dict(warmup_epochs=0))
        trainer = make_trainer(
            tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=0, callbacks=callbacks
        )
        trainer.fit(module, datamodule=Monitored())
        losses.append([p.detach().clone() for p in module.parameters()])
    for a, b in zip(*losses, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_monitors__a_run_ended_by_max_steps_mid_epoch_is_evaluated_once_at_its_end(tmp_path):
    from mae.data import DigitsDataModule
    from mae.training.callbacks import KNNCallback, ProbeCallback, ReconstructionCallback

    class Counted(KNNCallback):
        calls = 0

        def monitor(self, trainer, pl_module, epoch):
            Counted.calls += 1
            super().monitor(trainer, pl_module, epoch)

    module = pretrain_module(optim=dict(warmup_epochs=0))
    callbacks = [
        Counted(every_n_epochs=10, k=2, max_train=100),
        ReconstructionCallback(every_n_epochs=10),
        ProbeCallback(every_n_epochs=10, max_epochs=2, patience=1, max_train=100),
    ]
    trainer = make_trainer(
        tmp_path, max_epochs=50, max_steps=3, limit_train_batches=5, limit_val_batches=0, callbacks=callbacks
    )
    trainer.fit(module, datamodule=DigitsDataModule(img_size=16, batch_size=32))
    assert trainer.global_step == 3  # ended inside the first epoch, far from every_n_epochs
    assert {"val/knn_acc1", "val/probe_acc1"} <= set(trainer.callback_metrics)
    assert callbacks[1].last_path is not None and callbacks[1].last_path.is_file()
    assert Counted.calls == 1  # once for the final weights, not again at the end of training


def test_monitors__a_run_told_to_stop_is_evaluated_at_its_last_epoch(tmp_path):
    """Early stopping or max_time end a run at an epoch no every_n_epochs reaches: its weights are
    still evaluated then."""
    import lightning.pytorch as pl

    from mae.data import DigitsDataModule
    from mae.training.callbacks import KNNCallback

    class StopAfterSecondEpoch(pl.Callback):  # as EarlyStopping does, at the end of validation
        def on_validation_end(self, trainer, pl_module):
            trainer.should_stop = trainer.should_stop or trainer.current_epoch == 1

    module = pretrain_module(optim=dict(warmup_epochs=0))
    knn = KNNCallback(every_n_epochs=10, k=2, max_train=100)
    trainer = make_trainer(
        tmp_path,
        max_epochs=50,
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=[StopAfterSecondEpoch(), knn],
    )
    trainer.fit(module, datamodule=DigitsDataModule(img_size=16, batch_size=32))
    assert trainer.current_epoch == 2 and "val/knn_acc1" in trainer.callback_metrics


def test_monitors__a_probe_on_one_class_is_refused_before_the_first_step(tmp_path):
    from mae.data import ImageFolderDataModule
    from mae.training.callbacks import ProbeCallback
    from tests.helpers import write_image_folder

    write_image_folder(tmp_path / "data" / "train", ["only"], 4, size=(16, 16))
    write_image_folder(tmp_path / "data" / "val", ["only"], 2, size=(16, 16))
    data = ImageFolderDataModule(str(tmp_path / "data"), img_size=16, batch_size=2, num_workers=0)
    module = pretrain_module(optim=dict(warmup_epochs=0))
    trainer = make_trainer(tmp_path, max_epochs=2, callbacks=[ProbeCallback(every_n_epochs=1)])
    with pytest.raises(ValueError, match="probe.every_n_epochs=1: a linear probe needs .* 2 or more classes"):
        trainer.fit(module, datamodule=data)
    assert trainer.global_step == 0


def test_module__accumulation_longer_than_an_epoch_still_updates_every_epoch(tmp_path):
    module = pretrain_module(optim=dict(base_lr=1e-3, warmup_epochs=0))
    before = [p.detach().clone() for p in module.parameters()]
    trainer = make_trainer(
        tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=0, accumulate_grad_batches=4
    )
    trainer.fit(module, datamodule=RandomImages(batch_size=4))
    assert module.effective_batch == 16  # lr scaled by the accumulation the run asked for
    assert trainer.global_step == 2  # 3 batches < 4 accumulated: one update at each epoch end
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


# ---------------------------------------------------------------- a CNN model

CNN = dict(model="spark", img_size=32, model_kwargs=dict(encoder="resnet10t", mask_unit=8, decoder_width=64))


def test_cnn_module__the_monitors_evaluate_the_plain_timm_encoder_a_vit_module_the_mae():
    from timm.models.resnet import ResNet

    cnn = pretrain_module(**CNN)
    assert type(cnn.encoder) is ResNet and cnn.encoder is cnn.model.encoder
    vit = pretrain_module()
    assert vit.encoder is vit.model


def test_cnn_module__sync_batchnorm_fsdp2_and_compile_are_refused_by_name():
    from types import SimpleNamespace

    from mae.errors import ConfigError
    from mae.training.sharding import FSDP2Strategy

    module = pretrain_module(**CNN)
    synced = pl.Trainer(accelerator="cpu", devices=1, strategy="ddp", sync_batchnorm=True, logger=False)
    with pytest.raises(ConfigError, match=r"^trainer.sync_batchnorm: true would replace the CNN resnet10t's"):
        module.check_trainer(synced)
    sharded = SimpleNamespace(
        _accelerator_connector=SimpleNamespace(_layer_sync=None), strategy=FSDP2Strategy()
    )
    with pytest.raises(ConfigError, match=r"^trainer.strategy FSDP2Strategy \(FSDP2\) shards a ViT's blocks"):
        module.check_trainer(sharded)
    module.check_trainer(pl.Trainer(accelerator="cpu", devices=1, logger=False))  # the plain trainer: fine
    pretrain_module().check_trainer(synced)  # a ViT has no BatchNorm to replace
    compiled = pretrain_module(**CNN, kernels=dict(compile=True))
    with pytest.raises(ConfigError, match=r"^model.kernels.compile: true cannot compile the CNN model"):
        compiled.check_trainer(pl.Trainer(accelerator="cpu", devices=1, logger=False))


def test_cnn_module__compile_auto_is_off_for_a_cnn_on_for_a_long_vit_run(tmp_path):
    trainer = make_trainer(tmp_path)
    for module, compiled in ((pretrain_module(**CNN), False), (pretrain_module(), True)):
        trainer.strategy.connect(module)
        module.trainer = trainer
        assert module.resolve_settings(None).compile is compiled  # None: a long run, where compiling pays
