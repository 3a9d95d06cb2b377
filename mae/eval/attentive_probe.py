"""An attentive probe (V-JEPA's and AIM's protocol): the frozen encoder's tokens pooled by one cross-attention
layer with a learned query, then a linear head, trained on tokens computed once.

Tokens: a ViT's (N, 1 + L, D) tokens, cls first, of its last block or of the chosen ``blocks`` (each through
the encoder's final norm, as ``mae.convert.pooling.block_tokens`` gives them), several blocks concatenated
along the feature dimension: (N, 1 + L, len(blocks) * D). A CNN's tokens are the h * w positions of one
stage's map, (N, h * w, C) (its last stage by default); several stages are refused, their maps differing in
width and in size. The encoder runs once over the data; the tokens are kept flat, (N, T * W) rows of a
``FeatureStore`` (in memory, or memory-mapped on disk with ``cache``), and read back in chunks.

Each feature of each token position is standardised with the training split's statistics before the head
(as the linear probe standardises its features, and as MAE's own linear probe puts a BatchNorm without
affine before its head): an MAE's normed tokens share a large offset across images, their differences a
few percent of it, and the head learned little on them raw (measured on the digits with a 2-epoch encoder:
27 % after 10 epochs raw, 92 % standardised).

The head follows V-JEPA's ``AttentiveClassifier`` (its frozen evaluation) as closely as timm's
``AttentionPoolLatent`` allows: a LayerNorm of the tokens (V-JEPA's ``norm1``; ours in front of timm's
module, which has none), one latent query with a query projection, multi-head attention with qkv biases,
an output projection, then a residual MLP (ratio 4, GELU) after a LayerNorm (``norm_layer``), then a linear
layer to the classes. Where it differs: V-JEPA adds the query to the attention's output (``q + attention``),
timm's module does not; and the initialisation is timm's and torch's (the latent query's std 1 / sqrt(W)),
not V-JEPA's (std 0.02 everywhere), whose near-zero query starts from uniform attention and leaves it slowly
in the few hundred steps of a small dataset (measured on the test's marked-token problem, 10 epochs at lr
3e-3: 53 % with V-JEPA's, 96 % with timm's; on the digits both within a point of each other). Attention
heads: the encoder's own (V-JEPA uses ``encoder.num_heads``); a CNN's: its width / 64 (the divisor of the
width nearest to it).

Training as V-JEPA's: AdamW (no weight decay on biases and norms; the decay constant, where V-JEPA lowers
it on a cosine from 1e-3 to 1e-6), the learning rate following a cosine to 0 over ``max_epochs`` without
warm-up, gradients clipped to norm 1. A small grid of learning rates x weight
decays, every head on the same batches from the same initialisation, chosen on a held-out part of the
training split exactly as the linear probe chooses (``mae.eval.probe``: its class-stratified split, each
head's weights of its best held-out accuracy, the stop when no head's held-out loss improves any more);
the validation split is only scored.
"""

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from timm.layers import AttentionPoolLatent
from torch import nn
from torch.nn import functional as F

from mae.convert.pooling import block_tokens, encoder_family, feature_depth, resolve_blocks, timm_cnn
from mae.data import ImageDataModule
from mae.errors import ConfigError
from mae.eval.features import FeatureStore
from mae.eval.probe import (
    LossPlateau,
    check_grid,
    check_training,
    choose_head,
    extract_splits,
    feature_moments,
    holdout_rows,
)
from mae.io.progress import Progress

# V-JEPA's ImageNet evaluation trains at lr 1e-3 (batch 1,024, 25,000 steps); from it up, for the few hundred
# steps of a small dataset (on the digits the held-out images chose 3e-3).
DEFAULT_LRS = (1e-3, 3e-3, 1e-2)
DEFAULT_WEIGHT_DECAYS = (1e-3,)  # V-JEPA's (configs/evals/vitl16_in1k.yaml)
DEFAULT_MAX_EPOCHS = 20  # V-JEPA's
DEFAULT_PATIENCE = 5
DEFAULT_BATCH_SIZE = 64
HEAD_DIM = 64  # a CNN's attention heads: its width / 64, the head width of V-JEPA's ViT-L (1024 / 16)
CHUNK_BYTES = 256 * 2**20  # the token rows read from the store at once


@dataclass(frozen=True)
class AttentiveSettings:
    """An attentive probe's settings, checked when built: the encoder ``blocks`` read (None: the last; a
    ViT's several concatenated along the feature dimension; a CNN's one stage); ``views`` of each training
    image (1: the evaluation view; more: that many with the training augmentation); the (lr, weight decay)
    grid (None: ``DEFAULT_LRS`` / ``DEFAULT_WEIGHT_DECAYS``); the heads' ``max_epochs`` (the cosine
    schedule's length), early-stop ``patience`` and ``batch_size``; the ``holdout`` fraction that chooses
    the head; the ``seed`` of the split, the heads' initialisation and their batches; ``num_heads`` of the
    attention (None: the encoder's, ``default_num_heads``)."""

    blocks: tuple[int, ...] | None = None
    views: int = 1
    lrs: tuple[float, ...] | None = None
    weight_decays: tuple[float, ...] | None = None
    max_epochs: int = DEFAULT_MAX_EPOCHS
    patience: int = DEFAULT_PATIENCE
    holdout: float = 0.1
    seed: int = 0
    batch_size: int = DEFAULT_BATCH_SIZE
    num_heads: int | None = None

    def __post_init__(self) -> None:
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(self.blocks))
        object.__setattr__(self, "lrs", tuple(self.lrs or DEFAULT_LRS))
        weight_decays = DEFAULT_WEIGHT_DECAYS if self.weight_decays is None else self.weight_decays
        object.__setattr__(self, "weight_decays", tuple(weight_decays))
        check_grid(list(self.lrs), list(self.weight_decays))
        check_training(self.max_epochs, self.patience, self.holdout)
        if self.views < 1:
            raise ConfigError(f"probe views must be >= 1, got {self.views}")
        if self.batch_size < 1:
            raise ConfigError(f"the attentive probe's batch size must be >= 1, got {self.batch_size}")
        if self.num_heads is not None and self.num_heads < 1:
            raise ConfigError(f"the attentive probe's attention heads must be >= 1, got {self.num_heads}")


@dataclass
class AttentiveProbeResult:
    lr: float  # the chosen head's
    weight_decay: float
    num_heads: int  # of its attention
    epochs: int  # trained until the held-out accuracy stopped improving
    holdout_acc1: float  # % on the held-out part of the training split (what chose the head)
    val_acc1: float  # % on the validation split
    val_acc5: float
    tokens: tuple[int, int]  # (T, W): the tokens of an image and their width
    grid: list[dict] = field(default_factory=list)  # every head's held-out accuracy

    def __str__(self) -> str:
        return (
            f"attentive probe: top-1 {self.val_acc1:.2f}%, top-5 {self.val_acc5:.2f}% (lr {self.lr:g}, "
            f"weight decay {self.weight_decay:g}, {self.num_heads} attention heads, best after {self.epochs} "
            f"epochs; held-out top-1 {self.holdout_acc1:.2f}%)"
        )


class AttentiveHead(nn.Module):
    """(N, T, W) tokens -> (N, num_classes) logits: a LayerNorm of the tokens, timm's ``AttentionPoolLatent``
    (one learned query, ``num_heads`` heads, a residual MLP), a linear layer (the module's docstring)."""

    def __init__(self, width: int, num_classes: int, num_heads: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.pool = AttentionPoolLatent(
            width,
            num_heads=num_heads,
            mlp_ratio=4.0,
            qkv_bias=True,
            latent_len=1,
            pool_type="token",
            norm_layer=nn.LayerNorm,
        )
        self.linear = nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.linear(self.pool(self.norm(tokens)))


class TokenEncoder:
    """(N, C, H, W) normalised images -> (N, T * W) float: the tokens of ``model``'s ``blocks`` (the module's
    docstring), flattened to rows of a ``FeatureStore``; ``token_shape`` is (T, W) once it has run.

    Raises:
        ConfigError: a block outside the encoder (``mae.convert.pooling.resolve_blocks``); several stages of
            a CNN.
    """

    def __init__(self, model: nn.Module, blocks: Sequence[int] | None = None) -> None:
        self.model, self.family = model, encoder_family(model)
        self.blocks = resolve_blocks(blocks, feature_depth(model))
        if self.family == "cnn" and len(self.blocks) > 1:
            raise ConfigError(
                f"--feature-blocks {list(blocks)}: the attentive probe reads one stage of a CNN (its stages' "
                "maps differ in width and in size, so their positions make no one set of tokens); give one "
                "stage, e.g. --feature-blocks -1"
            )
        self.token_shape: tuple[int, int] | None = None

    def tokens(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, T, W) float."""
        if self.family == "cnn":
            network = timm_cnn(self.model)
            (maps,) = network.forward_intermediates(imgs, indices=self.blocks, intermediates_only=True)
            return maps.flatten(2).transpose(1, 2).float()
        return torch.cat(block_tokens(self.model, imgs, self.blocks), dim=-1).float()

    def __call__(self, imgs: torch.Tensor) -> torch.Tensor:
        tokens = self.tokens(imgs)
        self.token_shape = tuple(tokens.shape[1:])
        return tokens.flatten(1)

    @torch.no_grad()
    def shape_for(self, img_size: int | Sequence[int], in_chans: int, device: torch.device | str) -> tuple:
        """(T, W) of images of ``img_size`` (a side, or (H, W)) with ``in_chans`` channels: one blank image
        run on ``device``, before any real one is read."""
        height, width = (img_size, img_size) if isinstance(img_size, int) else img_size
        return tuple(self.tokens(torch.zeros(1, in_chans, height, width, device=device)).shape[1:])


def default_num_heads(model: nn.Module, width: int) -> int:
    """The attention heads of the probe of ``model``'s tokens of ``width`` features: the encoder's own heads
    (V-JEPA's choice; they divide the width of one block or of several concatenated), else (a CNN) the
    divisor of ``width`` nearest to ``width / HEAD_DIM``."""
    blocks = getattr(model, "blocks", None)
    heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None) if blocks else None
    if isinstance(heads, int) and heads > 0 and width % heads == 0:
        return heads
    target = max(1.0, width / HEAD_DIM)
    return min((d for d in range(1, width + 1) if width % d == 0), key=lambda d: (abs(d - target), d))


def check_num_heads(num_heads: int, width: int) -> None:
    """Raise ``ConfigError`` naming ``--attentive-heads`` where ``num_heads`` does not divide ``width``."""
    if width % num_heads:
        raise ConfigError(
            f"--attentive-heads {num_heads} must divide the tokens' width {width} (the features of the "
            "blocks read, concatenated)"
        )


def evaluate_attentive(
    model: nn.Module,
    data: ImageDataModule,
    settings: AttentiveSettings,
    device: torch.device | str = "cpu",
    cache: str | Path | None = None,
    max_train: int | None = None,
    max_val: int | None = None,
    progress: bool = True,
    announce: Callable[[int, int], None] | None = None,
) -> tuple[AttentiveProbeResult, int, int]:
    """(result, validation images, training views) of the attentive probe on ``model``'s frozen tokens:
    heads trained on ``data``'s training split (a fixed subset of ``max_train`` images when larger), chosen
    on a held-out part of it, scored on its validation split (a fixed subset of ``max_val`` images when
    larger), on ``device``. ``cache``: a file prefix to keep the tokens on disk (memory-mapped) instead of
    in memory (N x T x W float32: 1,600 images of 65 tokens of 192 features are 80 MB). ``progress``: show
    the extraction's and the training's progress on stderr; ``announce``: called with (training images,
    validation images) before any token is computed.

    Raises:
        ConfigError: the data has fewer than 2 classes or no validation split; a block outside the encoder,
            several stages of a CNN; attention heads that do not divide the tokens' width.
    """
    encode = TokenEncoder(model, settings.blocks)  # a bad block fails before any extraction, and bad heads:
    width = encode.shape_for(data.img_size, data.in_chans, device)[1]
    num_heads = settings.num_heads or default_num_heads(model, width)
    check_num_heads(num_heads, width)
    train, val = extract_splits(
        encode,
        data,
        "attentive probe",
        views=settings.views,
        seed=settings.seed,
        device=device,
        cache=cache,
        max_train=max_train,
        max_val=max_val,
        progress=progress,
        announce=announce,
    )
    result = train_attentive_probe(
        train, val, encode.token_shape, data.num_labels, settings, num_heads, device, progress
    )
    return result, len(val), len(train)


def train_attentive_probe(
    train: FeatureStore,
    val: FeatureStore,
    token_shape: tuple[int, int],
    num_classes: int,
    settings: AttentiveSettings,
    num_heads: int,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> AttentiveProbeResult:
    """Train an ``AttentiveHead`` for every (lr, weight decay) of ``settings``' grid on ``train``'s token
    rows ((N, T * W), ``token_shape`` (T, W)), choose one on the held-out images and score it on ``val``
    (the module's docstring). ``progress``: show the epochs' progress on stderr.

    Raises:
        ConfigError: ``num_heads`` does not divide the tokens' width; no image to hold out.
    """
    tokens, width = token_shape
    check_num_heads(num_heads, width)
    generator = np.random.default_rng(settings.seed)
    fit_rows, held_rows = holdout_rows(train, settings.holdout, num_classes, generator)
    batch_size = settings.batch_size
    chunk = batch_size * max(1, CHUNK_BYTES // (batch_size * tokens * width * 4))  # whole batches per chunk
    standardise = _Standardise(*feature_moments(train, fit_rows, chunk), token_shape, device)
    steps = settings.max_epochs * math.ceil(len(fit_rows) / batch_size)
    torch.manual_seed(settings.seed)
    heads = _AttentiveHeads(
        AttentiveHead(width, num_classes, num_heads),
        [(lr, wd) for lr in settings.lrs for wd in settings.weight_decays],
        steps,
        standardise,
    )
    plateau = LossPlateau(len(heads.grid), settings.patience)
    best_epoch = 0
    with Progress(settings.max_epochs, "attentive probe: training the heads", "epochs", progress) as shown:
        for epoch in range(1, settings.max_epochs + 1):
            order = generator.permutation(fit_rows)
            for feats, labels in train.chunks(order, chunk):
                for start in range(0, len(labels), batch_size):
                    x = standardise(feats[start : start + batch_size])
                    heads.step(x, labels[start : start + batch_size].to(device))
            held_acc, _, held_loss = heads.evaluate(train, held_rows, chunk)
            if heads.keep_best(held_acc, held_loss):
                best_epoch = epoch
            shown.update(1)
            if plateau.reached(held_loss):
                break
    return heads.result(val, chunk, best_epoch, num_heads)


class _Standardise:
    """(n, T * W) token rows -> (n, T, W) on ``device``, each feature of each token position standardised
    by the training split's ``mean`` and ``std`` (T * W,)."""

    def __init__(
        self, mean: torch.Tensor, std: torch.Tensor, token_shape: tuple[int, int], device: torch.device | str
    ) -> None:
        self.mean, self.std = mean.to(device), std.to(device)
        self.token_shape, self.device = token_shape, device

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(self.device, torch.float32)
        return ((rows - self.mean) / self.std).view(-1, *self.token_shape)


class _AttentiveHeads:
    """The heads of a grid of (lr, weight decay), each a copy of ``template`` (the same initialisation), each
    with its AdamW and cosine schedule over ``steps``; each keeps its weights of its best held-out accuracy
    (ties: lower held-out loss)."""

    def __init__(
        self,
        template: AttentiveHead,
        grid: list[tuple[float, float]],
        steps: int,
        standardise: "_Standardise",
    ) -> None:
        self.grid, self.standardise = grid, standardise
        self.heads = [copy.deepcopy(template).to(standardise.device) for _ in grid]
        self.optimizers = [_adamw(head, lr, wd) for head, (lr, wd) in zip(self.heads, grid, strict=True)]
        self.schedules = [torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) for opt in self.optimizers]
        self.best_acc = torch.full((len(grid),), -1.0)
        self.best_loss = torch.full((len(grid),), math.inf)
        self.best_state = [copy.deepcopy(head.state_dict()) for head in self.heads]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One step of every head on tokens ``x`` (n, T, W) with labels ``y`` (n,)."""
        for head, optimizer, schedule in zip(self.heads, self.optimizers, self.schedules, strict=True):
            head.train()
            loss = F.cross_entropy(head(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(head.parameters(), 1.0)  # V-JEPA's
            optimizer.step()
            schedule.step()

    @torch.no_grad()
    def evaluate(
        self, store: FeatureStore, rows: np.ndarray, chunk: int, heads: list[AttentiveHead] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(top-1 %, top-5 %, mean cross-entropy) of every head (or of ``heads``) on ``rows``, (H,) each."""
        heads = self.heads if heads is None else heads
        correct1, correct5, loss = (torch.zeros(len(heads)) for _ in range(3))
        for feats, labels in store.chunks(rows, chunk):
            x, labels = self.standardise(feats), labels.to(self.standardise.device)
            for index, head in enumerate(heads):
                head.eval()
                logits = head(x)
                top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
                correct1[index] += float((top[:, 0] == labels).sum())
                correct5[index] += float((top == labels[:, None]).any(-1).sum())
                loss[index] += float(F.cross_entropy(logits, labels, reduction="sum"))
        count = max(len(rows), 1)
        return 100 * correct1 / count, 100 * correct5 / count, loss / count

    def keep_best(self, held: torch.Tensor, held_loss: torch.Tensor) -> bool:
        """Keep each head's weights where its held-out accuracy ``held`` (H,) improved (ties: lower loss);
        whether the head chosen now (``choose_head``) improved."""
        improved = (held > self.best_acc) | ((held == self.best_acc) & (held_loss < self.best_loss))
        for index in np.flatnonzero(improved.numpy()):
            self.best_state[index] = copy.deepcopy(self.heads[index].state_dict())
        self.best_acc = torch.where(improved, held, self.best_acc)
        self.best_loss = torch.where(improved, held_loss, self.best_loss)
        return bool(improved[choose_head(self.best_acc, self.best_loss)])

    def result(self, val: FeatureStore, chunk: int, epochs: int, num_heads: int) -> AttentiveProbeResult:
        """The chosen head's settings and accuracies, scored on ``val``, after ``epochs`` epochs."""
        choice = choose_head(self.best_acc, self.best_loss)
        chosen = self.heads[choice]
        chosen.load_state_dict(self.best_state[choice])
        top1, top5, _ = self.evaluate(val, np.arange(len(val)), chunk, [chosen])
        grid = [
            {"lr": lr, "weight_decay": wd, "holdout_acc1": float(acc)}
            for (lr, wd), acc in zip(self.grid, self.best_acc, strict=True)
        ]
        lr, wd = self.grid[choice]
        return AttentiveProbeResult(
            lr,
            wd,
            num_heads,
            epochs,
            float(self.best_acc[choice]),
            float(top1[0]),
            float(top5[0]),
            self.standardise.token_shape,
            grid,
        )


def _adamw(head: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW on ``head``, weight decay on its matrices (and the latent query) alone, as V-JEPA's."""
    decayed = [p for name, p in head.named_parameters() if p.ndim > 1 and not name.endswith("bias")]
    plain = [p for name, p in head.named_parameters() if p.ndim <= 1 or name.endswith("bias")]
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr)
