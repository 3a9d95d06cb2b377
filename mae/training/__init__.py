"""Training: the pretraining and fine-tuning Lightning modules on a shared base, optimisation and
schedule, per-device settings, callbacks and checkpoint writing."""

from mae.training.finetune import MAEFinetuneModule
from mae.training.pretrain import MAEPretrainModule

__all__ = ["MAEFinetuneModule", "MAEPretrainModule"]
