"""Loading a config with every check: the schema (`vflnet.config`), then the cross-checks that need
the rest of the package.

- the ``plugins:`` modules import (they may register into any registry, so they come first);
- ``protocol.kind`` is a registered protocol, ``protocol.params`` its settings, and its own checks hold;
- ``data.dataset`` and its params against `vflnet.registry.DATASETS`;
- every model block's ``kind`` against `vflnet.registry.MODELS` (can it sit there, does it take
  image regions);
- attack and defense names, the roles they sit at and their params against ATTACKS and DEFENSES, and
  that every attack's party can have the knowledge it declares (`vflnet.threat.knowledge`); that the
  protocol applies every defense's hook point (`Protocol.defense_hooks`) and has every method an
  attack taps or rewrites (`Protocol.methods`), in a direction and on a side that exist;
- every key the file or the command line set is read in this config (`vflnet.config.unread_keys`:
  the schema's declared readers, `ModelKind.reads`, `Protocol.train_reads`, `Protocol.settings`);
- with ``check_data``: the roster against the dataset's shape (columns and regions in range, no two
  parties holding the same feature unless ``data.allow_overlap``, the width of a top-less aggregate
  equal to the class count).

Every process that reads a config calls :func:`load_config` (or :func:`config_from_dict` for a
mapping); every failure is a :class:`vflnet.config.ConfigError` naming the file, the key and what
was expected.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from vflnet.config import NO_MODEL, Config, ConfigError, ModelConfig, parse, read_yaml, unread_keys
from vflnet.data.datasets import Dataset, check_params, load_dataset
from vflnet.data.partition import flat_columns, select_features, takes_image
from vflnet.data.plan import check_dataset_plan
from vflnet.interceptors.events import DIRECTIONS, PARTY_SIDES
from vflnet.models.device import DEVICE_NAMES, resolve_device
from vflnet.overrides import apply_overrides, blame, parse_overrides
from vflnet.registry import (
    ATTACKS,
    DEFENSES,
    MODELS,
    PROTOCOLS,
    ParamError,
    Registry,
    load_plugin_modules,
    validate_params,
)
from vflnet.threat.attack import Tap
from vflnet.threat.knowledge import missing_knowledge
from vflnet.threat.model_needs import model_problems


def load_config(
    path: str | Path,
    *,
    check_data: bool = True,
    overrides: Sequence[str] = (),
    here: Sequence[str] | None = None,
    launcher: str | None = None,
) -> Config:
    """Read, parse and check a config file; by default also against the dataset's shape. ``overrides``
    are the command line's ``KEY=VALUE`` strings (`vflnet.overrides`), set into the file's mapping
    first; an error about an overridden key names the command line. ``here``: the parties that run on
    this machine (default: all), whose devices torch must be able to use here. ``launcher``: the command
    the config is loaded for (``run``: `vflnet run`, which sets some per-party keys itself)."""
    parsed = parse_overrides(overrides)
    data = apply_overrides(read_yaml(path), parsed)
    with blame(parsed):
        cfg = parse(data, str(path))
        check(cfg, check_data=check_data, here=here, launcher=launcher)
    return cfg


def config_from_dict(data: Any, source: str = "", *, check_data: bool = False) -> Config:
    """Parse and check a config given as a mapping (``source`` names it in errors)."""
    cfg = parse(data, source)
    check(cfg, check_data=check_data)
    return cfg


def check(
    cfg: Config,
    *,
    check_data: bool = False,
    here: Sequence[str] | None = None,
    launcher: str | None = None,
) -> None:
    """The checks of a parsed config that need the registries (and, with ``check_data``, the dataset);
    ``here``: the parties that run on this machine (default: all); ``launcher``: see `load_config`."""
    src = cfg.source
    try:
        load_plugin_modules(cfg.plugins)
    except ImportError as exc:
        raise ConfigError(src, "plugins", f"cannot import: {exc}") from exc
    _check_protocol(cfg)
    _check_dataset_name(cfg)
    _check_models(cfg)
    _check_plugins(cfg)
    _check_devices(cfg, here)
    _check_unread(cfg, launcher)
    if check_data:
        check_against_dataset(cfg)


def _check_protocol(cfg: Config) -> None:
    """``protocol.kind`` names a registered protocol; its own settings (``protocol.params``) and its
    own requirements on the rest of the config hold."""
    src = cfg.source
    try:
        protocol = PROTOCOLS.get(cfg.protocol.kind)
    except KeyError as exc:
        raise ConfigError(src, "protocol.kind", str(exc)) from exc
    for key in sorted(set(cfg.protocol.params) - set(protocol.params)):
        takers = sorted(n for n, p in PROTOCOLS.all().items() if key in p.params)
        raise ConfigError(
            src,
            f"protocol.params.{key}",
            f"protocol {protocol.name!r} takes no parameter(s) [{key!r}], so it would have no effect; its "
            f"parameters: {sorted(protocol.params) or 'none'}; protocols that take it: {takers or 'none'}",
        )
    with _param_errors(src, "protocol.params"):
        cfg.protocol.params = validate_params("protocol", protocol.name, protocol.params, cfg.protocol.params)
    for key, message in protocol.check_config(cfg):
        raise ConfigError(src, key, message)


@contextlib.contextmanager
def _param_errors(source: str, section: str) -> Iterator[None]:
    """A `validate_params` error as a config error: a bad or unread parameter names its dotted key
    (``protocol.params.key_bits``), an unknown one the mapping (``section``)."""
    try:
        yield
    except ParamError as exc:
        raise ConfigError(source, f"{section}.{exc.key}", str(exc)) from exc
    except ValueError as exc:
        raise ConfigError(source, section, str(exc)) from exc


def _check_unread(cfg: Config, launcher: str | None) -> None:
    """Every key the file or the command line set is read in this config: one that would have no effect
    (its declared readers, `vflnet.config.setting`'s ``reads``, say why) is refused, naming who reads it."""
    for key, why in unread_keys(cfg, launcher):
        raise ConfigError(cfg.source, key, f"not read: {why}")


def _check_dataset_name(cfg: Config) -> None:
    try:
        with _param_errors(cfg.source, "data.params"):
            check_params(cfg.data.dataset, cfg.data.params)
    except KeyError as exc:  # an unknown dataset (the message lists the known ones)
        raise ConfigError(cfg.source, "data.dataset", str(exc.args[0] if exc.args else exc)) from exc


def _model_kind(cfg: Config, block: ModelConfig, key: str, where: str) -> Any:
    """The registry entry of a model block's kind, which must be able to sit at ``where`` (bottom/top)."""
    fits = [name for name, kind in MODELS.all().items() if getattr(kind, f"is_{where}")]
    expected = f"expected one of {', '.join(repr(n) for n in fits)} ({where} model kinds; `vflnet models`)"
    if block.kind not in MODELS:
        raise ConfigError(cfg.source, key, f"unknown model kind {block.kind!r}; {expected}")
    kind = MODELS.get(block.kind)
    if not getattr(kind, f"is_{where}"):
        raise ConfigError(cfg.source, key, f"{block.kind!r} cannot be a {where} model; {expected}")
    return kind


def _check_models(cfg: Config) -> None:
    for i, p in enumerate(cfg.parties):
        if p.bottom is None:
            continue
        key = f"parties[{i}].bottom.kind"
        kind = _model_kind(cfg, p.bottom, key, "bottom")
        for top_only in ("input_activation", "output_activation"):  # a bottom would ignore them
            if getattr(p.bottom, top_only) != "none":
                raise ConfigError(
                    cfg.source, f"parties[{i}].bottom.{top_only}", "applies to the top model only (model.top)"
                )
        if kind.image_input and p.features is not None and p.features.region is None:
            raise ConfigError(
                cfg.source, key, f"a {p.bottom.kind} bottom needs an image 'region', not 'columns'"
            )
    _model_kind(cfg, cfg.model.top, "model.top.kind", "top")


def _check_devices(cfg: Config, here: Sequence[str] | None) -> None:
    """``train.device`` and each ``parties[].device``: a device under a protocol that moves its tensors
    there, at a party whose defenses and attacks act on what it sends (host arrays) and not inside its
    models (their own randomness is drawn on the CPU), and, for the parties ``here`` (default: all),
    a device torch can use on this machine (a lab's other machines may hold the GPUs)."""
    src = cfg.source
    for i, p in enumerate(cfg.parties):
        key = f"parties[{i}].device" if p.device else "train.device"
        name = cfg.device(p)
        if p.role == "coordinator":
            if p.device:
                raise ConfigError(src, key, "the coordinator trains no model; set devices on the parties")
            continue
        if name == "cpu":
            continue
        if not re.fullmatch(r"cuda(:\d+)?", name):
            raise ConfigError(src, key, f"expected {DEVICE_NAMES}, got {name!r}")
        protocol = PROTOCOLS.get(cfg.protocol.kind)
        if not protocol.trains_on_device:
            on = [n for n, c in PROTOCOLS.all().items() if c.trains_on_device]
            raise ConfigError(
                src, key, f"protocol {protocol.name!r} trains on the CPU only; {name!r} needs one of {on}"
            )
        inside = [
            d.name for d in cfg.defenses if d.party == p.name and DEFENSES.get(d.name).acts_on != "upload"
        ]
        own_view = [
            a.name
            for a in cfg.attacks
            if a.party == p.name
            and (ATTACKS.get(a.name).wants_own_view or ATTACKS.get(a.name).changes_own_data)
        ]
        if inside or own_view:
            what = ", ".join([f"defense {n!r}" for n in inside] + [f"attack {n!r}" for n in own_view])
            raise ConfigError(
                src,
                key,
                f"{p.name} trains on {name!r} but {what} acts inside its training (on the CPU only); "
                "use device 'cpu' for this party",
            )
        if here is not None and p.name not in here:
            continue
        try:  # last: the checks above hold on any machine, this one on the machine that runs the party
            resolve_device(name)
        except RuntimeError as exc:
            raise ConfigError(src, key, str(exc)) from exc


def _check_plugins(cfg: Config) -> None:
    src = cfg.source
    roles = {p.name: p.role for p in cfg.parties}
    registries: tuple[tuple[str, Registry], ...] = (("attacks", ATTACKS), ("defenses", DEFENSES))
    for section, registry in registries:
        for i, entry in enumerate(getattr(cfg, section)):
            key = f"{section}[{i}]"
            try:
                cls = registry.get(entry.name)
            except KeyError as exc:
                raise ConfigError(src, f"{key}.name", str(exc)) from exc
            if roles[entry.party] not in cls.roles:
                raise ConfigError(
                    src,
                    f"{key}.party",
                    f"{entry.name!r} sits at {sorted(cls.roles)}, but {entry.party!r} is a {roles[entry.party]} party",
                )
            with _param_errors(src, f"{key}.params"):
                validate_params(registry.kind, entry.name, cls.params, entry.params)
            if section == "defenses":
                _check_defense_hook(cfg, key, entry.name, cls.acts_on, "acts on")
                for hook in sorted(cls.requires):
                    _check_defense_hook(cfg, key, entry.name, hook, "needs the hook point")
            if section == "attacks":  # its taps can match; what its threat model grants reaches its party
                _check_attack_taps(cfg, key, entry.name, cls.taps + cls.rewrites)
                provides = {n: p.provides for n, p in PROTOCOLS.all().items()}
                for problem in missing_knowledge(cfg, entry.party, cls, provides):
                    raise ConfigError(
                        src, f"{key}.name", f"attack {entry.name!r} at {entry.party!r} {problem}"
                    )
                for bad_key, problem in model_problems(cls.model_needs, cfg, entry.party):
                    raise ConfigError(src, bad_key, f"attack {entry.name!r}: {problem}")
            for bad_key, problem in cls.check_config(cfg, entry.party):
                raise ConfigError(src, bad_key, f"{registry.kind} {entry.name!r}: {problem}")


def _check_defense_hook(cfg: Config, key: str, name: str, hook: str, verb: str) -> None:
    """The run's protocol applies the hook point the defense acts on (`Protocol.defense_hooks`)."""
    offered = PROTOCOLS.get(cfg.protocol.kind).defense_hooks
    if hook in offered:
        return
    elsewhere = [n for n, p in PROTOCOLS.all().items() if hook in p.defense_hooks]
    raise ConfigError(
        cfg.source,
        f"{key}.name",
        f"defense {name!r} {verb} {hook!r}, which protocol {cfg.protocol.kind!r} does not apply "
        f"(it offers {sorted(offered) or 'no defense hooks'}); protocols that apply {hook!r}: "
        f"{elsewhere or 'none'}",
    )


def _check_attack_taps(cfg: Config, key: str, name: str, taps: tuple[Tap, ...]) -> None:
    """Every tap and rewrite of the attack names a direction, a side of its party's channel and a
    method of the run's protocol: one that never matches would leave the attack seeing nothing."""
    methods = PROTOCOLS.get(cfg.protocol.kind).method_names()
    for tap in taps:
        for what, value, valid in (
            ("direction", tap.direction, DIRECTIONS),
            ("side", tap.side, PARTY_SIDES),
            ("method", tap.method, methods),
        ):
            if value not in valid:
                raise ConfigError(
                    cfg.source,
                    f"{key}.name",
                    f"attack {name!r} taps {tap.method} {tap.direction} on the {tap.side} side, but {what} "
                    f"{value!r} never occurs under protocol {cfg.protocol.kind!r}; valid: {list(valid)}",
                )


def _check_disjoint_features(cfg: Config, data: Dataset) -> None:
    """No two parties hold the same feature column (or pixel)."""
    held: list[tuple[str, set[int]]] = []
    for i, party in enumerate(cfg.parties):
        if party.features is None:
            continue
        mine = set(flat_columns(data, party.features).tolist())
        for other, theirs in held:
            shared = sorted(mine & theirs)
            if shared:
                shown = ", ".join(map(str, shared[:10])) + (", ..." if len(shared) > 10 else "")
                raise ConfigError(
                    cfg.source,
                    f"parties[{i}].features",
                    f"{party.name!r} and {other!r} both hold {len(shared)} feature column(s) [{shown}] "
                    "(flat indices); give each party its own columns, or set data.allow_overlap: true",
                )
        held.append((party.name, mine))


def check_against_dataset(cfg: Config) -> None:
    """Config checks that need the dataset: columns/regions in range and output sizes vs classes."""
    src = cfg.source
    try:
        data = load_dataset(cfg.data.dataset, cfg.data.params)
    except (KeyError, ValueError, OSError) as exc:
        raise ConfigError(src, "data", str(exc).strip("'\"")) from exc
    for i, party in enumerate(cfg.parties):
        if party.features is None:
            continue
        try:
            assert party.bottom is not None
            select_features(data, party.features, as_image=takes_image(party.bottom))
        except ValueError as exc:
            raise ConfigError(src, f"parties[{i}].features", str(exc)) from exc
    if not cfg.data.allow_overlap:
        _check_disjoint_features(cfg, data)
    check_dataset_plan(cfg, data)  # a degenerate run (vflnet/data/plan.py)
    outs = [p.bottom.out for p in cfg.feature_parties if p.bottom is not None]
    if cfg.model.top.kind == NO_MODEL:
        width = outs[0] if cfg.protocol.aggregation == "sum" else sum(outs)
        if width != data.n_classes:
            raise ConfigError(
                src,
                "model.top.kind",
                f"with no top model the aggregated embedding ({width}) must equal the number of classes "
                f"of {cfg.data.dataset!r} ({data.n_classes})",
            )
