"""The anomaly scorers of ``mae anomaly``, one class each on ``base.Scorer``, and ``SCORERS``, the one table
the command builds its ``--method`` choices and each scorer's flags from and reads saved scorers by. A new
scorer is a file here and a row in ``SCORERS``."""

from mae.apps.anomaly.scorers.base import Scorer
from mae.apps.anomaly.scorers.feature_memory import FeatureMemoryScorer
from mae.apps.anomaly.scorers.pixel_knn import PixelKnnScorer
from mae.apps.anomaly.scorers.reconstruction import ReconstructionScorer

SCORERS: dict[str, type[Scorer]] = {
    scorer.name: scorer
    for scorer in (
        ReconstructionScorer,
        PixelKnnScorer,
        FeatureMemoryScorer,
    )
}
DEFAULT_METHOD = ReconstructionScorer.name

__all__ = [
    "DEFAULT_METHOD",
    "SCORERS",
    "FeatureMemoryScorer",
    "PixelKnnScorer",
    "ReconstructionScorer",
    "Scorer",
]
