"""Run configuration: the schema (typed sections), strict YAML parsing, and one clear error per mistake.

Every section is a dataclass; :func:`parse` walks the YAML against the annotations and rejects an
unknown key, a wrong type or a bad value with a :class:`ConfigError` that names the file, the dotted
key and what was expected, then runs the checks that need nothing but the config itself
(:func:`validate`). Every field carries a one-line ``help`` (see :func:`setting`) from which
docs/config.md is generated (``vflnet config docs``).

This module imports nothing else from vflnet. The checks against the registries (plug-in modules,
attack/defense/dataset/model names and parameters) and against the dataset's shape live one level up,
in :mod:`vflnet.validation`: load a config with ``vflnet.validation.load_config``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
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


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    shown: str | None = None,
) -> Any:
    """A schema field with its one-line help for docs/config.md; ``shown`` overrides how its default
    is written there (e.g. "required")."""
    metadata: dict[str, Any] = {"help": help}
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
    )
    dir: str = setting("runs", "parent folder of run directories")
    auto_resume: int = setting(
        0,
        "times `vflnet run` resumes the run by itself, from its newest checkpoint, after a process died "
        "or the run failed (docs/reliability.md); 0: stop and print the `vflnet run --resume` command",
    )
    seed: int = setting(
        0,
        "seeds model initialisation (per party: `seed*1000 + roster index`), the train/test split "
        "and the batch schedule",
    )


@dataclass
class ProtocolConfig:
    """How the parties train together."""

    kind: str = setting(
        "split",
        "a registered protocol; the protocols table below lists each with its methods, defense hook points "
        "and settings",
    )
    aggregation: Literal["concat", "sum"] = setting(
        "concat", "`concat` (concatenate embeddings, then the top model) or `sum` (add them)"
    )
    params: dict[str, Any] = setting(
        factory=dict,
        help="the protocol's own settings, declared by its contract (`Protocol.params`; the protocols "
        "table below) and checked by it",
    )


@dataclass
class DataConfig:
    """The dataset every party loads its own columns and IDs of (only the active party keeps labels)."""

    dataset: str = setting("digits", "a registered dataset (table below; `vflnet datasets`)")
    params: dict[str, Any] = setting(factory=dict, help="the dataset's parameters (table below)")
    test_fraction: float = setting(0.2, "held-out share of the aligned IDs")
    normalize: Literal["auto", "none", "standard", "minmax"] = setting(
        "auto",
        "`auto` (images: none, already in [0,1]; tabular: standard), `none`, `standard`, `minmax`; "
        "each party uses statistics of its own training rows only",
    )
    allow_overlap: bool = setting(
        False,
        "let parties hold some of the same feature columns or pixels (refused by default: vertical "
        "partitions are disjoint, and an overlap is usually a typo in `features`)",
    )


@dataclass
class FeaturesConfig:
    columns: str | list[int] | None = setting(None, 'flat column indices: `"0:32"`, `"0:8,16:24"` or a list')
    region: list[int] | None = setting(None, "image rectangle `[row0, row1, col0, col1]` (half-open)")


@dataclass
class ModelConfig:
    """A model block: `kind` is a registered model kind (table below; `vflnet models`), the other keys
    are read by the kinds that use them.

    An **input-layer cut** (paper 000): every party's bottom is `{kind: linear, bias: false, out: H}`,
    `aggregation: sum`, and `model.top: {kind: mlp, input_activation: relu, ...}` — the sum of the
    column blocks is the first layer of the joint network, its bias and activation live at the active party."""

    kind: str = setting("mlp", "a model kind that can sit here (bottom or top; table below)")
    hidden: list[int] = setting(factory=list, help="hidden layer widths (mlp; cafe-*: [fc1, fc2])")
    out: int = setting(0, "bottom: embedding size (required); top: ignored (number of classes)")
    bias: bool = setting(True, "bias on the last linear layer")
    activation: Literal["relu", "tanh", "sigmoid"] = setting("relu", "nonlinearity between hidden layers")
    dropout: float = setting(0.0, "mlp: dropout rate after each hidden layer (paper 003's countermeasure)")
    channels: list[int] = setting(
        factory=lambda: [8, 16], help="conv widths (cnn; cafe-conv: its two conv layers)"
    )
    shift: int = setting(
        0, "resnet-small, resnet18: in training only, shift each image by up to this many pixels (zero fill)"
    )
    input_activation: Literal["none", "relu", "tanh", "sigmoid"] = setting(
        "none", "top only: nonlinearity applied to the aggregate first"
    )
    output_activation: Literal["none", "softmax"] = setting(
        "none",
        "top only: `softmax` turns the top's outputs into probabilities that the loss then treats as "
        "logits, a second softmax (the CAFE authors' victim model, paper 002)",
    )
    init: Literal["torch", "keras"] = setting(
        "torch",
        "parameter initialisation: torch's defaults, or `keras`: Glorot-uniform weights and zero biases "
        "in every linear and conv layer (the CAFE authors' TensorFlow model)",
    )


@dataclass
class PartyConfig:
    """One party of the roster: exactly one `coordinator`, one `active` (it holds the labels), one or
    more `passive`. The active party may hold features (then it has a bottom model too) or not.

    `via: proxy` on a party (under `vflnet run`) starts a proxy process in front of it whose trace is
    `<run>/traces/proxy-NAME.trace`; `via: HOST:PORT` (deployments) makes the party advertise a proxy
    you run yourself."""

    name: str = setting("", "unique party name (also its certificate CN under TLS)", shown="required")
    role: Literal["coordinator", "active", "passive"] = setting(
        "passive", "`coordinator`, `active` or `passive`"
    )
    address: str = setting(
        "", "`host:port` it serves on (deployments); empty: any free loopback port (`vflnet run`)"
    )
    via: str = setting(
        "", "`host:port` of a proxy in front of this party: the address other parties are given"
    )
    features: FeaturesConfig | None = setting(
        None, "the party's feature slice: exactly one of columns or region"
    )
    bottom: ModelConfig | None = setting(
        None, "the party's bottom model (a model block); required with features"
    )
    sample_fraction: float = setting(1.0, "keep a seeded subset of the IDs (exercises alignment)")
    device: str = setting(
        "",
        "where this party trains its models: cpu, cuda or cuda:N (empty: `train.device`)",
        shown="`train.device`",
    )


@dataclass
class TopConfig:
    """The active party's model over the aggregated embedding."""

    top: ModelConfig = setting(
        factory=lambda: ModelConfig(kind="linear"),
        help="the top model (a model block)",
        shown="`{kind: linear}`",
    )


@dataclass
class OptimizerConfig:
    kind: Literal["sgd", "momentum", "adam"] = setting(
        "sgd", "`sgd`, `momentum`, `adam` (each party optimises its own parameters)"
    )
    lr: float = setting(0.1, "learning rate")
    momentum: float = setting(0.9, "momentum (`momentum`)")
    weight_decay: float = setting(0.0, "L2 weight decay")
    betas: list[float] = setting(factory=lambda: [0.9, 0.999], help="Adam's betas")


@dataclass
class LRScheduleConfig:
    kind: Literal["none", "step"] = setting(
        "none", "`none` or `step` (multiply the LR by `gamma` every `step_size` epochs)"
    )
    step_size: int = setting(1, "epochs between steps")
    gamma: float = setting(0.1, "LR factor per step")


@dataclass
class TrainConfig:
    """Training: epochs, batches, optimizer, evaluation and checkpoints."""

    epochs: int = setting(5, "passes over the training IDs")
    batch_size: int = setting(64, "samples per training step")
    drop_last: bool = setting(False, "drop a final short batch")
    max_steps: int = setting(0, "stop after this many training steps (0 = no limit)")
    device: str = setting(
        "cpu",
        "where every party trains its bottom and top models (`parties[].device` per party): `cpu`, `cuda` "
        "or `cuda:N`; the messages are the same; protocols split and param-server",
    )
    optimizer: OptimizerConfig = setting(factory=OptimizerConfig, help="")
    lr_schedule: LRScheduleConfig = setting(factory=LRScheduleConfig, help="")
    eval_every: int = setting(1, "evaluate on the test split every N epochs (and after the last)")
    eval_batch_size: int = setting(512, "samples per evaluation step")
    checkpoint_every: int = setting(
        1, "a coordinated checkpoint (every party, then a manifest) after every N-th epoch's last step"
    )
    checkpoint_every_steps: int = setting(
        0,
        "also a coordinated checkpoint every N training steps (0 = only at epoch ends); `vflnet run --resume` "
        "continues from the newest",
    )


@dataclass
class PredictConfig:
    """The prediction (serving) phase: the trained parties label a set of sample IDs together, the
    active party recording the predictions."""

    set: Literal["none", "test", "train"] = setting(
        "none", "which sample IDs are served: `none` (no prediction phase), `test` or `train` split"
    )
    count: int = setting(0, "how many: 0 = all of the set, else the first `count` of it in a fixed order")
    batch_size: int = setting(256, "samples per prediction step")
    when: Literal["end", "every_epoch"] = setting("end", "`end` (after training) or `every_epoch`")


@dataclass
class ModelReleaseConfig:
    """An explicit, recorded protocol step in which `owner` hands its trained model parts to
    `recipient`: white-box knowledge a threat model grants. The coordinator may receive, but it owns no
    model parts; a passive party owns a `bottom`, the active party a `top` (unless `model.top.kind` is
    `none`) and a `bottom` if it holds features."""

    owner: str = setting("", "the party (roster name) that hands over its model parts", shown="required")
    recipient: str = setting("", "the party (roster name) that receives them", shown="required")
    modules: list[Literal["bottom", "top"]] = setting(factory=list, help="non-empty: `bottom` and/or `top`")
    when: Literal["end", "start"] = setting(
        "end", "`end` (after training, before the prediction pass) or `start` (before the first step)"
    )


@dataclass
class TLSConfig:
    enabled: bool = setting(False, "mutual TLS on every channel (`vflnet certs` makes the files)")
    ca: str = setting("", "PEM path of the CA certificate")
    cert: str = setting("", "PEM path of the party's certificate; `{name}` becomes the party name")
    key: str = setting("", "PEM path of the party's key; `{name}` becomes the party name")


@dataclass
class TransportConfig:
    """How messages travel between the parties."""

    bridge: Literal["grpc", "loopback"] = setting(
        "grpc",
        "transport of the local runner: `grpc` (one process per party) or `loopback` (every role in one "
        "process; messages are still serialized through protobuf and the interceptor chains)",
    )
    max_message_mb: float = setting(
        64.0,
        "gRPC send/receive limit per gRPC message; a larger message travels in chunks (docs/protocols.md, "
        "Large messages). Every party and proxy must use the same value",
    )
    max_payload_mb: float = setting(
        1024.0,
        "ceiling on one logical message, chunked or not: a bigger one is refused before sending, with an "
        "error naming this key",
    )
    max_inflight_mb: float = setting(
        2048.0,
        "bytes of chunked requests one server buffers at once, over all its streams; a stream that would "
        "go over gets RESOURCE_EXHAUSTED (streams that never finish cannot exhaust memory)",
    )
    max_concurrent_rpcs: int = setting(
        64, "calls one server handles at once; more get RESOURCE_EXHAUSTED instead of queueing without bound"
    )
    rpc_timeout_s: float = setting(
        60.0,
        "deadline of every RPC and of waiting for peers within a step, before the work: a step's deadline "
        "is this plus work_slack x the parties' estimate of the step's compute (docs/reliability.md)",
    )
    work_slack: float = setting(
        10.0,
        "how many times slower than the reference core (docs/reliability.md) a step's work may run before "
        "its deadline passes: the estimate scales with key size, batch, model and protocol",
    )
    join_timeout_s: float = setting(120.0, "how long the coordinator waits for the whole roster")
    idle_timeout_s: float = setting(600.0, "a party exits if the coordinator is silent this long")
    heartbeat_s: float = setting(
        2.0,
        "interval of the heartbeats (standard gRPC health checks) a party sends the coordinator and the "
        "coordinator sends every party while the run is on; 0 turns them off (docs/reliability.md)",
    )
    dead_after_s: float = setting(
        30.0,
        "a peer whose health checks have all failed for this long is dead: a party exits (code 3), the "
        "coordinator fails the run naming the party. A slow peer still answers them, so it is not dead",
    )
    tls: TLSConfig = setting(factory=TLSConfig, help="")
    allow_plaintext_remote: bool = setting(
        False, "permit plaintext gRPC to a non-loopback address (logs a warning)"
    )
    reflection: bool = setting(
        False,
        "serve gRPC server reflection (v1 and v1alpha, for grpcurl); off by default: a vflnet peer never "
        "needs it and it describes the server's services to any caller",
    )


@dataclass
class RuntimeConfig:
    torch_threads: int = setting(
        1, "torch threads per process (fixed so float reductions match the reference)"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = setting("INFO", "log level of every process")


@dataclass
class PluginConfig:
    """An attack or a defense by registered name (`vflnet attacks`, `vflnet defenses`). An attack is
    hosted on `party`'s wire, a defense is owned by `party`; the party's role must be one the entry sits
    at. Unknown names and bad params are config errors."""

    name: str = setting("", "registered name", shown="required")
    party: str = setting("", "the hosting party (roster name)", shown="required")
    params: dict[str, Any] = setting(
        factory=dict, help="its parameters (`vflnet attacks` / `vflnet defenses` list them)"
    )


@dataclass
class TraceConfig:
    """Wire recording."""

    parties: list[str] = setting(
        factory=list, help="parties whose wire is recorded to `<run>/traces/NAME.trace` (`all` = every party)"
    )
    max_mb: float = setting(1024.0, "size cap per trace file; recording stops at the cap and says so")


@dataclass
class Config:
    run: RunConfig = setting(factory=RunConfig, help="run id, run directory and seed")
    protocol: ProtocolConfig = setting(factory=ProtocolConfig, help="the training protocol")
    data: DataConfig = setting(factory=DataConfig, help="the dataset")
    parties: list[PartyConfig] = setting(factory=list, help="the roster: a list of parties")
    model: TopConfig = setting(factory=TopConfig, help="the active party's top model")
    train: TrainConfig = setting(factory=TrainConfig, help="training")
    predict: PredictConfig = setting(factory=PredictConfig, help="the prediction (serving) phase")
    model_release: list[ModelReleaseConfig] = setting(
        factory=list,
        help="a list of model releases: model parts one party hands to another (a threat model's white-box knowledge)",
    )
    transport: TransportConfig = setting(factory=TransportConfig, help="the wire")
    runtime: RuntimeConfig = setting(factory=RuntimeConfig, help="per-process settings")
    attacks: list[PluginConfig] = setting(factory=list, help="a list of attacks, each on one party's wire")
    defenses: list[PluginConfig] = setting(factory=list, help="a list of defenses, each owned by one party")
    trace: TraceConfig = setting(factory=TraceConfig, help="wire recording")
    plugins: list[str] = setting(
        factory=list,
        help="extra Python modules imported by every process before names are resolved; they may register "
        "attacks, defenses, datasets, model kinds and protocols (`vflnet.registry`)",
    )
    source: str = field(default="", metadata={"internal": True})

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
        own = [self.active] if self.active.features is not None else []
        return own + self.passives

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)


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


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {
            f.name: _to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not f.metadata.get("internal")
        }
    if isinstance(obj, list):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


# ------------------------------------------------------------------------------------ validation
def _positive(cfg_value: float, key: str, source: str, *, allow_zero: bool = False) -> None:
    if cfg_value < 0 or (cfg_value == 0 and not allow_zero):
        raise ConfigError(
            source, key, f"expected a {'non-negative' if allow_zero else 'positive'} value, got {cfg_value}"
        )


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
        if p.role == "passive" and p.features is None:
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
    if cfg.active.features is None and cfg.active.bottom is not None:
        raise ConfigError(src, "parties", "the active party has a bottom model but no features")
    outs = [p.bottom.out for p in cfg.feature_parties if p.bottom is not None]
    if cfg.protocol.aggregation == "sum" and len(set(outs)) > 1:
        raise ConfigError(src, "protocol.aggregation", f"'sum' needs equal bottom output sizes, got {outs}")
    t = cfg.train
    for key, value in [
        ("train.epochs", t.epochs),
        ("train.batch_size", t.batch_size),
        ("train.eval_every", t.eval_every),
        ("train.eval_batch_size", t.eval_batch_size),
        ("train.checkpoint_every", t.checkpoint_every),
    ]:
        _positive(value, key, src)
    _positive(t.max_steps, "train.max_steps", src, allow_zero=True)
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
    validate(cfg)
    return cfg


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
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "", f"not valid YAML: {exc}") from exc
    return data


def dump(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
