"""A rule the data layer's checks share with the training modules: both refuse schedule settings at
build. (The data layer's own rules are tested in the files named after their modules:
``decoding/test_formats.py``, ``decoding/test_route.py``, ``views/test_crop.py``, ``sources/test_folder.py``,
``views/test_normalize.py``.)"""

import pytest

from tests.helpers import finetune_module, pretrain_module


def test_schedule_settings__both_modules_refuse_them_at_build():
    for build in (pretrain_module, finetune_module):
        with pytest.raises(ValueError, match="need warmup_epochs >= 0, min_lr >= 0 and a positive lr"):
            build(optim=dict(warmup_epochs=-1))
        with pytest.raises(ValueError, match="need warmup_epochs >= 0"):
            build(optim=dict(lr=0.0))
