"""``python -m mae.embed --checkpoint CKPT ROOT_OR_FILES... --out FILE``: an embedding of every image."""

import sys
from pathlib import Path

import torch
from jsonargparse import ArgumentParser, Namespace

from mae.apps.embeddings.embed_run import PartsFolder, embed_images, listed_images
from mae.apps.embeddings.embedder import load_embedder
from mae.apps.embeddings.embedding_index import IndexMeta, index_outputs
from mae.command import UsageError, argparse_float, argparse_int, command_parser, parse_and_run
from mae.convert.sources import FORMATS
from mae.data import DEFAULT_MAX_PIXELS
from mae.eval.features import POOLS
from mae.inference.normalization import Normalization
from mae.io.outputs import check_outputs

COMMAND = "mae.embed"


def build_parser() -> ArgumentParser:
    parser = command_parser(
        f"python -m {COMMAND}",
        "Embed every image of folders and files with a pretrained encoder into an index (Parquet, or .npy + "
        "CSV), for python -m mae.search. A stopped run continues where it stopped when started again.",
    )
    parser.add_argument("images", nargs="+", help="image files, or folders of them (an ImageFolder root: "
                        "<root>/<class>/... gives each image its class as label)")  # fmt: skip
    parser.add_argument("--checkpoint", required=True, help="any checkpoint mae.load_backbone reads")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="checkpoint format (default: detect)")
    parser.add_argument("--out", type=Path, required=True, help="the index: FILE.parquet, or FILE.npy (with "
                        "FILE.csv and FILE.json beside it)")  # fmt: skip
    parser.add_argument("--pool", choices=POOLS, default="cls",
                        help="the normed cls token, the mean patch token, or both side by side")  # fmt: skip
    parser.add_argument("--batch-size", type=argparse_int, default=256)
    parser.add_argument("--workers", type=argparse_int, default=2, help="image-reading processes (0: none)")
    parser.add_argument("--img-size", type=argparse_int, default=None, help="input size (default: the checkpoint's)")
    parser.add_argument("--mean", type=argparse_float, nargs="+", default=None, help="per-channel mean (default: "
                        "the checkpoint's record)")  # fmt: skip
    parser.add_argument("--std", type=argparse_float, nargs="+", default=None, help="per-channel std (default: "
                        "the checkpoint's record)")  # fmt: skip
    parser.add_argument("--part-size", type=argparse_int, default=4096,
                        help="images per resumable part (a stopped run loses at most one part)")  # fmt: skip
    parser.add_argument("--device", default=None, help="where the encoder runs (default: cuda when available)")
    parser.add_argument("--max-image-pixels", type=argparse_int, default=DEFAULT_MAX_PIXELS,
                        help="larger images are skipped as decompression bombs (default: PIL's limit)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def run(args: Namespace) -> IndexMeta:
    """Embed the images into ``args.out`` and print what was written and what was skipped.

    Raises:
        UsageError: a batch, part or input size below 1, negative workers, --mean without --std.
    """
    sizes = (("--batch-size", args.batch_size, 1), ("--part-size", args.part_size, 1), ("--workers", args.workers, 0),
             ("--img-size", args.img_size, 1))  # fmt: skip
    for flag, value, low in sizes:
        if value is not None and value < low:
            raise UsageError(f"{flag} must be at least {low}, got {value}")
    if (args.mean is None) != (args.std is None):
        raise UsageError("give --mean and --std together")
    check_outputs(COMMAND, [*index_outputs(args.out), PartsFolder(args.out).output()], args.images)
    items = listed_images(args.images)  # before loading the model: a mistyped folder fails at once
    norm = None
    if args.mean is not None:
        if len(args.mean) != len(args.std):
            raise UsageError("--mean and --std need the same number of values, one per channel")
        norm = Normalization(len(args.mean), tuple(args.mean), tuple(args.std))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    embedder = load_embedder(args.checkpoint, args.pool, args.format, args.img_size, norm, device,
                             args.max_image_pixels)  # fmt: skip
    meta = embed_images(embedder, items, args.out, args.batch_size, args.workers, args.part_size,
                        progress=not args.no_progress)  # fmt: skip
    for skip in meta.skipped:
        print(f"skipped {skip['path']}: {skip['error']}", file=sys.stderr)
    skipped = "" if not meta.skipped else f", {len(meta.skipped)} unreadable image(s) skipped (listed above)"
    print(f"wrote {args.out}: {meta.count} vectors of length {meta.dim} ({meta.pool} pooling, input "
          f"{meta.img_size[1]}x{meta.img_size[0]}){skipped}")  # fmt: skip
    return meta


def main(argv: list[str] | None = None) -> IndexMeta:
    return parse_and_run(build_parser(), run, argv)
