"""The package's layers, lowest first: the one table that ``tests/unit/test_architecture.py`` checks every
import against, and that the drawing on the architecture page (``docs/layers.svg``) is made from.

``python docs/hooks/layers.py`` redraws ``docs/layers.svg``; ``tests/unit/test_architecture.py`` fails while
the committed drawing differs from what this table draws, so the picture cannot go stale.
"""

from html import escape
from pathlib import Path

DRAWING = Path(__file__).resolve().parents[1] / "layers.svg"

# (modules, what the layer holds), lowest first; a module belongs to the longest prefix it matches.
LAYERS = [
    (
        ("mae.compat", "mae.errors", "mae.io"),
        "private names of libraries, user errors and exit codes, atomic writes and storage",
    ),
    (("mae.models",), "the MAE as the paper reads: masking, encoder, decoder, loss; no Lightning"),
    (("mae.data.decoding",), "what a file is and how it is read"),
    (("mae.data.views",), "crops, recipes, normalisation, GPU decoding"),
    (("mae.data.sources", "mae.data"), "the Lightning data modules and their loaders"),
    (("mae.data.tools",), "the shard converter and the data statistics"),
    (("mae.convert",), "checkpoints in and out, load_backbone, export"),
    (("mae.inference",), "what every use of a trained model on images shares"),
    (("mae.eval",), "only what measures: features, kNN, linear probe"),
    (("mae.training",), "the Lightning modules, optimiser, callbacks, trackers"),
    (("mae.dense",), "detection and segmentation on the encoder"),
    (("mae.apps",), "applications: figures, the page, embeddings, anomaly maps"),
    (("mae.cli", "mae"), "every command, and the mae command over them"),
]

WIDTH, BOX_HEIGHT, GAP, MARGIN, ARROW_X = 820, 38, 10, 16, 40


def folder_names(modules: tuple[str, ...]) -> str:
    """``mae.data.sources`` -> ``data/sources``; the package itself (``mae``) is left out of the label."""
    return ", ".join(module.removeprefix("mae.").replace(".", "/") for module in modules if module != "mae")


def svg(layers: list[tuple[tuple[str, ...], str]] = LAYERS) -> str:
    """The drawing: one box a layer, the highest on top, an arrow down the side ("imports only below")."""
    height = 2 * MARGIN + len(layers) * (BOX_HEIGHT + GAP) - GAP
    left = ARROW_X + 24
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="13">',
        "<title>The layers of the mae package: each imports only the layers below it</title>",
        '<defs><marker id="head" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto">'
        '<path d="M0,0 L10,4 L0,8 z" fill="#555"/></marker></defs>',
        f'<line x1="{ARROW_X}" y1="{MARGIN}" x2="{ARROW_X}" y2="{height - MARGIN}" stroke="#555" '
        f'stroke-width="2" marker-end="url(#head)"/>',
        f'<text x="{ARROW_X - 8}" y="{height / 2}" transform="rotate(-90 {ARROW_X - 8} {height / 2})" '
        f'text-anchor="middle" fill="#555">imports point down</text>',
    ]
    for row, (modules, holds) in enumerate(reversed(layers)):
        y = MARGIN + row * (BOX_HEIGHT + GAP)
        parts += [
            f'<rect x="{left}" y="{y}" width="{WIDTH - left - MARGIN}" height="{BOX_HEIGHT}" rx="6" '
            f'fill="#eef3fb" stroke="#4a6fa5"/>',
            f'<text x="{left + 12}" y="{y + 24}"><tspan font-weight="bold">{escape(folder_names(modules))}'
            f'</tspan><tspan fill="#444"> \u2014 {escape(holds)}</tspan></text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    DRAWING.write_text(svg(), encoding="utf-8")
    print(f"wrote {DRAWING}")
