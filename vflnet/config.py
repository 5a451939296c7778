"""Run configuration: typed sections, strict YAML parsing, and one clear error per mistake.

Every section is a dataclass; :func:`parse` walks the YAML against the annotations and rejects an
unknown key, a wrong type or a bad value with a :class:`ConfigError` that names the file, the dotted
key and what was expected. :func:`load` adds the checks that need the dataset (column ranges, class
counts) so ``vflnet config check`` catches them before any process starts.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    def __init__(self, source: str, key: str, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        where = f"{source}: " if source else ""
        super().__init__(f"{where}key '{key}': {message}" if key else f"{where}{message}")


# ---------------------------------------------------------------------------------------- sections
@dataclass
class RunConfig:
    id: str = ""  # empty: `vflnet run` derives one from the file name and the time
    dir: str = "runs"  # parent folder of run directories
    seed: int = 0


@dataclass
class HEConfig:
    key_bits: int = 2048
    frac_bits: int = 20
    allow_insecure_keys: bool = False  # needed for key_bits < 1024 (tests only)
    workers: int = 1


@dataclass
class ProtocolConfig:
    kind: Literal["split", "split-he", "param-server"] = "split"
    aggregation: Literal["concat", "sum"] = "concat"
    static: bool = False  # param-server: the coordinator never applies updates (CAFE's strongest setting)
    he: HEConfig = field(default_factory=HEConfig)


@dataclass
class DataConfig:
    dataset: str = "digits"
    params: dict[str, Any] = field(default_factory=dict)
    test_fraction: float = 0.2
    normalize: Literal["auto", "none", "standard", "minmax"] = "auto"


@dataclass
class FeaturesConfig:
    columns: str | list[int] | None = None  # "0:32" / "0:8,16:24" / [0, 3, 5]
    region: list[int] | None = None  # image rectangle [row0, row1, col0, col1], half-open


@dataclass
class ModelConfig:
    kind: Literal["none", "linear", "mlp", "cnn", "cafe-conv", "cafe-fc"] = "mlp"
    hidden: list[int] = field(default_factory=list)
    out: int = 0  # bottom models: embedding size; top models: ignored (number of classes)
    bias: bool = True
    activation: Literal["relu", "tanh", "sigmoid"] = "relu"
    channels: list[int] = field(default_factory=lambda: [8, 16])  # cnn only
    input_activation: Literal["none", "relu", "tanh", "sigmoid"] = "none"  # top only: applied to the aggregate


@dataclass
class PartyConfig:
    name: str = ""
    role: Literal["coordinator", "active", "passive"] = "passive"
    address: str = ""  # host:port this party serves on; empty = any free loopback port (local runs)
    via: str = ""  # host:port of a proxy in front of this party: the address other parties are given
    features: FeaturesConfig | None = None
    bottom: ModelConfig | None = None
    sample_fraction: float = 1.0  # keep a seeded subset of IDs (exercises alignment)


@dataclass
class TopConfig:
    top: ModelConfig = field(default_factory=lambda: ModelConfig(kind="linear"))


@dataclass
class OptimizerConfig:
    kind: Literal["sgd", "momentum", "adam"] = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class LRScheduleConfig:
    kind: Literal["none", "step"] = "none"
    step_size: int = 1  # epochs
    gamma: float = 0.1


@dataclass
class TrainConfig:
    epochs: int = 5
    batch_size: int = 64
    drop_last: bool = False
    max_steps: int = 0  # stop after this many training steps (0 = no limit)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr_schedule: LRScheduleConfig = field(default_factory=LRScheduleConfig)
    eval_every: int = 1  # epochs
    eval_batch_size: int = 512
    checkpoint_every: int = 1  # epochs


@dataclass
class TLSConfig:
    enabled: bool = False
    ca: str = ""
    cert: str = ""  # may contain {name}
    key: str = ""  # may contain {name}


@dataclass
class TransportConfig:
    max_message_mb: float = 64.0  # per gRPC message; a larger message travels in chunks
    max_payload_mb: float = 1024.0  # per logical message, chunked or not
    rpc_timeout_s: float = 60.0
    join_timeout_s: float = 120.0
    idle_timeout_s: float = 600.0  # a party exits if the coordinator is silent this long
    tls: TLSConfig = field(default_factory=TLSConfig)
    allow_plaintext_remote: bool = False  # plaintext gRPC to a non-loopback address needs this


@dataclass
class RuntimeConfig:
    torch_threads: int = 1
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


@dataclass
class PluginConfig:
    name: str = ""
    party: str = ""
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceConfig:
    parties: list[str] = field(default_factory=list)  # record the wire of these parties ("all" = every one)
    max_mb: float = 1024.0  # per trace file; recording stops (and says so) at the cap


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parties: list[PartyConfig] = field(default_factory=list)
    model: TopConfig = field(default_factory=TopConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    attacks: list[PluginConfig] = field(default_factory=list)
    defenses: list[PluginConfig] = field(default_factory=list)
    trace: TraceConfig = field(default_factory=TraceConfig)
    plugins: list[str] = field(default_factory=list)  # extra modules that register attacks/defenses
    source: str = field(default="", metadata={"internal": True})

    # --------------------------------------------------------------------------- convenience
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
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false", type(None): "null"}.get(
        tp, str(tp)
    )


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
            raise ConfigError(source, dotted, f"unknown key; allowed here: {', '.join(sorted(allowed))}")
        kwargs[key] = _convert(value, hints[key], dotted, source)
    return cls(**kwargs)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {
            f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.metadata.get("internal")
        }
    if isinstance(obj, list):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


# ------------------------------------------------------------------------------------ validation
def _positive(cfg_value: float, key: str, source: str, *, allow_zero: bool = False) -> None:
    if cfg_value < 0 or (cfg_value == 0 and not allow_zero):
        raise ConfigError(source, key, f"expected a {'non-negative' if allow_zero else 'positive'} value, got {cfg_value}")


def validate(cfg: Config) -> None:
    """Checks that need no dataset: roster shape, model/aggregation consistency, value ranges."""
    src = cfg.source
    if not cfg.parties:
        raise ConfigError(src, "parties", "the roster is empty; list a coordinator, an active and >= 1 passive party")
    names = [p.name for p in cfg.parties]
    for i, p in enumerate(cfg.parties):
        if not p.name:
            raise ConfigError(src, f"parties[{i}].name", "every party needs a name")
        if p.name in names[:i]:
            raise ConfigError(src, f"parties[{i}].name", f"duplicate party name {p.name!r}")
    roles = [p.role for p in cfg.parties]
    if roles.count("coordinator") != 1:
        raise ConfigError(src, "parties", f"exactly one coordinator is required, found {roles.count('coordinator')}")
    if roles.count("active") != 1:
        raise ConfigError(src, "parties", f"exactly one active party is required, found {roles.count('active')}")
    if roles.count("passive") < 1:
        raise ConfigError(src, "parties", "at least one passive party is required")
    for i, p in enumerate(cfg.parties):
        key = f"parties[{i}]"
        if p.role == "coordinator" and (p.features is not None or p.bottom is not None):
            raise ConfigError(src, f"{key}.features", "the coordinator holds no features or model")
        if p.role == "passive" and p.features is None:
            raise ConfigError(src, f"{key}.features", f"passive party {p.name!r} needs features (columns or region)")
        if p.features is not None:
            if (p.features.columns is None) == (p.features.region is None):
                raise ConfigError(src, f"{key}.features", "give exactly one of 'columns' or 'region'")
            if p.features.region is not None and len(p.features.region) != 4:
                raise ConfigError(src, f"{key}.features.region", "expected [row0, row1, col0, col1]")
            if p.bottom is None:
                raise ConfigError(src, f"{key}.bottom", f"party {p.name!r} holds features and needs a bottom model")
            if p.bottom.kind == "none":
                raise ConfigError(src, f"{key}.bottom.kind", "a bottom model cannot be 'none'")
            if p.bottom.out <= 0:
                raise ConfigError(src, f"{key}.bottom.out", "expected the embedding size (a positive integer)")
            if p.bottom.kind in ("cnn", "cafe-conv", "cafe-fc") and p.features.region is None:
                raise ConfigError(src, f"{key}.bottom.kind", f"a {p.bottom.kind} bottom needs an image 'region', not 'columns'")
        if not 0 < p.sample_fraction <= 1:
            raise ConfigError(src, f"{key}.sample_fraction", f"expected a value in (0, 1], got {p.sample_fraction}")
    if cfg.active.features is None and cfg.active.bottom is not None:
        raise ConfigError(src, "parties", "the active party has a bottom model but no features")
    outs = [p.bottom.out for p in cfg.feature_parties if p.bottom is not None]
    if cfg.protocol.aggregation == "sum" and len(set(outs)) > 1:
        raise ConfigError(src, "protocol.aggregation", f"'sum' needs equal bottom output sizes, got {outs}")
    if cfg.protocol.kind == "split-he":
        if cfg.protocol.aggregation != "sum" or cfg.model.top.kind != "none":
            raise ConfigError(
                src, "protocol.kind", "split-he follows paper 004: aggregation 'sum' with model.top.kind 'none'"
            )
        if cfg.protocol.he.key_bits < 1024 and not cfg.protocol.he.allow_insecure_keys:
            raise ConfigError(
                src, "protocol.he.key_bits", "keys under 1024 bits are insecure; set allow_insecure_keys: true (tests only)"
            )
    t = cfg.train
    for key, value in [("train.epochs", t.epochs), ("train.batch_size", t.batch_size), ("train.eval_every", t.eval_every),
                       ("train.eval_batch_size", t.eval_batch_size), ("train.checkpoint_every", t.checkpoint_every)]:
        _positive(value, key, src)
    _positive(t.max_steps, "train.max_steps", src, allow_zero=True)
    _positive(t.optimizer.lr, "train.optimizer.lr", src)
    _positive(t.optimizer.weight_decay, "train.optimizer.weight_decay", src, allow_zero=True)
    if len(t.optimizer.betas) != 2:
        raise ConfigError(src, "train.optimizer.betas", "expected two numbers")
    if not 0 < cfg.data.test_fraction < 1:
        raise ConfigError(src, "data.test_fraction", f"expected a value in (0, 1), got {cfg.data.test_fraction}")
    _positive(cfg.transport.rpc_timeout_s, "transport.rpc_timeout_s", src)
    _positive(cfg.transport.join_timeout_s, "transport.join_timeout_s", src)
    _positive(cfg.transport.idle_timeout_s, "transport.idle_timeout_s", src)
    _positive(cfg.transport.max_message_mb, "transport.max_message_mb", src)
    _positive(cfg.transport.max_payload_mb, "transport.max_payload_mb", src)
    tls = cfg.transport.tls
    if tls.enabled:
        for k in ("ca", "cert", "key"):
            if not getattr(tls, k):
                raise ConfigError(src, f"transport.tls.{k}", "required when transport.tls.enabled is true")
    _positive(cfg.runtime.torch_threads, "runtime.torch_threads", src)
    _validate_plugins(cfg)


def _validate_plugins(cfg: Config) -> None:
    from vflnet.registry import ATTACKS, DEFENSES, load_plugin_modules, validate_params

    src = cfg.source
    try:
        load_plugin_modules(cfg.plugins)
    except ImportError as exc:
        raise ConfigError(src, "plugins", f"cannot import: {exc}") from exc
    roles = {p.name: p.role for p in cfg.parties}
    for section, registry in (("attacks", ATTACKS), ("defenses", DEFENSES)):
        for i, entry in enumerate(getattr(cfg, section)):
            key = f"{section}[{i}]"
            try:
                cls = registry.get(entry.name)
            except KeyError as exc:
                raise ConfigError(src, f"{key}.name", str(exc).strip('"')) from exc
            if entry.party not in roles:
                raise ConfigError(src, f"{key}.party", f"no party {entry.party!r} in the roster")
            if roles[entry.party] not in cls.roles:
                raise ConfigError(src, f"{key}.party", f"{entry.name!r} sits at {sorted(cls.roles)}, "
                                  f"but {entry.party!r} is a {roles[entry.party]} party")
            try:
                validate_params(registry.kind, entry.name, cls.params, entry.params)
            except ValueError as exc:
                raise ConfigError(src, f"{key}.params", str(exc)) from exc
    for name in cfg.trace.parties:
        if name != "all" and name not in roles:
            raise ConfigError(src, "trace.parties", f"no party {name!r} in the roster")
    _positive(cfg.trace.max_mb, "trace.max_mb", src)


def from_dict(data: Any, source: str = "") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(source, "", "the config must be a YAML mapping at the top level")
    cfg = parse_section(Config, data, "", source)
    cfg.source = source
    validate(cfg)
    return cfg


def load(path: str | Path, *, check_data: bool = True) -> Config:
    """Parse, validate, and (by default) check the roster against the dataset's shape."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read the file: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "", f"not valid YAML: {exc}") from exc
    cfg = from_dict(data, str(path))
    if check_data:
        from vflnet.data.partition import check_against_dataset

        check_against_dataset(cfg)
    return cfg


def dump(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
