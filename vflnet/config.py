"""Run configuration: the schema (typed sections), strict YAML parsing, and one clear error per mistake.

Every section is a dataclass; :func:`parse` walks the YAML against the annotations and rejects an
unknown key, a wrong type or a bad value with a :class:`ConfigError` that names the file, the dotted
key and what was expected, then runs the checks that need nothing but the config itself
(:func:`validate`). Every field carries a one-line ``help`` (see :func:`setting`) from which
docs/config.md is generated (``vflnet config docs``), and declares who reads it and under what
condition (``reads``): every key a file or an override sets (``Config.given``) must be read in that
config, or :func:`unread_keys` names it with the reason (checked by `vflnet.validation`). A mapping
that repeats a key is refused with both lines (:func:`load_yaml`).

This module imports nothing else from vflnet. The checks against the registries (plug-in modules,
attack/defense/dataset/model names and parameters) and against the dataset's shape live one level up,
in :mod:`vflnet.validation`: load a config with ``vflnet.validation.load_config``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

NO_MODEL = "none"  # the model kind that means "no model here" (a top that passes the aggregate through)


class ConfigError(ValueError):
    def __init__(self, source: str, key: str, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        where = f"{source}: " if source else ""
        super().__init__(f"{where}key '{key}': {message}" if key else f"{where}{message}")


# ------------------------------------------------------------------------------- who reads a key
@dataclass(frozen=True)
class Judged:
    """One field of one config being judged: the config, the section object that holds the field, the
    section's dotted key (``train.optimizer``, ``parties[2].bottom``), the field's name, and the command
    the config is loaded for (``run``: `vflnet run`; ``party``: `vflnet party`; None: any)."""

    cfg: Config
    section: Any
    prefix: str
    name: str
    launcher: str | None = None

    @property
    def value(self) -> Any:
        return getattr(self.section, self.name)

    def key(self, name: str) -> str:
        """The dotted key of a sibling field."""
        return f"{self.prefix}.{name}" if self.prefix else name


@dataclass(frozen=True)
class When:
    """A condition under which a key is read: ``test(judged)`` is None when the key is read in that
    config, else a sentence saying why not and what would read it; ``doc`` says the condition in
    docs/config.md ("when `kind` is `momentum`")."""

    doc: str
    test: Callable[[Judged], str | None]


def condition(doc: str) -> Callable[[Callable[[Judged], str | None]], When]:
    """Decorator: a test function as a :class:`When` documented by ``doc``."""
    return lambda test: When(doc, test)


@dataclass(frozen=True)
class Reads:
    """Who reads a schema field (``reader``), and when (``when``; None: whenever the run has it). The
    condition of a section-valued field holds for every key under it."""

    reader: str
    when: When | None = None

    def why_unread(self, judged: Judged) -> str | None:
        return self.when.test(judged) if self.when is not None else None


def _shown(value: Any) -> str:
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def sibling(name: str, *values: Any) -> When:
    """Read only while the sibling field ``name`` has one of ``values`` (an optimizer kind, a switch)."""

    def test(j: Judged) -> str | None:
        actual = getattr(j.section, name)
        if actual in values:
            return None
        wanted = " or ".join(repr(v) for v in values)
        return f"{j.key(name)} is {actual!r}, which does not read it; read when {name} is {wanted}"

    return When(f"when `{name}` is " + " or ".join(_shown(v) for v in values), test)


def all_of(*conditions: When) -> When:
    def test(j: Judged) -> str | None:
        return next((why for c in conditions if (why := c.test(j)) is not None), None)

    return When(" and ".join(c.doc for c in conditions), test)


def _registry(name: str) -> dict[str, Any]:
    """The entries of a registry (``PROTOCOLS``, ``MODELS``) by name. Imported when a condition is
    evaluated (after the config check imported the plug-ins), not with this module: parsing a config
    imports nothing else from vflnet."""
    import vflnet.registry

    return getattr(vflnet.registry, name).all()  # type: ignore[no-any-return]


def _protocol(cfg: Config) -> Any:
    """The registry entry of the config's protocol; None if it is not registered (refused elsewhere)."""
    return _registry("PROTOCOLS").get(cfg.protocol.kind)


def by_protocol(declaration: str) -> When:
    """Read only under protocols whose ``declaration`` (a `Protocol` ClassVar: ``settings``,
    ``train_reads``) lists the field's name."""

    def test(j: Judged) -> str | None:
        protocol = _protocol(j.cfg)
        if protocol is None or j.name in getattr(protocol, declaration):
            return None
        readers = [n for n, p in _registry("PROTOCOLS").items() if j.name in getattr(p, declaration)]
        return (
            f"protocol {protocol.name!r} does not read {j.key(j.name)} (its `Protocol.{declaration}`); "
            f"protocols that do: {readers or 'none'}"
        )

    return When(f"under a protocol whose `Protocol.{declaration}` lists it (protocols table)", test)


@condition("under a protocol that trains on a device (`Protocol.trains_on_device`), never on the coordinator")
def _on_device(j: Judged) -> str | None:
    if isinstance(j.section, PartyConfig) and j.section.role == "coordinator":
        return "the coordinator trains no model; set devices on the parties"
    protocol = _protocol(j.cfg)
    if protocol is None or protocol.trains_on_device:
        return None
    readers = [n for n, p in _registry("PROTOCOLS").items() if p.trains_on_device]
    return f"protocol {protocol.name!r} trains on the CPU only; protocols that train on a device: {readers}"


@condition("by the model kinds whose `ModelKind.reads` lists it (model kinds table)")
def by_model_kind(j: Judged) -> str | None:
    kinds = _registry("MODELS")
    kind = kinds.get(j.section.kind)
    if kind is None or j.name in kind.reads:
        return None
    readers = [n for n, k in kinds.items() if j.name in k.reads]
    return (
        f"model kind {j.section.kind!r} does not read it (its `ModelKind.reads`); model kinds that do: "
        f"{readers or 'none'}"
    )


BY_MODEL_KIND = Reads("the model kinds that declare it (`ModelKind.reads`)", by_model_kind)


@condition("on the top model (`model.top`) only")
def _top_only(j: Judged) -> str | None:
    if j.prefix == "model.top":
        return None
    return "a bottom model does not read it; it applies to the top model only (model.top)"


@condition("on bottom models only")
def _bottom_only(j: Judged) -> str | None:
    if j.prefix != "model.top":
        return None
    return "the top model's output width is the number of classes; `out` is read on bottom models"


def _launcher_sets(what: str, doc: str, read: Callable[[Judged], bool]) -> When:
    """A per-party key `vflnet run` sets itself: a value it does not take (``read`` false) would be
    replaced by the launcher's, so it is refused when the config is loaded for `vflnet run`."""

    def test(j: Judged) -> str | None:
        if j.launcher != "run" or read(j):
            return None
        return (
            f"`vflnet run` {what}, so {j.value!r} would have no effect; `vflnet party` (deployments) reads it"
        )

    return When(doc, test)


_launcher_ignores_address = _launcher_sets(
    "serves every party on a free loopback port (empty address)",
    "by `vflnet party`; under `vflnet run` only empty (it picks a free loopback port)",
    lambda j: j.value == "",
)
_launcher_ignores_via = _launcher_sets(
    "takes `via: proxy` (a proxy it starts in front of a party, never the coordinator) or nothing",
    "`HOST:PORT` by `vflnet party`; under `vflnet run` only `proxy`, on a party (not the coordinator)",
    lambda j: j.value == "" or (j.value == "proxy" and j.section.role != "coordinator"),
)


@condition("when `bridge` is `grpc`")
def _over_grpc(j: Judged) -> str | None:
    if j.cfg.transport.bridge == "grpc":
        return None
    return (
        f"transport.bridge is {j.cfg.transport.bridge!r}: messages stay in one process, with no sockets, TLS, "
        "chunking, server limits or heartbeats; read when bridge is 'grpc'"
    )


@condition("when `transport.bridge` is `grpc`, under a protocol with `Protocol.resumable`")
def _resumable(j: Judged) -> str | None:
    if j.cfg.transport.bridge != "grpc":
        return f"transport.bridge is {j.cfg.transport.bridge!r}: a loopback run never resumes; read when it is 'grpc'"
    protocol = _protocol(j.cfg)
    if protocol is None or protocol.resumable:
        return None
    return f"protocol {protocol.name!r} cannot resume (its `Protocol.resumable`)"


@condition("when `transport.heartbeat_s` > 0")
def _heartbeats_on(j: Judged) -> str | None:
    if j.cfg.transport.heartbeat_s > 0:
        return None
    return (
        "transport.heartbeat_s is 0 (heartbeats off), so no peer is ever declared dead; read when it is > 0"
    )


@condition("when `train.eval_every` > 0")
def _evaluated(j: Judged) -> str | None:
    if j.cfg.train.eval_every > 0:
        return None
    return "train.eval_every is 0 (the run never evaluates); read when it is > 0"


@condition("when `trace.parties` names a party")
def _traced(j: Judged) -> str | None:
    if j.cfg.trace.parties:
        return None
    return "trace.parties is empty (nothing is recorded); read when it names a party"


@condition("on the active and passive parties")
def _not_coordinator(j: Judged) -> str | None:
    if j.section.role != "coordinator":
        return None
    return "the coordinator loads no data; read on the active and passive parties"


@condition("unless every party reads its own file (`source`)")
def _dataset_loaded(j: Judged) -> str | None:
    if not j.cfg.sources:
        return None
    return "every party reads its own file (`parties[].source`); read when the parties load the dataset"


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    reads: str | Reads,
    factory: Callable[[], Any] | None = None,
    shown: str | None = None,
) -> Any:
    """A schema field with its one-line help for docs/config.md and who reads it: ``reads`` is the
    reader's name (it reads the key whenever the run has it) or a :class:`Reads` with the condition
    under which it does. A key a user sets that is not read in their config is refused
    (:func:`unread_keys`). ``shown`` overrides how its default is written in the docs (e.g. "required")."""
    metadata: dict[str, Any] = {"help": help, "reads": reads if isinstance(reads, Reads) else Reads(reads)}
    if shown is not None:
        metadata["shown"] = shown
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# ---------------------------------------------------------------------------------------- sections
@dataclass
class RunConfig:
    """Identity and seeding of a run."""

    id: str = setting(
        "",
        "run id; every message carries it. Empty: `vflnet run` uses `<file stem>-<time>`. "
        "Required when parties are started one by one.",
        reads="the launcher and every message header",
    )
    dir: str = setting("runs", "parent folder of run directories", reads="every process (its run directory)")
    auto_resume: int = setting(
        0,
        "times `vflnet run` resumes the run by itself, from its newest checkpoint, after a process died "
        "or the run failed (docs/reliability.md); 0: stop and print the `vflnet run --resume` command",
        reads=Reads("the `vflnet run` launcher", _resumable),
    )
    seed: int = setting(
        0,
        "seeds model initialisation (per party: `seed*1000 + roster index`), the train/test split "
        "and the batch schedule",
        reads="every party (model initialisation) and the coordinator (split, batches)",
    )


@dataclass
class ProtocolConfig:
    """How the parties train together."""

    kind: str = setting(
        "split",
        "a registered protocol; the protocols table below lists each with its methods, defense hook points "
        "and settings",
        reads="every process (the protocol registry)",
    )
    aggregation: Literal["concat", "sum"] = setting(
        "concat",
        "`concat` (concatenate embeddings, then the top model) or `sum` (add them)",
        reads=Reads("the protocols that declare it (`Protocol.settings`)", by_protocol("settings")),
    )
    params: dict[str, Any] = setting(
        factory=dict,
        help="the protocol's own settings, declared by its contract (`Protocol.params`; the protocols "
        "table below) and checked by it",
        reads="the protocol's contract (`Protocol.params`)",
    )


@dataclass
class DataConfig:
    """The dataset every party loads its own columns and IDs of (only the active party keeps labels)."""

    dataset: str = setting(
        "digits",
        "a registered dataset (table below; `vflnet datasets`)",
        reads=Reads("every party's data loader", _dataset_loaded),
    )
    params: dict[str, Any] = setting(
        factory=dict,
        help="the dataset's parameters (table below)",
        reads=Reads("every party's data loader (the dataset's contract)", _dataset_loaded),
    )
    test_fraction: float = setting(
        0.2, "held-out share of the aligned IDs", reads="the coordinator's train/test split"
    )
    normalize: Literal["auto", "none", "standard", "minmax"] = setting(
        "auto",
        "`auto` (images: none, already in [0,1]; tabular: standard), `none`, `standard`, `minmax`; "
        "each party uses statistics of its own training rows only",
        reads="every party's data loader",
    )
    permute_labels: int | None = setting(
        None,
        "an empirical null: the labels permuted among the samples with this seed as the active party loads "
        "them (the secret removed; attacks are still scored against the true labels; `vflnet audit --null`)",
        reads="the active party's data loader",
    )
    resample_features: int | None = setting(
        None,
        "an empirical null: each passive party's feature columns (pixels) permuted among the samples, each "
        "on its own, with this seed (draws from their marginals) as the party loads them (the secret removed; "
        "attacks are still scored against the true features; `vflnet audit --null`)",
        reads="every passive party's data loader",
    )
    allow_overlap: bool = setting(
        False,
        "let parties hold some of the same feature columns or pixels (refused by default: vertical "
        "partitions are disjoint, and an overlap is usually a typo in `features`)",
        reads="the config check of the parties' features",
    )


@dataclass
class FeaturesConfig:
    columns: str | list[int] | None = setting(
        None, 'flat column indices: `"0:32"`, `"0:8,16:24"` or a list', reads="the party's data loader"
    )
    region: list[int] | None = setting(
        None, "image rectangle `[row0, row1, col0, col1]` (half-open)", reads="the party's data loader"
    )


@dataclass
class ModelConfig:
    """A model block: `kind` is a registered model kind (table below; `vflnet models`), the other keys
    are read by the kinds that use them.

    An **input-layer cut** (paper 000): every party's bottom is `{kind: linear, bias: false, out: H}`,
    `aggregation: sum`, and `model.top: {kind: mlp, input_activation: relu, ...}` — the sum of the
    column blocks is the first layer of the joint network, its bias and activation live at the active party."""

    kind: str = setting(
        "mlp", "a model kind that can sit here (bottom or top; table below)", reads="the model registry"
    )
    hidden: list[int] = setting(
        factory=list,
        help="hidden layer widths (mlp; cafe-*: [fc1, fc2])",
        reads=BY_MODEL_KIND,
    )
    out: int = setting(
        0,
        "bottom: embedding size (required); top: ignored (number of classes)",
        reads=Reads("every bottom model (the embedding width) and the aggregation", _bottom_only),
    )
    bias: bool = setting(
        True,
        "bias on the last linear layer",
        reads=BY_MODEL_KIND,
    )
    activation: Literal["relu", "tanh", "sigmoid"] = setting(
        "relu",
        "nonlinearity between hidden layers",
        reads=BY_MODEL_KIND,
    )
    dropout: float = setting(
        0.0,
        "mlp: dropout rate after each hidden layer (paper 003's countermeasure)",
        reads=BY_MODEL_KIND,
    )
    channels: list[int] = setting(
        factory=lambda: [8, 16],
        help="conv widths (cnn; cafe-conv: its two conv layers)",
        reads=BY_MODEL_KIND,
    )
    shift: int = setting(
        0,
        "resnet-small, resnet18: in training only, shift each image by up to this many pixels (zero fill)",
        reads=BY_MODEL_KIND,
    )
    input_activation: Literal["none", "relu", "tanh", "sigmoid"] = setting(
        "none",
        "top only: nonlinearity applied to the aggregate first",
        reads=Reads("the top model", _top_only),
    )
    output_activation: Literal["none", "softmax"] = setting(
        "none",
        "top only: `softmax` turns the top's outputs into probabilities that the loss then treats as "
        "logits, a second softmax (the CAFE authors' victim model, paper 002)",
        reads=Reads("the top model", _top_only),
    )
    init: Literal["torch", "keras"] = setting(
        "torch",
        "parameter initialisation: torch's defaults, or `keras`: Glorot-uniform weights and zero biases "
        "in every linear and conv layer (the CAFE authors' TensorFlow model)",
        reads=BY_MODEL_KIND,
    )


@condition("on a party without a `source` (the built-in dataset's rows)")
def _no_source(j: Judged) -> str | None:
    if j.section.source is None:
        return None
    return "the party reads its own rows from its `source`; read on a party without one"


@condition("on the active party")
def _active_source(j: Judged) -> str | None:
    party = next((p for p in j.cfg.parties if p.source is j.section), None)
    if party is not None and party.role == "active":
        return None
    return "only the active party holds labels; a passive party's file has no label column"


@dataclass
class SourceConfig:
    """A party's own table: a CSV (or Parquet, with pyarrow) file that only this party's process opens."""

    path: str = setting(
        "",
        "the party's file (`.csv`, or `.parquet` with pyarrow installed)",
        shown="required",
        reads="the party's data loader",
    )
    id_column: str = setting(
        "id",
        "the column of sample IDs (strings or integers, compared as text); alignment matches them across parties",
        reads="the party's data loader",
    )
    features: list[str] = setting(
        factory=list,
        help="the feature columns (numbers, no NaN), in this order; empty: a featureless active party",
        reads="the party's data loader",
    )
    label_column: str = setting(
        "",
        "the column of labels (active party only; required there)",
        reads=Reads("the active party's data loader", _active_source),
    )


@dataclass
class AlignmentConfig:
    """How the parties find their common samples before training (docs/protocols.md, Alignment)."""

    method: Literal["plain", "hashed", "psi"] = setting(
        "plain",
        "`plain`: IDs in the clear (the coordinator sees every ID set); `hashed`: SHA-256 of each ID (a "
        "dictionary attack recovers them); `psi`: ECDH private set intersection (the coordinator learns "
        "sizes only). After `hashed` or `psi`, and with parties' own files, steps carry row indices only",
        reads="every process (the alignment phase)",
    )


@dataclass
class PartyConfig:
    """One party of the roster: exactly one `coordinator`, one `active` (it holds the labels), one or
    more `passive`. The active party may hold features (then it has a bottom model too) or not.

    `via: proxy` on a party (under `vflnet run`) starts a proxy process in front of it whose trace is
    `<run>/traces/proxy-NAME.trace`; `via: HOST:PORT` (deployments) makes the party advertise a proxy
    you run yourself."""

    name: str = setting(
        "",
        "unique party name (also its certificate CN under TLS)",
        shown="required",
        reads="every process (the roster)",
    )
    role: Literal["coordinator", "active", "passive"] = setting(
        "passive",
        "`coordinator`, `active` or `passive`",
        reads="every process (the roster)",
    )
    address: str = setting(
        "",
        "`host:port` it serves on (deployments); empty: any free loopback port (`vflnet run`)",
        reads=Reads("`vflnet party` (where it serves; what peers dial)", _launcher_ignores_address),
    )
    via: str = setting(
        "",
        "`host:port` of a proxy in front of this party: the address other parties are given",
        reads=Reads("`vflnet run` (`proxy`) and `vflnet party` (`HOST:PORT`)", _launcher_ignores_via),
    )
    features: FeaturesConfig | None = setting(
        None,
        "the party's feature slice: exactly one of columns or region",
        reads="the party's data loader",
    )
    bottom: ModelConfig | None = setting(
        None,
        "the party's bottom model (a model block); required with features",
        reads="the party's model builder",
    )
    sample_fraction: float = setting(
        1.0,
        "keep a seeded subset of the IDs (exercises alignment)",
        reads=Reads("the party's data loader", all_of(_not_coordinator, _no_source)),
    )
    source: SourceConfig | None = setting(
        None,
        "the party's own file (instead of the dataset's columns): every party with data names one, or none "
        "does (`vflnet data split` writes them from a dataset)",
        reads=Reads("the party's data loader", _not_coordinator),
    )
    device: str = setting(
        "",
        "where this party trains its models: cpu, cuda or cuda:N (empty: `train.device`)",
        shown="`train.device`",
        reads=Reads("the party's models", _on_device),
    )

    @property
    def holds_features(self) -> bool:
        """Whether the party holds feature columns (its ``features``, or its own file's)."""
        return self.features is not None or (self.source is not None and bool(self.source.features))


@dataclass
class TopConfig:
    """The active party's model over the aggregated embedding."""

    top: ModelConfig = setting(
        factory=lambda: ModelConfig(kind="linear"),
        help="the top model (a model block)",
        shown="`{kind: linear}`",
        reads="the active party's model builder",
    )


@dataclass
class OptimizerConfig:
    kind: Literal["sgd", "momentum", "adam"] = setting(
        "sgd",
        "`sgd`, `momentum`, `adam` (each party optimises its own parameters)",
        reads="every party's optimizer (param-server: the coordinator's)",
    )
    lr: float = setting(
        0.1, "learning rate", reads="every party's optimizer (param-server: the coordinator's)"
    )
    momentum: float = setting(
        0.9, "momentum (`momentum`)", reads=Reads("the `momentum` optimizer", sibling("kind", "momentum"))
    )
    weight_decay: float = setting(
        0.0, "L2 weight decay", reads="every party's optimizer (param-server: the coordinator's)"
    )
    betas: list[float] = setting(
        factory=lambda: [0.9, 0.999],
        help="Adam's betas",
        reads=Reads("the `adam` optimizer", sibling("kind", "adam")),
    )


@dataclass
class LRScheduleConfig:
    kind: Literal["none", "step"] = setting(
        "none",
        "`none` or `step` (multiply the LR by `gamma` every `step_size` epochs)",
        reads="every party's LR schedule",
    )
    step_size: int = setting(
        1, "epochs between steps", reads=Reads("the `step` LR schedule", sibling("kind", "step"))
    )
    gamma: float = setting(
        0.1, "LR factor per step", reads=Reads("the `step` LR schedule", sibling("kind", "step"))
    )


@dataclass
class TrainConfig:
    """Training: epochs, batches, optimizer, evaluation and checkpoints."""

    epochs: int = setting(
        5,
        "passes over the training IDs",
        reads=Reads("the coordinator's training schedule", by_protocol("train_reads")),
    )
    batch_size: int = setting(
        64,
        "samples per training step",
        reads=Reads("the coordinator's training schedule", by_protocol("train_reads")),
    )
    drop_last: bool = setting(
        False,
        "drop a final short batch",
        reads=Reads("the coordinator's training schedule", by_protocol("train_reads")),
    )
    max_steps: int = setting(
        0,
        "stop after this many training steps (0 = no limit)",
        reads=Reads("the coordinator's training schedule", by_protocol("train_reads")),
    )
    device: str = setting(
        "cpu",
        "where every party trains its bottom and top models (`parties[].device` per party): `cpu`, `cuda` "
        "or `cuda:N`; the messages are the same; protocols split and param-server",
        reads=Reads("every party's models", all_of(by_protocol("train_reads"), _on_device)),
    )
    optimizer: OptimizerConfig = setting(
        factory=OptimizerConfig,
        help="each party's optimizer (the keys below)",
        reads=Reads("every party's optimizer", by_protocol("train_reads")),
    )
    lr_schedule: LRScheduleConfig = setting(
        factory=LRScheduleConfig,
        help="each party's learning-rate schedule (the keys below)",
        reads=Reads("every party's LR schedule", by_protocol("train_reads")),
    )
    eval_every: int = setting(
        1,
        "evaluate on the test split every N epochs (and after the last); 0: never (a run that only "
        "trains, e.g. a benchmark's: its test split may then be empty)",
        reads=Reads("the coordinator's evaluation steps", by_protocol("train_reads")),
    )
    eval_batch_size: int = setting(
        512,
        "samples per evaluation step",
        reads=Reads("the coordinator's evaluation steps", all_of(by_protocol("train_reads"), _evaluated)),
    )
    checkpoint_every: int = setting(
        1,
        "a coordinated checkpoint (every party, then a manifest) after every N-th epoch's last step",
        reads=Reads("the coordinator's checkpoints", by_protocol("train_reads")),
    )
    checkpoint_every_steps: int = setting(
        0,
        "also a coordinated checkpoint every N training steps (0 = only at epoch ends); `vflnet run --resume` "
        "continues from the newest",
        reads=Reads("the coordinator's checkpoints", by_protocol("train_reads")),
    )


# the `train:` keys; a protocol declares those its sides read (`Protocol.train_reads`, by default all)
TRAIN_KEYS = frozenset(f.name for f in dataclasses.fields(TrainConfig))


@dataclass
class PredictConfig:
    """The prediction (serving) phase: the trained parties label a set of sample IDs together, the
    active party recording the predictions."""

    set: Literal["none", "test", "train"] = setting(
        "none",
        "which sample IDs are served: `none` (no prediction phase), `test` or `train` split",
        reads="the coordinator's prediction phase",
    )
    count: int = setting(
        0,
        "how many: 0 = all of the set, else the first `count` of it in a fixed order",
        reads=Reads("the prediction phase", sibling("set", "test", "train")),
    )
    batch_size: int = setting(
        256,
        "samples per prediction step",
        reads=Reads("the prediction phase", sibling("set", "test", "train")),
    )
    when: Literal["end", "every_epoch"] = setting(
        "end",
        "`end` (after training) or `every_epoch`",
        reads=Reads("the prediction phase", sibling("set", "test", "train")),
    )


@dataclass
class ModelReleaseConfig:
    """An explicit, recorded protocol step in which `owner` hands its trained model parts to
    `recipient`: white-box knowledge a threat model grants. The coordinator may receive, but it owns no
    model parts; a passive party owns a `bottom`, the active party a `top` (unless `model.top.kind` is
    `none`) and a `bottom` if it holds features."""

    owner: str = setting(
        "",
        "the party (roster name) that hands over its model parts",
        shown="required",
        reads="the coordinator's model release step",
    )
    recipient: str = setting(
        "",
        "the party (roster name) that receives them",
        shown="required",
        reads="the coordinator's model release step",
    )
    modules: list[Literal["bottom", "top"]] = setting(
        factory=list, help="non-empty: `bottom` and/or `top`", reads="the coordinator's model release step"
    )
    when: Literal["end", "start"] = setting(
        "end",
        "`end` (after training, before the prediction pass) or `start` (before the first step)",
        reads="the coordinator's model release step",
    )


@dataclass
class TLSConfig:
    enabled: bool = setting(
        False,
        "mutual TLS on every channel (`vflnet certs` makes the files)",
        reads="every process's channels",
    )
    ca: str = setting(
        "",
        "PEM path of the CA certificate",
        reads=Reads("every process's TLS channels", sibling("enabled", True)),
    )
    cert: str = setting(
        "",
        "PEM path of the party's certificate; `{name}` becomes the party name",
        reads=Reads("every process's TLS channels", sibling("enabled", True)),
    )
    key: str = setting(
        "",
        "PEM path of the party's key; `{name}` becomes the party name",
        reads=Reads("every process's TLS channels", sibling("enabled", True)),
    )


@dataclass
class TransportConfig:
    """How messages travel between the parties."""

    bridge: Literal["grpc", "loopback"] = setting(
        "grpc",
        "transport of the local runner: `grpc` (one process per party) or `loopback` (every role in one "
        "process; messages are still serialized through protobuf and the interceptor chains)",
        reads="the `vflnet run` launcher",
    )
    max_message_mb: float = setting(
        64.0,
        "gRPC send/receive limit per gRPC message; a larger message travels in chunks (docs/protocols.md, "
        "Large messages). Every party and proxy must use the same value",
        reads=Reads("every process's transport", _over_grpc),
    )
    max_payload_mb: float = setting(
        1024.0,
        "ceiling on one logical message, chunked or not: a bigger one is refused before sending, with an "
        "error naming this key",
        reads=Reads("every process's transport", _over_grpc),
    )
    max_inflight_mb: float = setting(
        2048.0,
        "bytes of chunked requests one server buffers at once, over all its streams; a stream that would "
        "go over gets RESOURCE_EXHAUSTED (streams that never finish cannot exhaust memory)",
        reads=Reads("every process's transport", _over_grpc),
    )
    max_concurrent_rpcs: int = setting(
        128,
        "calls one server handles at once, each on a thread of its own; more get RESOURCE_EXHAUSTED "
        "instead of queueing without bound; at least 2 x parties + 8 (checked: the coordinator holds every "
        "party's join until all have joined, the active party every passive party's embeddings of a step)",
        reads=Reads("every process's transport", _over_grpc),
    )
    rpc_timeout_s: float = setting(
        60.0,
        "deadline of every RPC and of waiting for peers within a step, before the work: a step's deadline "
        "is this plus work_slack x the parties' estimate of the step's compute (docs/reliability.md)",
        reads="every process's transport",
    )
    work_slack: float = setting(
        10.0,
        "how many times slower than the reference core (docs/reliability.md) a step's work may run before "
        "its deadline passes: the estimate scales with key size, batch, model and protocol",
        reads="every process's transport",
    )
    join_timeout_s: float = setting(
        120.0, "how long the coordinator waits for the whole roster", reads="every process's transport"
    )
    idle_timeout_s: float = setting(
        600.0, "a party exits if the coordinator is silent this long", reads="every process's transport"
    )
    heartbeat_s: float = setting(
        2.0,
        "interval of the heartbeats (standard gRPC health checks) a party sends the coordinator and the "
        "coordinator sends every party while the run is on; 0 turns them off (docs/reliability.md)",
        reads=Reads("every process's transport", _over_grpc),
    )
    dead_after_s: float = setting(
        30.0,
        "a peer whose health checks have all failed for this long is dead: a party exits (code 3), the "
        "coordinator fails the run naming the party. A slow peer still answers them, so it is not dead",
        reads=Reads("the heartbeats", all_of(_over_grpc, _heartbeats_on)),
    )
    tls: TLSConfig = setting(
        factory=TLSConfig,
        help="mutual TLS on every channel (the keys below)",
        reads=Reads("every process's channels", _over_grpc),
    )
    allow_plaintext_remote: bool = setting(
        False,
        "permit plaintext gRPC to a non-loopback address (logs a warning)",
        reads=Reads("every process's transport", _over_grpc),
    )
    reflection: bool = setting(
        False,
        "serve gRPC server reflection (v1 and v1alpha, for grpcurl); off by default: a vflnet peer never "
        "needs it and it describes the server's services to any caller",
        reads=Reads("every process's transport", _over_grpc),
    )


@dataclass
class RuntimeConfig:
    torch_threads: int = setting(
        1,
        "torch threads per process (fixed so float reductions match the reference)",
        reads="every process",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = setting(
        "INFO", "log level of every process", reads="every process"
    )


@dataclass
class PluginConfig:
    """An attack or a defense by registered name (`vflnet attacks`, `vflnet defenses`). An attack is
    hosted on `party`'s wire, a defense is owned by `party`; the party's role must be one the entry sits
    at. Unknown names and bad params are config errors."""

    name: str = setting("", "registered name", shown="required", reads="the hosting party")
    party: str = setting("", "the hosting party (roster name)", shown="required", reads="the hosting party")
    params: dict[str, Any] = setting(
        factory=dict,
        help="its parameters (`vflnet attacks` / `vflnet defenses` list them)",
        reads="the attack's or defense's contract (its `params`)",
    )


@dataclass
class TraceConfig:
    """Wire recording."""

    parties: list[str] = setting(
        factory=list,
        help="parties whose wire is recorded to `<run>/traces/NAME.trace` (`all` = every party)",
        reads="every process's wire recorder",
    )
    max_mb: float = setting(
        1024.0,
        "size cap per trace file; recording stops at the cap and says so",
        reads=Reads("the wire recorder", _traced),
    )


@dataclass
class Config:
    run: RunConfig = setting(factory=RunConfig, help="run id, run directory and seed", reads="every process")
    protocol: ProtocolConfig = setting(
        factory=ProtocolConfig, help="the training protocol", reads="every process"
    )
    data: DataConfig = setting(factory=DataConfig, help="the dataset", reads="every process")
    alignment: AlignmentConfig = setting(
        factory=AlignmentConfig, help="sample alignment before training", reads="every process"
    )
    parties: list[PartyConfig] = setting(
        factory=list, help="the roster: a list of parties", reads="every process"
    )
    model: TopConfig = setting(factory=TopConfig, help="the active party's top model", reads="every process")
    train: TrainConfig = setting(factory=TrainConfig, help="training", reads="every process")
    predict: PredictConfig = setting(
        factory=PredictConfig, help="the prediction (serving) phase", reads="every process"
    )
    model_release: list[ModelReleaseConfig] = setting(
        factory=list,
        help="a list of model releases: model parts one party hands to another (a threat model's white-box knowledge)",
        reads="every process",
    )
    transport: TransportConfig = setting(factory=TransportConfig, help="the wire", reads="every process")
    runtime: RuntimeConfig = setting(
        factory=RuntimeConfig, help="per-process settings", reads="every process"
    )
    attacks: list[PluginConfig] = setting(
        factory=list, help="a list of attacks, each on one party's wire", reads="every process"
    )
    defenses: list[PluginConfig] = setting(
        factory=list, help="a list of defenses, each owned by one party", reads="every process"
    )
    trace: TraceConfig = setting(factory=TraceConfig, help="wire recording", reads="every process")
    plugins: list[str] = setting(
        factory=list,
        help="extra Python modules imported by every process before names are resolved; they may register "
        "attacks, defenses, datasets, model kinds and protocols (`vflnet.registry`)",
        reads="every process, before it resolves a name",
    )
    source: str = field(default="", metadata={"internal": True})
    # every key the config's mapping set (file and overrides), at every depth: what `unread_keys` judges
    given: frozenset[str] = field(default_factory=frozenset, metadata={"internal": True})

    # --------------------------------------------------------------------------- convenience
    def device(self, party: PartyConfig) -> str:
        """Where ``party`` trains its models: its own ``device``, else ``train.device``."""
        return party.device or self.train.device

    def party(self, name: str) -> PartyConfig:
        for p in self.parties:
            if p.name == name:
                return p
        raise KeyError(f"no party named {name!r} in the roster ({', '.join(p.name for p in self.parties)})")

    @property
    def coordinator(self) -> PartyConfig:
        return next(p for p in self.parties if p.role == "coordinator")

    @property
    def active(self) -> PartyConfig:
        return next(p for p in self.parties if p.role == "active")

    @property
    def passives(self) -> list[PartyConfig]:
        return [p for p in self.parties if p.role == "passive"]

    @property
    def feature_parties(self) -> list[PartyConfig]:
        """Parties holding features, in aggregation order: the active party first (if it has
        features), then the passive parties in roster order."""
        own = [self.active] if self.active.holds_features else []
        return own + self.passives

    @property
    def sources(self) -> bool:
        """Whether the parties read their own files (`source`) instead of the dataset."""
        return any(p.source is not None for p in self.parties)

    @property
    def alignment_phase(self) -> bool:
        """Whether alignment runs as its own phase on the wire (and steps carry row indices): under
        `hashed` and `psi`, and with the parties' own files (their IDs are text); `plain` over the
        dataset's integer IDs joins with the IDs in `Join`, as the steps name them."""
        return self.alignment.method != "plain" or self.sources

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain mapping, less the keys this config does not read (`unread_keys`): what
        is written has an effect, and the mapping parses back to the same config."""
        return _to_plain(self, {key for key, _ in _unread(self, None)})


# ---------------------------------------------------------------------------------------- parsing
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true/false",
        type(None): "null",
    }.get(tp, str(tp))


def _convert(value: Any, tp: Any, key: str, source: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        real = [o for o in options if o is not type(None)]
        if len(real) == 1 or (isinstance(value, dict) and any(dataclasses.is_dataclass(o) for o in real)):
            # one candidate type: let its own, more precise error through
            target = real[0] if len(real) == 1 else next(o for o in real if dataclasses.is_dataclass(o))
            return _convert(value, target, key, source)
        for option in typing.get_args(tp):
            try:
                return _convert(value, option, key, source)
            except ConfigError:
                continue
        raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(source, key, f"expected null, got {value!r}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_convert(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(source, key, f"expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return parse_section(tp, value, key, source)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")


def parse_section(cls: type, data: Any, prefix: str, source: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, prefix, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    allowed = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in allowed:
            hint = "; a protocol's own settings go under protocol.params" if prefix == "protocol" else ""
            raise ConfigError(
                source, dotted, f"unknown key; allowed here: {', '.join(sorted(allowed))}{hint}"
            )
        kwargs[key] = _convert(value, hints[key], dotted, source)
    return cls(**kwargs)


def _fields(obj: Any) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(obj) if not f.metadata.get("internal")]


def _is_sections(value: Any) -> bool:
    """A non-empty list of sections (parties, attacks, model releases): walked item by item."""
    return isinstance(value, list) and bool(value) and all(dataclasses.is_dataclass(v) for v in value)


def _judged(cfg: Config, launcher: str | None) -> Iterator[tuple[str, Any, str | None]]:
    """Every field of ``cfg`` at every depth, parents first: (dotted key, value, None if the run reads
    it, else why not). The condition of a section-valued field holds for every key under it."""

    def walk(obj: Any, prefix: str, above: str | None) -> Iterator[tuple[str, Any, str | None]]:
        for f in _fields(obj):
            key = f"{prefix}.{f.name}" if prefix else f.name
            value = getattr(obj, f.name)
            why = above or f.metadata["reads"].why_unread(Judged(cfg, obj, prefix, f.name, launcher))
            yield key, value, why
            if dataclasses.is_dataclass(value):
                yield from walk(value, key, why)
            elif _is_sections(value):
                for i, item in enumerate(value):
                    yield from walk(item, f"{key}[{i}]", why)

    yield from walk(cfg, "", None)


def unread_keys(cfg: Config, launcher: str | None = None) -> list[tuple[str, str]]:
    """The keys the config's mapping set (``cfg.given``) that nothing would read in this config, as
    (dotted key, why not and what would read it), from every field's declared readers (``setting``'s
    ``reads``) and the components' declarations (`ModelKind.reads`, `Protocol.settings`,
    `Protocol.train_reads`). ``launcher``: the command the config is loaded for (``run``: `vflnet run`,
    which sets some per-party keys itself); None: any. Run after the registry checks (plug-ins imported)."""
    return [(key, why) for key, why in _unread(cfg, launcher) if key in cfg.given]


def _unread(cfg: Config, launcher: str | None) -> Iterator[tuple[str, str]]:
    """Every key of the schema (set or not) that this config does not read: (key, why not); sections
    are left out, their keys are listed."""
    for key, value, why in _judged(cfg, launcher):
        if why is not None and not dataclasses.is_dataclass(value) and not _is_sections(value):
            yield key, why


def _to_plain(obj: Any, leave_out: Collection[str] = (), prefix: str = "") -> Any:
    """``obj`` as plain data, less the fields whose dotted keys are in ``leave_out``."""
    if dataclasses.is_dataclass(obj):
        keys = {f.name: f"{prefix}.{f.name}" if prefix else f.name for f in _fields(obj)}
        return {
            name: _to_plain(getattr(obj, name), leave_out, key)
            for name, key in keys.items()
            if key not in leave_out
        }
    if isinstance(obj, list):
        return [_to_plain(v, leave_out, f"{prefix}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


def _given(cls: type, data: dict[str, Any], prefix: str) -> Iterator[str]:
    """The dotted keys a parsed mapping sets for section ``cls``, at every depth (list items included)."""
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        yield dotted
        section = _section_type(hints[key])
        if section is None:
            continue
        if isinstance(value, dict):
            yield from _given(section, value, dotted)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    yield from _given(section, item, f"{dotted}[{i}]")


def _section_type(tp: Any) -> type | None:
    """The section dataclass a field holds (itself, in an Optional or in a list), or None."""
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    for arg in typing.get_args(tp):
        found = _section_type(arg)
        if found is not None:
            return found
    return None


# ------------------------------------------------------------------------------------ validation
def calls_at_once(parties: int) -> int:
    """The most calls one server of a roster of ``parties`` may hold at once, each waiting for others
    (so each needs a thread of its own, or the calls it waits for never run): the coordinator's joins,
    one per party, held until all have joined; the active party's embeddings, one per passive party,
    held until the step's top model has run, for two steps at once (pipelined: the next step's arrive
    while this one's replies go out); plus heartbeats and control calls."""
    return 2 * parties + 8


def _positive(cfg_value: float, key: str, source: str, *, allow_zero: bool = False) -> None:
    if cfg_value < 0 or (cfg_value == 0 and not allow_zero):
        raise ConfigError(
            source, key, f"expected a {'non-negative' if allow_zero else 'positive'} value, got {cfg_value}"
        )


def _check_source(src: str, key: str, p: PartyConfig) -> None:
    """A party's own file, as far as the config tells (its process checks the file itself)."""
    assert p.source is not None
    if p.role == "coordinator":
        raise ConfigError(src, f"{key}.source", "the coordinator holds no data")
    if not p.source.path:
        raise ConfigError(src, f"{key}.source.path", f"party {p.name!r}: expected the path of its file")
    if p.features is not None:
        raise ConfigError(
            src,
            f"{key}.features",
            f"party {p.name!r} reads its columns from source.features; remove features",
        )
    if p.role == "passive" and not p.source.features:
        raise ConfigError(src, f"{key}.source.features", f"passive party {p.name!r} needs feature columns")
    if p.role == "active" and not p.source.label_column:
        raise ConfigError(
            src, f"{key}.source.label_column", f"active party {p.name!r}: name its label column"
        )
    named = [p.source.id_column, *p.source.features, p.source.label_column]
    twice = sorted({c for c in named if c and named.count(c) > 1})
    if twice:
        raise ConfigError(src, f"{key}.source.features", f"a column is named twice: {', '.join(twice)}")
    if p.source.features and p.bottom is None:
        raise ConfigError(src, f"{key}.bottom", f"party {p.name!r} holds features and needs a bottom model")


def validate(cfg: Config) -> None:
    """Checks that need nothing but the config: roster shape, model/aggregation consistency, value
    ranges, predict and model_release. Names resolved through the registries and the dataset's shape
    are checked by :mod:`vflnet.validation`."""
    src = cfg.source
    if not cfg.parties:
        raise ConfigError(
            src, "parties", "the roster is empty; list a coordinator, an active and >= 1 passive party"
        )
    names = [p.name for p in cfg.parties]
    for i, p in enumerate(cfg.parties):
        if not p.name:
            raise ConfigError(src, f"parties[{i}].name", "every party needs a name")
        if p.name in names[:i]:
            raise ConfigError(src, f"parties[{i}].name", f"duplicate party name {p.name!r}")
    roles = [p.role for p in cfg.parties]
    if roles.count("coordinator") != 1:
        raise ConfigError(
            src, "parties", f"exactly one coordinator is required, found {roles.count('coordinator')}"
        )
    if roles.count("active") != 1:
        raise ConfigError(
            src, "parties", f"exactly one active party is required, found {roles.count('active')}"
        )
    if roles.count("passive") < 1:
        raise ConfigError(src, "parties", "at least one passive party is required")
    for i, p in enumerate(cfg.parties):
        key = f"parties[{i}]"
        if p.role == "coordinator" and (p.features is not None or p.bottom is not None):
            raise ConfigError(src, f"{key}.features", "the coordinator holds no features or model")
        if p.source is not None:
            _check_source(src, key, p)
        elif cfg.sources and p.role != "coordinator":
            named = next(q.name for q in cfg.parties if q.source is not None)
            raise ConfigError(
                src, f"{key}.source", f"party {named!r} reads its own file: every party with data names one"
            )
        if p.role == "passive" and p.features is None and p.source is None:
            raise ConfigError(
                src, f"{key}.features", f"passive party {p.name!r} needs features (columns or region)"
            )
        if p.features is not None:
            if (p.features.columns is None) == (p.features.region is None):
                raise ConfigError(src, f"{key}.features", "give exactly one of 'columns' or 'region'")
            if p.features.region is not None and len(p.features.region) != 4:
                raise ConfigError(src, f"{key}.features.region", "expected [row0, row1, col0, col1]")
            if p.bottom is None:
                raise ConfigError(
                    src, f"{key}.bottom", f"party {p.name!r} holds features and needs a bottom model"
                )
            if p.bottom.out <= 0:
                raise ConfigError(
                    src, f"{key}.bottom.out", "expected the embedding size (a positive integer)"
                )
            if p.bottom.shift < 0:
                raise ConfigError(src, f"{key}.bottom.shift", "expected pixels >= 0")
            if not 0.0 <= p.bottom.dropout < 1.0:
                raise ConfigError(src, f"{key}.bottom.dropout", "expected a rate in [0, 1)")
        if not 0 < p.sample_fraction <= 1:
            raise ConfigError(
                src, f"{key}.sample_fraction", f"expected a value in (0, 1], got {p.sample_fraction}"
            )
    if not cfg.active.holds_features and cfg.active.bottom is not None:
        raise ConfigError(src, "parties", "the active party has a bottom model but no features")
    outs = [p.bottom.out for p in cfg.feature_parties if p.bottom is not None]
    if cfg.protocol.aggregation == "sum" and len(set(outs)) > 1:
        raise ConfigError(src, "protocol.aggregation", f"'sum' needs equal bottom output sizes, got {outs}")
    t = cfg.train
    for key, value in [
        ("train.epochs", t.epochs),
        ("train.batch_size", t.batch_size),
        ("train.eval_batch_size", t.eval_batch_size),
        ("train.checkpoint_every", t.checkpoint_every),
    ]:
        _positive(value, key, src)
    _positive(t.max_steps, "train.max_steps", src, allow_zero=True)
    _positive(t.eval_every, "train.eval_every", src, allow_zero=True)
    _positive(t.checkpoint_every_steps, "train.checkpoint_every_steps", src, allow_zero=True)
    _positive(t.optimizer.lr, "train.optimizer.lr", src)
    _positive(t.optimizer.weight_decay, "train.optimizer.weight_decay", src, allow_zero=True)
    if len(t.optimizer.betas) != 2:
        raise ConfigError(src, "train.optimizer.betas", "expected two numbers")
    if not 0 < cfg.data.test_fraction < 1:
        raise ConfigError(
            src, "data.test_fraction", f"expected a value in (0, 1), got {cfg.data.test_fraction}"
        )
    _positive(cfg.predict.count, "predict.count", src, allow_zero=True)
    _positive(cfg.predict.batch_size, "predict.batch_size", src)
    _validate_model_release(cfg)
    _positive(cfg.transport.rpc_timeout_s, "transport.rpc_timeout_s", src)
    _positive(cfg.transport.join_timeout_s, "transport.join_timeout_s", src)
    _positive(cfg.transport.idle_timeout_s, "transport.idle_timeout_s", src)
    _positive(cfg.transport.work_slack, "transport.work_slack", src, allow_zero=True)
    _positive(cfg.run.auto_resume, "run.auto_resume", src, allow_zero=True)
    _positive(cfg.transport.max_message_mb, "transport.max_message_mb", src)
    _positive(cfg.transport.max_payload_mb, "transport.max_payload_mb", src)
    _positive(cfg.transport.max_inflight_mb, "transport.max_inflight_mb", src)
    _positive(cfg.transport.max_concurrent_rpcs, "transport.max_concurrent_rpcs", src)
    need = calls_at_once(len(cfg.parties))
    if cfg.transport.bridge == "grpc" and cfg.transport.max_concurrent_rpcs < need:
        raise ConfigError(
            src,
            "transport.max_concurrent_rpcs",
            f"{cfg.transport.max_concurrent_rpcs} is too few for {len(cfg.parties)} parties: a server may hold "
            f"{need} calls at once (2 x parties + 8); set at least {need}",
        )
    tls = cfg.transport.tls
    if tls.enabled:
        for k in ("ca", "cert", "key"):
            if not getattr(tls, k):
                raise ConfigError(src, f"transport.tls.{k}", "required when transport.tls.enabled is true")
    _positive(cfg.runtime.torch_threads, "runtime.torch_threads", src)
    for section in ("attacks", "defenses"):
        for i, entry in enumerate(getattr(cfg, section)):
            if entry.party not in names:
                raise ConfigError(src, f"{section}[{i}].party", f"no party {entry.party!r} in the roster")
    for name in cfg.trace.parties:
        if name != "all" and name not in names:
            raise ConfigError(src, "trace.parties", f"no party {name!r} in the roster")
    _positive(cfg.trace.max_mb, "trace.max_mb", src)


def model_parts(cfg: Config, party: PartyConfig) -> list[str]:
    """The model parts a party owns: a bottom if it holds features, the active party's top unless
    model.top.kind is 'none'; the coordinator owns none."""
    parts = ["bottom"] if party.bottom is not None else []
    if party.role == "active" and cfg.model.top.kind != NO_MODEL:
        parts.append("top")
    return parts


def _validate_model_release(cfg: Config) -> None:
    src = cfg.source
    names = [p.name for p in cfg.parties]
    for i, release in enumerate(cfg.model_release):
        key = f"model_release[{i}]"
        for end in ("owner", "recipient"):
            who = getattr(release, end)
            if not who:
                raise ConfigError(
                    src, f"{key}.{end}", f"required: a party of the roster ({', '.join(names)})"
                )
            if who not in names:
                raise ConfigError(src, f"{key}.{end}", f"no party {who!r} in the roster ({', '.join(names)})")
        if release.owner == release.recipient:
            raise ConfigError(
                src, f"{key}.recipient", f"{release.owner!r} cannot release its model to itself"
            )
        owner = cfg.party(release.owner)
        if owner.role == "coordinator":
            raise ConfigError(
                src, f"{key}.owner", "the coordinator owns no model parts (it can only be a recipient)"
            )
        if not release.modules:
            raise ConfigError(src, f"{key}.modules", "list at least one of 'bottom', 'top'")
        owned = model_parts(cfg, owner)
        for j, module in enumerate(release.modules):
            if module in release.modules[:j]:
                raise ConfigError(src, f"{key}.modules[{j}]", f"{module!r} is listed twice")
            if module not in owned:
                why = {
                    "top": "only the active party has a top model"
                    if owner.role != "active"
                    else "model.top.kind is 'none'",
                    "bottom": "it holds no features",
                }[module]
                raise ConfigError(
                    src,
                    f"{key}.modules[{j}]",
                    f"{owner.role} party {owner.name!r} has no {module!r} model to release ({why}); "
                    f"it owns {owned or 'nothing'}",
                )


def parse(data: Any, source: str = "") -> Config:
    """The config of a plain mapping (parsed YAML), checked by :func:`validate` only. Callers want
    ``vflnet.validation.config_from_dict``, which adds the registry and dataset checks."""
    if not isinstance(data, dict):
        raise ConfigError(source, "", "the config must be a YAML mapping at the top level")
    cfg = parse_section(Config, data, "", source)
    cfg.source = source
    cfg.given = frozenset(_given(Config, data, ""))
    validate(cfg)
    return cfg


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats a key (PyYAML keeps the last one silently:
    a second `train:` section would drop every setting of the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep)


class DuplicateKey(ValueError):
    def __init__(self, key: Any, first: int, second: int) -> None:
        self.key = key
        super().__init__(
            f"key {key!r} appears twice in one mapping (lines {first} and {second}); YAML would keep only "
            "the second and silently drop the first: merge them"
        )


def load_yaml(text: str, source: str) -> Any:
    """A YAML document (a config, a sweep file), refusing repeated keys; errors name ``source``."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except DuplicateKey as exc:
        raise ConfigError(source, "", str(exc)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(source, "", f"not valid YAML: {exc}") from exc


def read_yaml(path: str | Path) -> Any:
    """The YAML document of a config file (errors name the file), for :func:`parse`. Callers want
    ``vflnet.validation.load_config``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read the file: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:  # a binary file given for a config
        raise ConfigError(str(path), "", f"not a text file: {exc.reason} at byte {exc.start}") from exc
    return load_yaml(text, str(path))


def dump(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
