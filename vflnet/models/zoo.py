"""Bottom models (one per feature-holding party) and the active party's top model, from config.

Every model kind (the ``kind:`` of a model block) is a :class:`ModelKind` registered in
`vflnet.registry.MODELS`, here or in a config's ``plugins:`` module; it says whether it can be a
bottom and/or a top model and whether a bottom takes image regions, and config validation and
`vflnet.data.partition` read those attributes.

An input-layer cut (paper 000) is a ``linear`` bottom with ``bias: false`` on every party,
``aggregation: sum`` and a top model whose ``input_activation`` is the first layer's nonlinearity:
the sum of the parties' column blocks is exactly the first layer of the joint network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vflnet.config import BY_MODEL_KIND, Config, ModelConfig, PartyConfig
from vflnet.registry import MODELS

# the model block keys a kind may declare it reads (the others are read whatever the kind)
MODEL_KEYS = frozenset(
    f.name for f in dataclasses.fields(ModelConfig) if f.metadata["reads"] is BY_MODEL_KIND
)


@dataclass(frozen=True)
class ModelKind:
    """A model kind: how it is built and where it may sit."""

    name: str
    description: str
    # (block, input shape without the batch axis: (d,) or (1, h, w)) -> the bottom model; None: not a bottom
    build_bottom: Callable[[ModelConfig, tuple[int, ...]], nn.Module] | None = None
    # (block, aggregate width, number of classes) -> the top model's network; None: not a top
    build_top: Callable[[ModelConfig, int, int], nn.Module] | None = None
    image_input: bool = False  # as a bottom it takes [n, 1, h, w] image regions (needs `features.region`)
    # The model block keys its builders read besides `kind` (and a bottom's `out`): `hidden`, `channels`,
    # `activation`, `bias`, `dropout`, `shift`, `init` ... A key set on a block of a kind that does not
    # list it would have no effect, and the config check refuses it (`vflnet.config.by_model_kind`).
    reads: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = sorted(self.reads - MODEL_KEYS)
        if unknown:
            raise ValueError(
                f"model kind {self.name!r} declares it reads {unknown}, which are not model block keys; "
                f"those are: {sorted(MODEL_KEYS)}"
            )

    @property
    def is_bottom(self) -> bool:
        return self.build_bottom is not None

    @property
    def is_top(self) -> bool:
        return self.build_top is not None

    @property
    def where(self) -> str:
        """Where it may sit, as `vflnet models` lists it."""
        sits = [w for w, ok in (("bottom", self.is_bottom), ("top", self.is_top)) if ok]
        return ", ".join(sits) + ("; image regions" if self.image_input else "")


_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


def own_generator() -> torch.Generator:
    """A model part's own source of randomness (dropout masks, random shifts), seeded with a draw from
    the generator it is built under (``build_party_modules``: the party's seed). Its draws then do not
    depend on what else draws in the same process, or in which thread order: the loopback bridge and
    the reference trainer run every party in one process, and a run is bit-identical on every bridge.
    ``LocalModel.state`` keeps it, so a resumed run continues it."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,))))


class SeededDropout(nn.Dropout):
    """``nn.Dropout`` drawing its masks from its own generator (``own_generator``)."""

    def __init__(self, p: float) -> None:
        super().__init__(p)
        self.generator = own_generator()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.empty_like(x).bernoulli_(1 - self.p, generator=self.generator)
        return x * keep / (1 - self.p)


def _mlp(
    in_dim: int, hidden: list[int], out: int, activation: str, bias: bool = True, dropout: float = 0.0
) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), _ACTIVATIONS[activation]()]
        if dropout > 0:  # only then: the layer indices (parameter names) stay those of a plain MLP
            layers.append(SeededDropout(dropout))
        in_dim = width
    layers.append(nn.Linear(in_dim, out, bias=bias))
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    """Conv -> ReLU -> (pool) blocks over one image region, then a linear embedding."""

    def __init__(self, in_shape: tuple[int, int, int], channels: list[int], out: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        c, h, w = in_shape
        for width in channels:
            blocks += [nn.Conv2d(c, width, kernel_size=3, padding=1), nn.ReLU()]
            if min(h, w) >= 4:  # pool only while the region is big enough to stay non-empty
                blocks.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
            c = width
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(c * h * w, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class _BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv + BN, identity (or 1x1 conv + BN) shortcut, ReLU after the sum."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A ResNet (He et al.) on a small image: a 3x3 conv + BN + ReLU stem of ``channels[0]`` maps (then a
    3x3 stride-2 max-pool with ``stem_pool``), ``blocks`` basic blocks per ``channels`` width (stride 2
    from the second width on), global average pooling, then a linear embedding, as ResNet18's ``fc``.
    The defaults are paper 001's ResNet18 scaled down for CPU runs; :func:`resnet18` is the full one."""

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        channels: list[int],
        out: int,
        shift: int = 0,
        blocks: int = 1,
        stem_pool: bool = False,
    ) -> None:
        super().__init__()
        self.shift = shift
        self.generator = own_generator() if shift > 0 else None
        c = channels[0]
        stem: list[nn.Module] = [
            nn.Conv2d(in_shape[0], c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
        ]
        if stem_pool:
            stem.append(nn.MaxPool2d(3, stride=2, padding=1))
        self.stem = nn.Sequential(*stem)
        stages: list[nn.Module] = []
        for i, width in enumerate(channels):
            for j in range(blocks):
                stages.append(_BasicBlock(c, width, 2 if i > 0 and j == 0 else 1))
                c = width
        self.blocks = nn.Sequential(*stages)
        self.head = nn.Linear(c, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.generator is not None:
            x = random_shift(x, self.shift, self.generator)
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def resnet18(in_shape: tuple[int, int, int], out: int, shift: int = 0) -> SmallResNet:
    """ResNet18 as paper 001's reference code adapts torchvision's to small images: ``conv1`` a 3x3,
    stride-1 conv (no bias), then BN, ReLU and the 3x3 stride-2 max-pool; four stages of two basic
    blocks of 64, 128, 256 and 512 maps; ``fc`` to ``out``. Randomly initialised: the ImageNet weights
    the reference code loads cannot be downloaded here."""
    return SmallResNet(in_shape, [64, 128, 256, 512], out, shift, blocks=2, stem_pool=True)


def random_shift(x: torch.Tensor, s: int, generator: torch.Generator) -> torch.Tensor:
    """Each image [n, c, h, w] translated by its own random (dy, dx) in [-s, s]^2, zero fill."""
    n, _, h, w = x.shape
    padded = nn.functional.pad(x, (s, s, s, s))
    dy, dx = torch.randint(0, 2 * s + 1, (2, n), generator=generator).tolist()
    return torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])


def cafe_config(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    n_workers: int = 1,
    n_classes: int = 10,
    top_softmax: bool = False,
) -> Any:
    """The CAFE paper's worker model (paper 002) for one image region: `channels` are its two conv
    widths, `hidden` its [fc1, fc2] widths, `out` the worker output size; ``top_softmax``: the top's
    outputs go through a softmax before the loss (``model.top.output_activation: softmax``)."""
    from vflnet.models.cafe_net import CafeNetConfig

    fc1, fc2 = (cfg.hidden + [256, 64])[:2] if len(cfg.hidden) < 2 else cfg.hidden[:2]
    return CafeNetConfig(
        kind="conv" if cfg.kind == "cafe-conv" else "fc",
        n_workers=n_workers,
        region_shape=tuple(input_shape),
        n_classes=n_classes,
        conv_channels=tuple(cfg.channels[:2]),
        fc1_out=fc1,
        fc2_out=fc2,
        worker_out=cfg.out,
        top_softmax=top_softmax,
    )


def build_bottom(cfg: ModelConfig, input_shape: tuple[int, ...]) -> nn.Module:
    """``input_shape`` excludes the batch axis: (d,) for flat features, (1, h, w) for image regions."""
    kind = MODELS.get(cfg.kind)
    if kind.build_bottom is None:
        raise ValueError(f"model kind {cfg.kind!r} cannot be a bottom model")
    return kind.build_bottom(cfg, input_shape)


class TopModel(nn.Module):
    """The active party's model over the aggregated embedding; ``none`` is the identity (paper 004)."""

    def __init__(self, cfg: ModelConfig, in_dim: int, n_classes: int) -> None:
        super().__init__()
        self.input_activation = (
            _ACTIVATIONS[cfg.input_activation]() if cfg.input_activation != "none" else nn.Identity()
        )
        kind = MODELS.get(cfg.kind)
        if kind.build_top is None:
            raise ValueError(f"model kind {cfg.kind!r} cannot be a top model")
        self.net: nn.Module = kind.build_top(cfg, in_dim, n_classes)
        self.output_softmax = cfg.output_activation == "softmax"

    def forward(self, aggregate: torch.Tensor) -> torch.Tensor:
        out = self.net(self.input_activation(aggregate))
        return torch.softmax(out, dim=1) if self.output_softmax else out


def _cafe_bottom(cfg: ModelConfig, input_shape: tuple[int, ...]) -> nn.Module:
    from vflnet.models.cafe_net import CafeBottom

    return CafeBottom(cafe_config(cfg, input_shape))


MODELS.register(
    ModelKind(
        "none",
        "no model: the top passes the aggregate through (its width must equal the number of classes)",
        build_top=lambda cfg, in_dim, n_classes: nn.Identity(),
    )
)
MODELS.register(
    ModelKind(
        "linear",
        "one linear layer (`bias`); an input-layer cut uses it with bias: false",
        build_bottom=lambda cfg, shape: nn.Linear(shape[0], cfg.out, bias=cfg.bias),
        build_top=lambda cfg, in_dim, n_classes: nn.Linear(in_dim, n_classes, bias=cfg.bias),
        reads=frozenset({"bias", "init"}),
    )
)
MODELS.register(
    ModelKind(
        "mlp",
        "linear layers of widths `hidden` with `activation` between them, then a linear output (`bias`)",
        build_bottom=lambda cfg, shape: _mlp(
            shape[0], cfg.hidden, cfg.out, cfg.activation, cfg.bias, cfg.dropout
        ),
        build_top=lambda cfg, in_dim, n_classes: _mlp(
            in_dim, cfg.hidden, n_classes, cfg.activation, cfg.bias, cfg.dropout
        ),
        reads=frozenset({"hidden", "activation", "bias", "dropout", "init"}),
    )
)
MODELS.register(
    ModelKind(
        "cnn",
        "3x3 conv + ReLU per `channels` width (2x2 max-pool while the region is >= 4 px), then a linear embedding",
        build_bottom=lambda cfg, shape: SmallCNN(shape, cfg.channels, cfg.out),  # type: ignore[arg-type]
        image_input=True,
        reads=frozenset({"channels", "init"}),
    )
)
MODELS.register(
    ModelKind(
        "resnet-small",
        "a small ResNet: 3x3 conv + BN stem, one residual basic block (two 3x3 conv + BN) per `channels` width, stride 2 from the second, global average pool, linear embedding; `shift`: random translation in training",
        build_bottom=lambda cfg, shape: SmallResNet(shape, cfg.channels, cfg.out, cfg.shift),  # type: ignore[arg-type]
        image_input=True,
        reads=frozenset({"channels", "shift", "init"}),
    )
)
MODELS.register(
    ModelKind(
        "resnet18",
        "ResNet18 (paper 001's bottom): 3x3 conv + BN + ReLU + 3x3 max-pool stem, two basic blocks each of 64, 128, 256, 512 maps, global average pool, linear embedding; random init; `shift` as resnet-small",
        build_bottom=lambda cfg, shape: resnet18(shape, cfg.out, cfg.shift),  # type: ignore[arg-type]
        image_input=True,
        reads=frozenset({"shift", "init"}),
    )
)
MODELS.register(
    ModelKind(
        "cafe-conv",
        "the CAFE paper's conv worker model (paper 002): `channels` two conv widths, `hidden` [fc1, fc2]",
        build_bottom=_cafe_bottom,
        image_input=True,
        reads=frozenset({"channels", "hidden", "init"}),
    )
)
MODELS.register(
    ModelKind(
        "cafe-fc",
        "the CAFE paper's fully connected worker model (paper 002): `hidden` [fc1, fc2]",
        build_bottom=_cafe_bottom,
        image_input=True,
        reads=frozenset({"hidden", "init"}),
    )
)


def aggregate(embeddings: list[torch.Tensor], how: str) -> torch.Tensor:
    """Concatenate along features (``concat``) or add (``sum``), in aggregation order."""
    if how == "concat":
        return torch.cat(embeddings, dim=1)
    if how == "sum":
        return torch.stack(embeddings).sum(dim=0)
    raise ValueError(f"unknown aggregation {how!r}")


def build_party_modules(
    cfg: Config, party: PartyConfig, input_shape: tuple[int, ...] | None, n_classes: int
) -> tuple[nn.Module | None, TopModel | None]:
    """A party's bottom model (if it holds features) and, for the active party, the top model.

    Built under the party's own seed in a fixed order so the distributed run and the in-process
    reference start from identical parameters."""
    from vflnet.data.partition import party_seed

    torch.manual_seed(party_seed(cfg, party))
    bottom = build_bottom(party.bottom, input_shape) if party.bottom is not None and input_shape else None
    if bottom is not None and party.bottom is not None and input_shape is not None:
        if party.bottom.init == "keras":
            keras_init(bottom)
        bottom = defended_bottom(cfg, party, bottom, int(input_shape[0]), party.bottom.out)
    top = None
    if party.role == "active":
        outs = [p.bottom.out for p in cfg.feature_parties if p.bottom is not None]
        in_dim = outs[0] if cfg.protocol.aggregation == "sum" else sum(outs)
        top = TopModel(cfg.model.top, in_dim, n_classes)
        if cfg.model.top.init == "keras":
            keras_init(top)
    return bottom, top


def keras_init(module: nn.Module) -> None:
    """Keras's default initialisation (the CAFE authors' TensorFlow model, paper 002): Glorot-uniform
    weights (fans over the receptive field, as Keras counts them) and zero biases in every linear and
    conv layer; drawn from torch's global generator after the layers' own initialisation."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear | nn.Conv2d):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def defended_bottom(
    cfg: Config, party: PartyConfig, bottom: nn.Module, in_dim: int, out_dim: int
) -> nn.Module:
    """The bottom model as the party's bottom defenses (paper 000: embedding-noise, masquerade) make it,
    in config order; built under the party's seed, like the bottom itself."""
    from vflnet.defenses.base import attach_bottom

    for wrap in attach_bottom(cfg, party.name):
        bottom = wrap(bottom, in_dim, out_dim)
    return bottom


class SplitTable(nn.Module):
    """A SecureBoost party's split table (protocol `secureboost`): split id -> (feature, threshold), as
    float32 buffers so checkpoints and model releases (float32 tensors) carry it: feature indices are
    exact in float32, and thresholds are values of the party's float32 features. No trainable parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("feature", torch.zeros(0))
        self.register_buffer("threshold", torch.zeros(0))

    def set(self, features: list[int], thresholds: list[float]) -> None:
        self.feature = torch.tensor(features, dtype=torch.float32)
        self.threshold = torch.tensor(thresholds, dtype=torch.float32)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # the table grows with every split: take the saved length (a resumed run's checkpoint)
        for name in ("feature", "threshold"):
            if prefix + name in state_dict:
                setattr(self, name, torch.zeros_like(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, *args)


MODELS.register(
    ModelKind(
        "splits",
        "a SecureBoost party's split table (protocol secureboost): split id -> (feature, threshold); `out`: the number of classes (no embedding)",
        build_bottom=lambda cfg, shape: SplitTable(),
    )
)
