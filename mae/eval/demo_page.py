"""The local reconstruction page (``python -m mae.demo --checkpoint CKPT``): upload or pick an image,
move the mask ratio, choose the masking strategy, resample the mask, and see the four panels and
the masked-patch loss. Built with Gradio, an optional extra: ``pip install -e ".[demo]"``."""

import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mae.convert.backbone import load_mae
from mae.convert.sources import read_checkpoint
from mae.data.transforms import DEFAULT_MAX_PIXELS
from mae.eval.own_images import Normalization, display_range, image_paths, load_image, reconstruction_figure

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # a local page: nothing is sent anywhere


class ReconstructionSession:
    """A loaded MAE (encoder and decoder) and how its training data was normalised."""

    def __init__(self, checkpoint: str | Path, format: str = "auto", max_pixels: int | None = DEFAULT_MAX_PIXELS):
        ckpt = read_checkpoint(checkpoint, format)
        self.model, _ = load_mae(ckpt)
        self.model.eval()
        self.norm = Normalization.of(ckpt.data, self.model.config["in_chans"], str(checkpoint))
        self.size = tuple(self.model.config["img_size"])
        self.max_pixels = max_pixels
        self.source = str(checkpoint)

    @torch.no_grad()
    def render(
        self, path: str | Path, mask_ratio: float, strategy: str, seed: int, unnormalize: str = "patch"
    ) -> tuple[Image.Image, str]:
        """The four panels of the image at ``path`` and a Markdown line with its loss and the caption.

        Raises:
            OSError, ValueError, PIL.Image.DecompressionBombError: naming the file or the setting.
        """
        img = load_image(path, self.size, self.norm, self.max_pixels)[None]
        figure = reconstruction_figure(
            self.model, img, [Path(path).name], self.norm, float(mask_ratio), int(seed), unnormalize=unnormalize,
            strategy=strategy, value_range=display_range([path]),
        )  # fmt: skip
        return figure.image, f"**masked-patch loss {figure.losses[0]:.4f}** (mask ratio {mask_ratio:.2f}, " \
            f"{strategy}, seed {int(seed)}). {figure.caption}"  # fmt: skip


def digit_examples(folder: Path, count: int = 6) -> list[Path]:
    """A few of the built-in handwritten digits as PNG files in ``folder`` (the default run's data)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"digit_{digits.target[i]}_{i}.png"
        Image.fromarray(np.round(digits.images[i] * 255 / 16).astype(np.uint8)).resize((32, 32)).save(path)
        paths.append(path)
    return paths


def build_page(session: ReconstructionSession, examples: list[Path]):
    """The Gradio ``Blocks`` of the page."""
    import gradio as gr

    by_name = {path.name: str(path) for path in examples}

    def reconstruct(upload, example, ratio, strategy, seed, unnormalize):
        path = upload or by_name.get(example)
        if path is None:
            raise gr.Error("upload an image or pick an example")
        try:
            return session.render(path, ratio, strategy, seed, unnormalize)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise gr.Error(str(err)) from None

    with gr.Blocks(title="MAE reconstruction") as page:
        gr.Markdown(f"## MAE reconstruction\nModel: `{session.source}`, input {session.size[0]}x{session.size[1]}, "
                    f"{session.norm.in_chans} channel(s).")  # fmt: skip
        with gr.Row():
            with gr.Column(scale=1):
                upload = gr.File(label="your image", file_types=["image", ".tif", ".tiff", ".npy"], elem_id="upload")
                example = gr.Dropdown(choices=list(by_name), value=next(iter(by_name), None), label="or an example",
                                      elem_id="example")  # fmt: skip
                ratio = gr.Slider(0.05, 0.95, value=0.75, step=0.05, label="mask ratio", elem_id="ratio")
                strategy = gr.Radio(["random", "block", "grid"], value="random", label="masking", elem_id="strategy")
                unnormalize = gr.Radio(["patch", "none"], value="patch", elem_id="unnormalize",
                                       label="norm_pix models: true patch statistics, or raw")  # fmt: skip
                seed = gr.Number(value=0, precision=0, label="mask seed", elem_id="seed")
                with gr.Row():
                    run = gr.Button("Reconstruct", variant="primary", elem_id="run")
                    resample = gr.Button("Resample mask", elem_id="resample")
            with gr.Column(scale=2):
                figure = gr.Image(label="original | masked | reconstruction | + visible patches", type="pil",
                                  format="png", interactive=False, elem_id="figure")  # fmt: skip
                details = gr.Markdown(elem_id="details")
        inputs = [upload, example, ratio, strategy, seed, unnormalize]
        run.click(reconstruct, inputs, [figure, details])
        ratio.release(reconstruct, inputs, [figure, details])
        for control in (upload, example, strategy, unnormalize):
            control.change(reconstruct, inputs, [figure, details])
        resample.click(lambda s: int(s) + 1, seed, seed).then(reconstruct, inputs, [figure, details])
        page.load(reconstruct, inputs, [figure, details])  # the first example, as the page opens
    return page


def examples_for(folder: str | Path | None) -> list[Path]:
    """The images of ``folder``, or a few built-in digits when none is given."""
    if folder is not None:
        return image_paths([folder])
    return digit_examples(Path(tempfile.mkdtemp(prefix="mae-demo-")))
