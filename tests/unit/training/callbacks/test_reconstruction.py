import torch
from lightning.pytorch.loggers import TensorBoardLogger

from mae.inference.reconstruction import denormalize, reconstruct, reconstruction_grid
from mae.models import MaskedAutoencoderViT
from mae.training.callbacks import ReconstructionCallback
from tests.helpers import TINY, tensorboard_events


def test_reconstruct__norm_pix_prediction_is_unnormalised_with_target_statistics():
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**TINY, norm_pix_loss=True).eval()
    imgs = torch.randn(2, 3, 32, 32)
    target = model.patchify(imgs)
    normed = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
    # a model that predicts the normalised target perfectly
    model.forward_decoder = lambda latent, ids_restore, ids_decode=None: normed
    views = reconstruct(model, imgs, 0.75)
    torch.testing.assert_close(views["reconstruction"], imgs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(views["reconstruction_visible"], imgs, rtol=1e-4, atol=1e-4)
    masked_fraction = (views["masked"] == 0).float().mean().item()
    assert abs(masked_fraction - 0.75) < 0.01


def test_reconstruction_grid__four_columns_one_row_per_image():
    views = {
        k: torch.zeros(3, 3, 32, 32)
        for k in ("original", "masked", "reconstruction", "reconstruction_visible")
    }
    grid = reconstruction_grid(views)
    assert grid.shape == (3, 3 * 34 + 2, 4 * 34 + 2)
    torch.testing.assert_close(
        denormalize(torch.zeros(1, 3, 1, 1)).flatten(), torch.tensor([0.485, 0.456, 0.406])
    )


class _Trainer:
    def __init__(self, tmp_path, logger):
        self.log_dir = str(tmp_path)
        self.default_root_dir = str(tmp_path)
        self.loggers = [logger]
        self.global_step = 7
        self.datamodule = None  # not an ImageDataModule: the images come from the training loader
        self.train_dataloader = [(torch.randn(5, 3, 32, 32), torch.zeros(5))]


def test_reconstruction_callback__writes_png_and_sends_it_to_the_tracker(tmp_path):
    torch.manual_seed(0)
    module = type("M", (), {})()
    module.network = module.model = MaskedAutoencoderViT(**TINY)
    module.mask_ratio = 0.75
    module.device = torch.device("cpu")
    logger = TensorBoardLogger(tmp_path / "tb", name="run", version=0)
    callback = ReconstructionCallback(num_images=3)
    trainer = _Trainer(tmp_path, logger)
    grid = callback.reconstruction_grid(trainer, module)
    path = callback.save(trainer, grid, tmp_path / "reconstructions" / "epoch_0003.png")
    assert path == tmp_path / "reconstructions" / "epoch_0003.png" and path.stat().st_size > 0
    logger.experiment.flush()
    (figure,) = tensorboard_events(tmp_path / "tb" / "run" / "version_0").Images("reconstructions")
    # the step of the last update
    assert (figure.step, figure.height, figure.width) == (6, 3 * 34 + 2, 4 * 34 + 2)
    assert module.model.training  # mode restored


def test_reconstruction_callback__a_hog_model_is_skipped_with_one_note(tmp_path, monkeypatch):
    module = type("M", (), {})()
    module.network = module.model = MaskedAutoencoderViT(**TINY, target="hog")
    module.mask_ratio = 0.75
    module.device = torch.device("cpu")
    callback = ReconstructionCallback(num_images=3)
    trainer = _Trainer(tmp_path, TensorBoardLogger(tmp_path / "tb", name="run", version=0))
    trainer.is_global_zero = True
    callback.out_dir = tmp_path / "reconstructions"
    notes = []
    monkeypatch.setattr("mae.training.callbacks.reconstruction.rank_zero_info", notes.append)
    for epoch in (1, 2):
        callback.monitor(trainer, module, epoch)
    assert notes == [
        "reconstruction figures skipped: model.target hog predicts the HOG features (MaskFeat's histograms "
        "of oriented gradients) of each masked patch, not pixels, so there is no reconstruction to draw"
    ]
    assert callback.last_path is None and not (tmp_path / "reconstructions").exists()
