"""A party's interceptor chain, from config: its trace tap first, then its attacks in config order.

The same chain sits on the party's gRPC server and on every client channel it opens, so a mod
sees everything that crosses this party's wire, in both directions, and nothing else."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vflnet.attacks.base import Attack, AttackContext, OwnStepView
from vflnet.config import Config, PluginConfig
from vflnet.data.alignment import intersect, split_train_test
from vflnet.data.datasets import Dataset, load_dataset
from vflnet.data.partition import party_view
from vflnet.interceptors.chain import Chain
from vflnet.interceptors.trace import TraceWriter, trace_path
from vflnet.registry import ATTACKS, load_plugin_modules

log = logging.getLogger(__name__)


@dataclass
class PartyInterception:
    party: str
    chain: Chain
    attacks: list[tuple[PluginConfig, Attack]] = field(default_factory=list)
    trace: TraceWriter | None = None
    knowledge: dict[str, Any] = field(default_factory=dict)  # filled by the protocol, e.g. the public key

    @property
    def wants_own_view(self) -> bool:
        return any(a.wants_own_view for _, a in self.attacks)

    def deliver_own_view(self, view: OwnStepView) -> None:
        for _, attack in self.attacks:
            if attack.wants_own_view:
                attack.observe_own(view)

    def own_data(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The party's feature rows after every attack that rewrites its own data (backdoor trigger)."""
        for _, attack in self.attacks:
            if attack.changes_own_data:
                x = attack.own_data(ids, x)
        return x

    def finish(self, run_dir: Path) -> list[Path]:
        """Write every attack's output (and close the trace): called when the party shuts down."""
        written = []
        for entry, attack in self.attacks:
            written.append(save_attack_output(run_dir, entry, attack.output(), sorted(self.knowledge)))
        if self.trace is not None:
            self.trace.close()
        return written


def attack_output_path(run_dir: Path, entry: PluginConfig) -> Path:
    return run_dir / "attacks" / f"{entry.name}@{entry.party}.npz"


def save_attack_output(run_dir: Path, entry: PluginConfig, output: dict[str, np.ndarray], knowledge: list[str]) -> Path:
    path = attack_output_path(run_dir, entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **output)
    meta = {"name": entry.name, "party": entry.party, "params": entry.params, "knowledge_delivered": knowledge,
            "arrays": {k: list(np.shape(v)) for k, v in output.items()}}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    return path


def party_interception(cfg: Config, name: str, run_dir: Path) -> PartyInterception:
    load_plugin_modules(cfg.plugins)
    role = cfg.party(name).role
    knowledge: dict[str, Any] = {}
    mods: list[Any] = []
    trace = None
    if name in cfg.trace.parties or "all" in cfg.trace.parties:
        trace = TraceWriter(trace_path(run_dir, name), name, cfg.run.id, max_bytes=int(cfg.trace.max_mb * 1024 * 1024))
        mods.append(trace)
    attacks = []
    for entry in cfg.attacks:
        if entry.party == name:
            attack = ATTACKS.get(entry.name)(AttackContext(name, role, cfg.run.id, knowledge), **entry.params)
            knowledge.update(threat_model_knowledge(cfg, name, attack))
            attacks.append((entry, attack))
            mods.append(attack)
            log.info("%s hosts attack %s (%s)", name, entry.name, ", ".join(f"{k}={v}" for k, v in attack.p.items()))
    return PartyInterception(name, Chain(mods), attacks, trace, knowledge)


def run_split(cfg: Config, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The run's train/test IDs, computed as the coordinator will (alignment of every party's IDs)."""
    common = intersect([party_view(cfg, p.name, data).ids for p in cfg.parties if p.role != "coordinator"])
    return split_train_test(common, cfg.data.test_fraction, cfg.run.seed)


def threat_model_knowledge(cfg: Config, name: str, attack: Attack) -> dict[str, Any]:
    """What an attack's threat model grants beyond the wire and that its party cannot derive itself.

    - ``feature_region``: the party's own image region [r0, r1, c0, c1] (its own config).
    - ``target_ids``: paper 004's D_target, ``n_target`` training samples of ``target_class`` the
      attacker knows (ground truth by assumption), seeded by the attack's ``seed`` so colluding
      parties with the same parameters know the same samples.
    """
    out: dict[str, Any] = {}
    if "feature_region" in attack.knowledge:
        features = cfg.party(name).features
        out["feature_region"] = None if features is None or features.region is None else list(features.region)
    if "target_ids" in attack.knowledge:
        label_of, _ = train_labels(cfg)
        pool = np.array([i for i, y in label_of.items() if y == attack.p["target_class"]], dtype=np.int64)
        n = min(int(attack.p["n_target"]), len(pool))
        out["target_ids"] = np.sort(np.random.default_rng([int(attack.p["seed"]), 7]).choice(pool, size=n, replace=False))
    if "aux_labels" in attack.knowledge:
        # {sample id: label}: a few labelled training samples (model completion's auxiliary set, MARVELL's
        # known positive). Drawn in a fixed order per class, so a party whose attacks ask for k and k' > k
        # samples of a class knows the first k' of them; the attacks of one party share what it knows.
        label_of, n_classes = train_labels(cfg)
        known = dict(attack.context.knowledge.get("aux_labels", {}))
        for label, count in attack.aux_quota(n_classes).items():  # type: ignore[attr-defined]
            pool = np.array(sorted(i for i, y in label_of.items() if y == label), dtype=np.int64)
            known.update((int(i), label) for i in np.random.default_rng([cfg.run.seed, 8, label]).permutation(pool)[:count])
        out["aux_labels"] = known
    return out


def train_labels(cfg: Config) -> tuple[dict[int, int], int]:
    """Ground-truth labels of the run's training samples and the number of classes: only for what a threat
    model grants an attacker by assumption (never handed to an attack as such)."""
    data = load_dataset(cfg.data.dataset, cfg.data.params)
    train, _ = run_split(cfg, data)
    label_of = dict(zip(data.ids.tolist(), data.labels.tolist(), strict=True))
    return {i: label_of[i] for i in train.tolist()}, data.n_classes
