"""The MAE family's convolutional member: masked pretraining of timm CNNs with sparse convolution emulated by
masked dense ops (SparK; ConvNeXt-V2's FCMAE). The model (``model.py``), the emulation (``sparse.py``) and
the decoders' interface and table (``decoders.py``)."""

from mae.models.cnn.decoders import CNN_DECODERS, CNNDecoder, DecoderShape
from mae.models.cnn.model import MaskedAutoencoderCNN

__all__ = ["CNN_DECODERS", "CNNDecoder", "DecoderShape", "MaskedAutoencoderCNN"]
