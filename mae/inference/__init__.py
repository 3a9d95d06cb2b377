"""What every use of a trained model on images shares, below the measuring (``mae.eval``), the training
monitors (``mae.training``) and the applications (``mae.apps``): the input normalisation a checkpoint
records (``normalization``), one image file read as the model's input (``images``), reconstructions and
their picture (``reconstruction``) and the last block's cls attention maps (``attention``)."""

from mae.inference.images import IMAGE_ERRORS, image_paths, load_image
from mae.inference.normalization import Normalization
from mae.inference.reconstruction import load_reconstructor, reconstruct, reconstruction_grid

__all__ = [
    "IMAGE_ERRORS",
    "Normalization",
    "image_paths",
    "load_image",
    "load_reconstructor",
    "reconstruct",
    "reconstruction_grid",
]
