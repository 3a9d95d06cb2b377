"""``RunHealth`` (mae/training/callbacks/health.py) at the trainer's depth: switched off it logs nothing;
its settings are checked when it is built. (The gradient norm, the update ratio and the jump warning
through ``mae pretrain``: tests/integration/pretrain/test_run_health.py.)"""

import pytest
from lightning.pytorch.loggers import CSVLogger

from mae.errors import ConfigError
from mae.training.callbacks import RunHealth
from tests.helpers import RandomImages, make_trainer, pretrain_module, read_metrics


def test_health__off_logs_nothing_and_bad_settings_are_refused(tmp_path):
    trainer = make_trainer(
        tmp_path,
        max_steps=2,
        limit_val_batches=0,
        callbacks=[RunHealth(enabled=False)],
        logger=CSVLogger(tmp_path, name="", version=""),
        log_every_n_steps=1,
    )
    trainer.fit(pretrain_module(optim=dict(warmup_epochs=0)), datamodule=RandomImages())
    rows = read_metrics(tmp_path)
    assert rows and not any(r.get("train/grad_norm") or r.get("train/update_ratio") for r in rows)
    with pytest.raises(ConfigError, match="health.jump_factor must be >= 0"):
        RunHealth(jump_factor=-1)
