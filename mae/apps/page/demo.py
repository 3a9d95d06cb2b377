"""The local reconstruction page (``mae demo --checkpoint CKPT``): upload or pick an image,
move the mask ratio, choose the masking strategy, resample the mask, and see four titled panels, the
masked-patch loss beside that of a flat guess, and what fitting the image to the model's input did;
a checkbox adds the last block's cls attention (``mae.inference.attention``).
Built with Gradio, an optional extra: ``pip install -e ".[demo]"``.

The page may be served to others (``--host 0.0.0.0``): it names files, never server paths, and every
failure, of a control or of one image, is a message on the page that stays until the next action."""

import contextlib
import errno
import math
import os
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.utils import make_grid

from mae.data import DEFAULT_MAX_PIXELS
from mae.data.decoding.formats import ARRAY_EXTENSIONS
from mae.data.decoding.image import read_header
from mae.data.decoding.limits import resized_size
from mae.errors import ConfigError, InputError
from mae.inference.attention import attention_caption, attention_panels, cls_attention_maps
from mae.inference.images import IMAGE_ERRORS, display_range, image_paths, load_image
from mae.inference.reconstruction import (
    caption_of,
    denormalize,
    load_reconstructor,
    mask_noise,
    reconstruct,
    to_display,
)
from mae.models.loss import masked_patch_mse_per_image
from mae.models.mae import MaskedAutoencoderViT
from mae.models.masking import MASK_STRATEGIES, num_kept, random_masking

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # a local page: nothing is sent anywhere

MASK_RATIO_RANGE = (0.05, 0.95)  # the slider's ends
MAX_SEED = 2**53 - 1  # the largest whole number a browser's number box holds exactly
UNNORMALIZE_CHOICES = ("patch", "none")
# What readers raise for a bad image file; anything else one image raises is unexpected, and logged.
DEFAULT_PORT = 7860  # Gradio's; without --port the page takes the first free one from here
DEFAULT_MAX_UPLOAD_MB = 100
MIN_PANEL = 256  # pixels: panels are enlarged (nearest neighbour) to at least this
PANEL_TITLES = {  # the views of ``mae.inference.reconstruction.reconstruct``, left to right
    "original": "what the model saw",
    "masked": "masked input (grey: hidden patches)",
    "reconstruction": "reconstruction",
    "reconstruction_visible": "reconstruction + visible patches",
}
LEGEND = (
    "**What the model saw** is your image fitted to the model's input (see below). In the **masked input**, "
    "the grey squares are the masked patches, drawn as the data's mean value: the encoder never sees them, "
    "and the loss is measured on them only. The **reconstruction** is the decoder's prediction for every "
    "patch; **+ visible patches** pastes it into the masked ones only."
)


@dataclass(frozen=True)
class PageSettings:
    """The page's controls, checked: ``mask_ratio`` in ``MASK_RATIO_RANGE``, ``strategy`` one of
    ``MASK_STRATEGIES``, ``seed`` a whole number in [0, ``MAX_SEED``], ``unnormalize`` "patch" or "none"."""

    mask_ratio: float
    strategy: str
    seed: int
    unnormalize: str

    @classmethod
    def from_controls(cls, mask_ratio, strategy, seed, unnormalize) -> "PageSettings":
        """Raises:
        ValueError: one clause per control whose value is missing or out of range, naming it.
        """
        problems = []
        low, high = MASK_RATIO_RANGE
        if not _is_number(mask_ratio) or not low <= mask_ratio <= high:
            problems.append(f"the mask ratio must be a number from {low} to {high}, not {_shown(mask_ratio)}")
        if strategy not in MASK_STRATEGIES:
            problems.append(
                f"the masking must be one of {', '.join(MASK_STRATEGIES)}, not {_shown(strategy)}"
            )
        if unnormalize not in UNNORMALIZE_CHOICES:
            problems.append(f"the norm_pix choice must be patch or none, not {_shown(unnormalize)}")
        if not _is_number(seed) or seed != int(seed) or not 0 <= seed <= MAX_SEED:
            problems.append(f"the mask seed must be a whole number from 0 to {MAX_SEED}, not {_shown(seed)}")
        if problems:
            raise ConfigError("; ".join(problems) + ".")
        return cls(float(mask_ratio), strategy, int(seed), unnormalize)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value) -> str:
    return "empty" if value is None or value == "" else repr(value)


class ImageTooLarge(InputError):
    """An image over the page's ``--max-image-pixels``."""


@dataclass
class Reconstruction:
    panels: dict[str, Image.Image]  # PANEL_TITLES' keys -> pictures, left to right
    loss: float  # the masked-patch loss
    flat_guess: float  # the masked-patch loss of a flat guess (``flat_guess_loss``)
    details: str  # Markdown: the losses, how the image was fitted to the input, the caption
    attention: Image.Image | None = None  # the cls attention, mean of the heads | each head, when asked for


class ReconstructionSession:
    """A loaded MAE (encoder and decoder), how its training data was normalised, and the largest image
    it reads (``max_pixels``, None: no limit)."""

    def __init__(
        self, checkpoint: str | Path, format: str = "auto", max_pixels: int | None = DEFAULT_MAX_PIXELS
    ):
        self.model, self.norm = load_reconstructor(checkpoint, format)
        self.size = tuple(self.model.config["img_size"])  # (H, W)
        self.max_pixels = max_pixels
        self.name = Path(checkpoint).name  # what the page shows: its path is the server's business

    @torch.no_grad()
    def render(
        self, path: str | Path, settings: PageSettings, name: str | None = None, attention: bool = False
    ) -> Reconstruction:
        """The panels and details of the image file at ``path``, called ``name`` on the page (default:
        the file's name); with ``attention``, the last block's cls attention too
        (``mae.inference.attention``).

        Raises:
            ImageTooLarge: over ``max_pixels``. Any exception of the readers or the model otherwise.
        """
        path = Path(path)
        name = name or path.name
        header = read_header(path)
        width, height = header.width, header.height
        if self.max_pixels is not None and width * height > self.max_pixels:
            raise ImageTooLarge(
                f"{name} is {width}x{height} = {width * height:,} pixels, over this page's limit of "
                f"{self.max_pixels:,}. If the image is genuine, start the page with --max-image-pixels "
                f"{width * height} (a small file that claims this size may be a decompression bomb)."
            )
        img = load_image(path, self.size, self.norm, self.max_pixels)[None]
        noise = mask_noise(self.model, 1, settings.mask_ratio, settings.seed, False, settings.strategy)
        views = reconstruct(self.model, img, settings.mask_ratio, noise, settings.unnormalize)
        loss, flat = views["loss"].item(), flat_guess_loss(self.model, img, settings.mask_ratio, noise).item()
        panels = self._panels(views, display_range([path]))
        L = self.model.num_patches
        masked = L - num_kept(L, settings.mask_ratio)
        verdict = "better than" if loss < flat else "no better than"
        guess = (
            "0 for every normalised masked patch: about 1 by construction"
            if self.model.target.name == "norm_pix"
            else "every masked pixel set to their mean: the masked patches' variance"
        )
        details = (
            f"**{name}**: masked-patch loss **{loss:.4f}**; a flat guess ({guess}) scores **{flat:.4f}**: "
            f"the model is {verdict} the flat guess (lower is "
            f"better).\n\n{input_note((width, height), self.size)}\n\nMask ratio {settings.mask_ratio:.2f} "
            f"({masked} of {L} patches hidden), {settings.strategy} masking, seed {settings.seed}. "
            f"{caption_of(self.model, settings.unnormalize)}"
        )
        if not attention:
            return Reconstruction(panels, loss, flat, details)
        maps = cls_attention_maps(self.model, img)  # the encoder on every patch: no masking
        details += f"\n\n{attention_caption(maps.shape[1])}"
        return Reconstruction(panels, loss, flat, details, self._attention_picture(maps))

    def _attention_picture(self, maps: torch.Tensor) -> Image.Image:
        """(1, heads, H', W') maps -> one picture: the mean of the heads | each head, enlarged as the
        panels."""
        pair = torch.cat(attention_panels(maps.cpu(), self.size))  # (2, 3, H, W)
        pixels = make_grid(pair, nrow=2, padding=2, pad_value=1.0).permute(1, 2, 0).numpy()
        picture = Image.fromarray((pixels * 255).round().astype(np.uint8))
        scale = max(1, -(-MIN_PANEL // min(self.size)))
        return picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST)

    def _panels(self, views: dict[str, torch.Tensor], value_range: tuple[float, float] | None) -> dict:
        """One enlarged picture per view, drawn as ``mae.inference.reconstruction.reconstruction_grid`` draws
        it."""
        data = {key: denormalize(views[key].float(), self.norm.mean, self.norm.std) for key in PANEL_TITLES}
        if value_range is None:  # float data in its own units: the original's minimum to maximum
            value_range = (data["original"].min().item(), data["original"].max().item())
        scale = max(1, -(-MIN_PANEL // min(self.size)))
        panels = {}
        for key, view in data.items():
            pixels = to_display(view, None, value_range)[0].permute(1, 2, 0).numpy()  # (H, W, 3) in [0, 1]
            picture = Image.fromarray((pixels * 255).round().astype(np.uint8))
            panels[key] = picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST)
        return panels


@torch.no_grad()
def flat_guess_loss(
    model: MaskedAutoencoderViT, imgs: torch.Tensor, mask_ratio: float, noise: torch.Tensor
) -> torch.Tensor:
    """(N,) the masked-patch loss of a guess that knows nothing of the image: every masked value is
    the mean of the masked targets. For a ``norm_pix`` target that mean is 0 and the loss is about
    1 by construction (exactly ``(n - 1) / n`` for n values per patch); for pixel targets it is the
    masked pixels' variance. A model's loss means something only beside it.

    Args:
        imgs: (N, C, H, W) normalised model input.
        noise: (N, L) the masking scores the model's loss was measured with.
    """
    target = model.target(imgs.float())  # (N, L, D_target), normalised per patch for norm_pix
    _, mask, _ = random_masking(target, mask_ratio, noise)
    weights = mask[..., None].expand_as(target)
    mean = (target * weights).sum(dim=(1, 2)) / weights.sum(dim=(1, 2)).clamp(min=1.0)
    return masked_patch_mse_per_image(mean[:, None, None].expand_as(target), target, mask)


def input_note(image_size: tuple[int, int], input_size: tuple[int, int]) -> str:
    """How an image of ``image_size`` (width, height) became the model's input of ``input_size``
    (H, W): resized so its short side is the input's longer side, then centre-cropped, as
    ``mae.inference.images.load_image`` does it."""
    width, height = image_size
    input_h, input_w = input_size
    resized_h, resized_w = resized_size(height, width, max(input_size))
    resized = (resized_w, resized_h)
    if (width, height) == (input_w, input_h):
        how = "the model's input size: it saw the whole image as it is"
    elif resized == (input_w, input_h):
        how = f"resized to the model's {input_w}x{input_h} input, nothing cropped"
    else:
        how = (
            f"resized to {resized[0]}x{resized[1]} and centre-cropped to the model's {input_w}x{input_h} "
            f"input, so its edges were cut off"
        )
    return f"The image is {width}x{height} pixels, {how}: the first panel is what the model saw."


def readable_error(err: Exception, path: Path, name: str) -> str:
    """A message for the page about the image ``name`` at ``path``: the error's own words with the
    server's paths replaced by the name, the name in front when they do not say it."""
    if isinstance(err, MemoryError):
        text = "there is not enough memory to read and reconstruct it (MemoryError)"
    else:
        text = str(err).strip() or type(err).__name__
        for shown in sorted({str(path), str(path.resolve())}, key=len, reverse=True):
            text = text.replace(shown, name)
        folders = {str(path.parent), str(path.resolve().parent)}
        for folder in sorted((f for f in folders if os.path.isabs(f) and f != os.sep), key=len, reverse=True):
            text = text.replace(folder + os.sep, "").replace(folder, "the image's folder")
        if not isinstance(err, IMAGE_ERRORS):
            text = f"it could not be reconstructed ({type(err).__name__}: {text})"
    return text if name in text else f"{name}: {text}"


def next_seed(seed) -> int | float | None:
    """The seed after ``seed``, wrapping to 0 after ``MAX_SEED``; an invalid seed stays as it is (the
    reconstruction then says what is wrong with it)."""
    if not _is_number(seed) or seed != int(seed) or not 0 <= seed <= MAX_SEED:
        return seed
    return 0 if seed == MAX_SEED else int(seed) + 1


def page_outputs(
    session: ReconstructionSession, path, name, ratio, strategy, seed, unnormalize, attention=False
) -> list:
    """What the page shows for its controls: the four panels (``PANEL_TITLES``' order), the attention
    picture (None unless ``attention``) and the details; or no pictures and a message saying what is
    wrong."""
    no_pictures = [None] * (len(PANEL_TITLES) + 1)
    try:
        settings = PageSettings.from_controls(ratio, strategy, seed, unnormalize)
    except ValueError as err:
        return [*no_pictures, f"**Check the settings:** {err}"]
    if path is None:
        return [*no_pictures, "**Upload an image or pick an example.**"]
    try:
        result = session.render(path, settings, name, attention=bool(attention))
    except Exception as err:  # whatever one image raises is a message on the page
        if not isinstance(err, IMAGE_ERRORS):
            traceback.print_exc()  # unexpected: the whole story for whoever runs the server
        return [*no_pictures, f"**Could not show this image:** {readable_error(err, Path(path), name)}"]
    return [*result.panels.values(), result.attention, result.details]


def shown_image(upload, example, by_name: dict[str, Path]) -> tuple[str | Path | None, str | None]:
    """(path, name) of the image a tab shows: the upload, else the picked example (by file name)."""
    if upload:
        return upload, Path(upload).name  # Gradio keeps the uploaded file's own name
    if example in by_name:
        return by_name[example], example
    return None, None


def image_chooser(by_name: dict[str, Path], prefix: str = "") -> tuple:
    """The page's image chooser, placed in the current Gradio column: a file upload (images and arrays)
    and a list of the examples ``by_name``; their element ids are ``<prefix>upload`` and ``<prefix>example``
    (the browser tests find them by these). Returns (upload, example)."""
    import gradio as gr

    upload = gr.File(label="your image", file_types=["image", *ARRAY_EXTENSIONS], elem_id=f"{prefix}upload")
    example = gr.Dropdown(
        choices=list(by_name),
        value=next(iter(by_name), None),
        label="or an example",
        elem_id=f"{prefix}example",
    )
    return upload, example


def build_page(
    session: ReconstructionSession, examples: list[Path], around: AbstractContextManager | None = None
):
    """The Gradio ``Blocks`` of the page. The image shown is the one of the last action: uploading
    clears the example box and picking an example clears the upload. ``around``: a context the page's
    content is built in, e.g. ``mae.apps.page.search.search_tabs(...)``, which makes it the first tab
    and adds a second that finds similar images in an index."""
    import gradio as gr

    by_name = {path.name: Path(path) for path in examples}
    with gr.Blocks(title="MAE reconstruction") as page, around or contextlib.nullcontext():
        height, width = session.size
        gr.Markdown(
            f"## MAE reconstruction\nModel: `{session.name}`, input {width}x{height}, "
            f"{session.norm.in_chans} channel(s)."
        )
        with gr.Row():
            with gr.Column(scale=1):
                controls = _controls(by_name)
            with gr.Column(scale=2):
                outputs, attention_row = _result_panels()
        _connect(page, session, by_name, controls, outputs, attention_row)
    return page


@dataclass
class _Controls:
    """The page's inputs (Gradio components): the image chooser, the settings and the two buttons."""

    upload: object
    example: object
    settings: list  # mask ratio, strategy, seed, unnormalize, attention: ``page_outputs``' order
    run: object
    resample: object


def _controls(by_name: dict[str, Path]) -> _Controls:
    """The left column: the image chooser, the settings and the buttons."""
    import gradio as gr

    upload, example = image_chooser(by_name)
    ratio = gr.Slider(*MASK_RATIO_RANGE, value=0.75, step=0.05, label="mask ratio", elem_id="ratio")
    strategy = gr.Radio(list(MASK_STRATEGIES), value="random", label="masking", elem_id="strategy")
    unnormalize = gr.Radio(
        list(UNNORMALIZE_CHOICES),
        value="patch",
        elem_id="unnormalize",
        label="norm_pix models: true patch statistics, or raw",
    )
    seed = gr.Number(value=0, precision=0, label=f"mask seed (0 to {MAX_SEED})", elem_id="seed")
    attention = gr.Checkbox(value=False, label="show the last block's cls attention", elem_id="attention")
    with gr.Row():
        run = gr.Button("Reconstruct", variant="primary", elem_id="run")
        resample = gr.Button("Resample mask", elem_id="resample")
    return _Controls(upload, example, [ratio, strategy, seed, unnormalize, attention], run, resample)


def _picture(label: str, elem_id: str):
    import gradio as gr

    return gr.Image(
        label=label, type="pil", format="png", interactive=False, buttons=["download"], elem_id=elem_id
    )


def _result_panels() -> tuple[list, object]:
    """The right column: the four panels two by two, the attention picture (in a row shown only when
    asked for), the details and the legend. Returns (outputs in ``page_outputs``' order, attention row)."""
    import gradio as gr

    panels = []
    keys = list(PANEL_TITLES)
    for row in (keys[:2], keys[2:]):  # two by two: room for the titles
        with gr.Row():
            panels += [_picture(PANEL_TITLES[key], f"panel-{key}") for key in row]
    with gr.Row(visible=False) as attention_row:
        attention_panel = _picture("cls attention: mean of the heads | each head", "panel-attention")
    details = gr.Markdown(elem_id="details")
    gr.Markdown(LEGEND, elem_id="legend")
    return [*panels, attention_panel, details], attention_row


def _connect(
    page, session, by_name: dict[str, Path], controls: _Controls, outputs: list, attention_row
) -> None:
    """Every event of the page: each control redraws the image shown; uploading clears the example box and
    picking an example the upload; the attention row is shown with its checkbox."""
    import gradio as gr

    upload, example, settings = controls.upload, controls.example, controls.settings
    ratio, strategy, seed, unnormalize, attention = settings

    def show(upload_path, example_name, *values) -> list:
        return page_outputs(session, *shown_image(upload_path, example_name, by_name), *values)

    def on_upload(upload_path, *values) -> list:
        return [None, *show(upload_path, None, *values)]  # clears the example box

    def on_example(example_name, *values) -> list:
        return [None, *show(None, example_name, *values)]  # clears the upload

    upload.upload(on_upload, [upload, *settings], [example, *outputs])
    upload.clear(show, [upload, example, *settings], outputs)
    example.input(on_example, [example, *settings], [upload, *outputs])
    redraws = (
        controls.run.click,
        ratio.release,
        strategy.input,
        unnormalize.input,
        seed.submit,
        attention.input,
    )
    for event in redraws:
        event(show, [upload, example, *settings], outputs)
    attention.change(lambda on: gr.Row(visible=on), attention, attention_row)
    controls.resample.click(next_seed, seed, seed).then(show, [upload, example, *settings], outputs)
    page.load(show, [upload, example, *settings], outputs)  # the first example, as the page opens


@contextlib.contextmanager
def example_images(folder: str | Path | None) -> Iterator[list[Path]]:
    """The images of ``folder``; without one, a few built-in digits in a temporary folder that is
    removed when the ``with`` block ends (the page stops)."""
    if folder is not None:
        yield image_paths([folder])
        return
    with tempfile.TemporaryDirectory(prefix="mae-demo-") as tmp:
        yield digit_examples(Path(tmp))


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


def port_is_free(host: str, port: int) -> bool:
    """Whether a server can listen on ``host:port`` now (as Uvicorn binds: address reuse on).

    Raises:
        OSError: ``host`` is not an address of this machine.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return False
        raise OSError(
            f"cannot listen on {host}:{port} ({err.strerror or err}): is --host an address of this machine?"
        ) from None
    return True


def choose_port(host: str, port: int | None, tries: int = 100) -> int:
    """``port`` when it is free; without one, the first free port from ``DEFAULT_PORT``.

    Raises:
        OSError: ``port`` is busy, or none of ``tries`` ports is free; the message says how to choose.
    """
    if port is not None:
        if not port_is_free(host, port):
            raise OSError(
                f"port {port} on {host} is busy (another page or program is serving on it): choose "
                f"another with --port N, or leave --port out to take the first free one from "
                f"{DEFAULT_PORT}"
            )
        return port
    for candidate in range(DEFAULT_PORT, DEFAULT_PORT + tries):
        if port_is_free(host, candidate):
            return candidate
    last = DEFAULT_PORT + tries - 1
    raise OSError(f"ports {DEFAULT_PORT} to {last} on {host} are all busy: choose one with --port N")


def serve(
    page, host: str, port: int, max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB, block: bool = True
) -> None:
    """Serve ``page`` on ``host:port``, never through a public share link, refusing uploads over
    ``max_upload_mb`` megabytes. With ``block``, until Ctrl-C or SIGTERM (both close the server and
    return, so that the caller's ``with`` blocks clean up)."""
    launch = dict(
        server_name=host,
        server_port=port,
        share=False,
        max_file_size=int(max_upload_mb * 1024**2),
        prevent_thread_lock=True,
    )
    if not block:
        page.launch(**launch, quiet=True)
        return
    # Both handlers set here: a process started in the background by a script inherits SIGINT ignored
    # (POSIX, for shells without job control), and Ctrl-C / kill -INT would then not stop the page.
    previous = {number: signal.signal(number, _interrupt) for number in (signal.SIGINT, signal.SIGTERM)}
    # Gradio's own wait (launch without prevent_thread_lock) closes the server only when the interrupt
    # arrives inside it: one that comes while launch() is still finishing would leave the server thread
    # running and the process alive. Here the launch is inside the try as well.
    try:
        page.launch(**launch, quiet=False)
        while True:
            time.sleep(0.1)
    except KeyboardInterrupt:
        print("stopping the page")
    finally:
        page.close()
        for number, handler in previous.items():
            signal.signal(number, handler)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # Ctrl-C and SIGTERM end the page alike
