"""How a model's inputs are normalised: the record every command that runs a trained model reads from
its checkpoint (``mae_data``), or takes from ``--mean`` / ``--std``."""

from dataclasses import dataclass

from mae.data.views.normalize import check_statistics, normalization
from mae.errors import ConfigError


@dataclass
class Normalization:
    """How the model's training data was normalised: ``in_chans`` channels, ``mean`` / ``std`` each."""

    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        check_statistics(self.mean, self.std, "the normalisation's mean / std")

    @classmethod
    def of(cls, data: dict | None, in_chans: int, source: str) -> "Normalization":
        """From a checkpoint's ``mae_data`` record; ImageNet's for 3-channel files without one.

        Raises:
            ValueError: a file of another channel count that does not record its statistics.
        """
        if data is not None:
            return cls(data["in_chans"], tuple(data["mean"]), tuple(data["std"]))
        if in_chans != 3:
            raise ConfigError(f"{source} does not record its data's mean and std: pass --mean and --std")
        return cls(3, *normalization(3, None, None))  # the data modules' default for RGB: ImageNet's
