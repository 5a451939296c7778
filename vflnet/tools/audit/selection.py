"""Which registered attacks apply to a run, derived from the contracts, and why each other one does not.

For every attack of ``ATTACKS`` and every position it could hold, in this order (the first failing
check is the reason it is skipped):

1. its position: a party of the run whose role is among the attack's ``roles``;
2. the messages it needs: every tap and rewrite names a method the run's protocol sends
   (``Protocol.method_names()``);
3. the knowledge it needs (``vflnet.threat.knowledge``): what the run provides, or what the threat model
   may grant, as an assumption the report lists (a model release to the attacker: ``GRANTS``);
4. the config with the attack (and its grants) attached passes every check a run passes
   (``vflnet.validation``: the attack's own ``check_config``, the protocol's, the dataset's);
5. the attack can be built at its party as the party builds it, with what its threat model grants
   (``threat_model_knowledge``: e.g. a binary-only attack refuses a 10-class dataset).

A man in the middle: an attack that needs nothing beyond the messages it taps (no knowledge, no own
view, no rewrite) can be run by anyone who reads the channel of the party it taps at. That holds when
``transport.tls`` is off; under mutual TLS such an observer sees only ciphertext.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from vflnet.config import Config, ConfigError
from vflnet.registry import ATTACKS, PROTOCOLS
from vflnet.threat.attack import Attack, AttackContext
from vflnet.threat.knowledge import KNOWLEDGE, needs, threat_model_knowledge, why_unavailable
from vflnet.validation import config_from_dict

# How the report describes a kind of knowledge an attack is given: public, assumed by its threat model
# (ground truth handed over by assumption), or granted by the audit as an explicit protocol step. Any
# other kind is something the run itself provides (its own rows, the prediction phase, ...).
KNOWLEDGE_STANDING = {
    "public_key": "public",
    "target_ids": "assumed by the threat model",
    "aux_labels": "assumed by the threat model",
    "released_model": "granted: a model release to the attacker after training (model_release)",
}

# Budget parameters: an attack that declares one of these gets this value (per budget), so the audit's
# cost stays bounded whatever the attack's default (0 = every batch of the run).
BUDGET_PARAMS = {"max_batches": {"quick": 2, "default": 4}}


@dataclass
class Candidate:
    """One attack at one position: applicable (with what it is granted) or skipped (with why)."""

    attack: str
    party: str  # the host party (a man in the middle: the party whose channel it reads)
    position: str  # in words
    applies: bool
    reason: str = ""  # why not, one line
    mitm: bool = False
    rewrites: bool = False
    scored: bool = True  # its class scores its output against ground truth (else it is not run)
    params: dict[str, Any] = field(default_factory=dict)
    grants: list[dict[str, Any]] = field(default_factory=list)  # model_release entries the audit adds
    knowledge: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, description, standing)

    @property
    def key(self) -> str:
        return f"{self.attack}@{'mitm:' if self.mitm else ''}{self.party}"

    @property
    def entry_key(self) -> str:
        """Its entry's name in the run's summary.json (``effects``): ``name@party``."""
        return f"{self.attack}@{self.party}"

    def entry(self) -> dict[str, Any]:
        return {"name": self.attack, "party": self.party, "params": dict(self.params)}


def _owned_modules(cfg: Config, party: str) -> list[str]:
    p = cfg.party(party)
    mods = ["bottom"] if p.bottom is not None else []
    if p.role == "active" and cfg.model.top.kind != "none":
        mods.append("top")
    return mods


def _grant_released_model(cfg: Config, party: str) -> list[dict[str, Any]]:
    """Every other party hands the models it owns to ``party`` after training."""
    return [
        {"owner": p.name, "recipient": party, "modules": _owned_modules(cfg, p.name), "when": "end"}
        for p in cfg.parties
        if p.role != "coordinator" and p.name != party and _owned_modules(cfg, p.name)
    ]


GRANTS = {"released_model": _grant_released_model}


def with_entries(
    base: dict[str, Any], attacks: list[dict[str, Any]], releases: list[dict[str, Any]]
) -> dict[str, Any]:
    """The config mapping with these attacks and, added to its own, these model releases (no duplicate)."""
    data = copy.deepcopy(base)
    data["attacks"] = copy.deepcopy(attacks)
    have = list(data.get("model_release") or [])
    for r in releases:
        if not any(
            (h["owner"], h["recipient"], sorted(h["modules"]), h.get("when", "end"))
            == (r["owner"], r["recipient"], sorted(r["modules"]), r["when"])
            for h in have
        ):
            have.append(copy.deepcopy(r))
    data["model_release"] = have
    return data


def _where(cfg: Config, party: str) -> str:
    role = cfg.party(party).role
    return "the coordinator" if role == "coordinator" else f"{role} party {party}"


def select(base: dict[str, Any], cfg: Config, budget: str) -> list[Candidate]:
    """Every (attack, position) of the registry, applicable or skipped with its reason. ``base`` is the
    user's config as a mapping (no attacks), ``cfg`` the same config checked."""
    protocol = PROTOCOLS.get(cfg.protocol.kind)
    methods = protocol.method_names()
    out: list[Candidate] = []
    for name, cls in ATTACKS.all().items():
        hosts = [p.name for p in cfg.parties if p.role in cls.roles]
        if not hosts:
            out.append(
                Candidate(
                    name,
                    "-",
                    f"a {' or '.join(sorted(cls.roles))} party",
                    False,
                    f"sits at a {' or '.join(sorted(cls.roles))} party; the run has none",
                )
            )
            continue
        for party in hosts:
            cand = _check(base, cfg, name, cls, party, methods, budget)
            out.append(cand)
            mitm = _man_in_the_middle(cfg, name, cls, party, cand) if cand.applies else None
            if mitm is not None:
                out.append(mitm)
    return out


def _check(
    base: dict[str, Any], cfg: Config, name: str, cls: Any, party: str, methods: list[str], budget: str
) -> Candidate:
    cand = Candidate(
        name, party, _where(cfg, party), False, rewrites=bool(cls.rewrites or cls.changes_own_data)
    )
    cand.params = {k: v[budget] for k, v in BUDGET_PARAMS.items() if k in cls.params}
    cand.scored = cls.score.__func__ is not Attack.score.__func__  # type: ignore[attr-defined]
    absent = sorted({t.method for t in cls.taps + cls.rewrites if t.method not in methods})
    if absent:
        cand.reason = (
            f"needs {', '.join(absent)} messages, which protocol {cfg.protocol.kind!r} never sends "
            f"(it sends {', '.join(methods)})"
        )
        return cand
    for kind in needs(cls):
        spec = KNOWLEDGE.get(kind)
        if spec is None:
            cand.reason = f"declares knowledge {kind!r}, which is no known kind"
            return cand
        why = why_unavailable(spec, cfg, party, {n: p.provides for n, p in PROTOCOLS.all().items()})
        standing = KNOWLEDGE_STANDING.get(kind, "provided by the run")
        if why and kind in GRANTS:
            cand.grants += GRANTS[kind](cfg, party)
            why = None if cand.grants else f"{why}, and no other party owns a model to release"
        elif kind in KNOWLEDGE_STANDING and kind not in GRANTS:
            standing = KNOWLEDGE_STANDING[kind]
        if why:
            cand.reason = f"needs {kind} ({spec.description}); {why}"
            return cand
        if kind == "released_model" and not cand.grants:
            standing = "provided by the run (its model_release)"
        cand.knowledge.append((kind, spec.description, standing))
    trial = with_entries(base, [cand.entry()], cand.grants)
    try:
        trial_cfg = config_from_dict(trial, cfg.source, check_data=True)
    except ConfigError as exc:
        cand.reason = _refusal(exc, name)
        return cand
    try:  # as the party builds it (vflnet.threat.interception.party_interception)
        attack = cls(AttackContext(party, cfg.party(party).role, trial_cfg.run.id, {}), **cand.params)
        threat_model_knowledge(trial_cfg, party, attack)
    except (ValueError, KeyError) as exc:
        cand.reason = str(exc).strip("'\"")
        return cand
    cand.applies = True
    return cand


def _refusal(exc: ConfigError, name: str) -> str:
    """A config check's refusal of the trial config, in the user's terms: the attack the audit added is
    'its' (not ``attacks[0]``, which the user's config does not have), and its name is not repeated."""
    message = exc.message.removeprefix(f"attack {name!r}: ").removeprefix(f"attack {name!r} at ")
    key = re.sub(r"^attacks\[0\]\.?", "its ", exc.key).strip()
    return f"{key}: {message}" if key else message


def _man_in_the_middle(cfg: Config, name: str, cls: Any, party: str, at_party: Candidate) -> Candidate | None:
    """The same attack run by an observer of ``party``'s channel, where it needs nothing but the wire."""
    if (
        not cls.taps
        or cls.rewrites
        or cls.changes_own_data
        or needs(cls)
        or cfg.party(party).role == "coordinator"
    ):
        return None
    cand = Candidate(name, party, f"a man in the middle on {party}'s channel", False, mitm=True)
    cand.scored = at_party.scored
    cand.params = dict(at_party.params)
    if cfg.transport.tls.enabled:
        cand.reason = (
            "transport.tls is on: a man in the middle sees only TLS ciphertext, and cannot change it"
        )
    else:
        cand.applies = True
    return cand
