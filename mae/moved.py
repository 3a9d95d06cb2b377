"""Old import paths of modules that moved, kept working: ``import mae.eval.visualize`` or a config's
``class_path: mae.dense.detection_data.DigitScenesDataModule`` still finds what it named, with a
``FutureWarning`` that names the new path. Installed by ``mae/__init__.py``; the one table of moves is
``MOVED``."""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

# old module -> its new module, or the new modules its names were split into (read in order)
MOVED: dict[str, str | tuple[str, ...]] = {
    "mae.eval.visualize": "mae.inference.reconstruction",
    "mae.eval.attention": "mae.inference.attention",
    "mae.eval.own_images": (
        "mae.inference.normalization",
        "mae.inference.images",
        "mae.inference.reconstruction",
        "mae.apps.reconstruction_figure",
    ),  # fmt: skip
    "mae.eval.demo_page": ("mae.apps.page.demo", "mae.inference.images"),
    "mae.eval.search_page": "mae.apps.page.search",
    "mae.eval.embedder": "mae.apps.embeddings.embedder",
    "mae.eval.embed_run": ("mae.apps.embeddings.embed_run", "mae.inference.images"),
    "mae.eval.embedding_index": "mae.apps.embeddings.embedding_index",
    "mae.eval.similarity": "mae.apps.embeddings.similarity",
    "mae.eval.image_search": "mae.apps.embeddings.image_search",
    "mae.eval.neighbours_figure": "mae.apps.embeddings.neighbours_figure",
    "mae.eval.onnx_encoder": "mae.apps.onnx_encoder",
    "mae.eval.anomaly": "mae.apps.anomaly",
    **{
        f"mae.eval.anomaly.{name}": f"mae.apps.anomaly.{name}"
        for name in ("baseline", "digits", "evaluation", "figures", "layout", "masks", "metrics", "scoring")
    },
    "mae.dense.pyramid": "mae.dense.models.pyramid",
    "mae.dense.windows": "mae.dense.models.windows",
    "mae.dense.upernet": "mae.dense.models.upernet",
    "mae.dense.coco": "mae.dense.data.coco",
    "mae.dense.detection_data": "mae.dense.data.detection",
    "mae.dense.segmentation_data": "mae.dense.data.segmentation",
    "mae.dense.detection_metrics": "mae.dense.metrics.detection",
    "mae.dense.segmentation_metrics": "mae.dense.metrics.segmentation",
    "mae.dense.module": "mae.dense.tasks.base",
    "mae.dense.detection": ("mae.dense.tasks.detection", "mae.dense.models.detectors"),
    "mae.dense.segmentation": ("mae.dense.tasks.segmentation", "mae.dense.models.segmenter"),
    "mae.dense.figures": "mae.dense.tasks.figures",
    "mae.dense.scenes": "mae.data.sources.digit_scenes",
    "mae.dense.scene_images": "mae.data.sources.scene_images",
}


def new_path(old: str) -> str:
    """Where module ``old`` went, as one line (for messages)."""
    new = MOVED[old]
    return new if isinstance(new, str) else " / ".join(new)


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of ``MOVED`` under their old names: the new module itself (so classes keep one
    identity), or, for a module split in several, one that holds the public names of each."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=False)

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {new_path(spec.name)}: import it from there", FutureWarning,
                      stacklevel=2)  # fmt: skip
        new = MOVED[spec.name]
        if isinstance(new, str):
            return importlib.import_module(new)
        merged = types.ModuleType(spec.name, f"Moved: the names of {new_path(spec.name)}.")
        for name in new:
            module = importlib.import_module(name)
            merged.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
        return merged

    def exec_module(self, module) -> None:
        pass  # the new modules ran when they were imported


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once). First, because a moved package's old name is an
    alias of the new package, whose folder the path finder would otherwise search for the old submodule
    names and load a second copy of each; it answers only for the names in ``MOVED``, none of which
    exists as a module."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
