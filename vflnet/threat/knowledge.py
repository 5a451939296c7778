"""Typed knowledge: what an attack's threat model grants it beyond the wire, and who provides it.

An attack names what it needs in ``knowledge`` (and ``wants_own_view``); ``vflnet config check``
refuses a config in which its party cannot have it (``missing_knowledge``), so a run never starts
with an attack that would read something nobody delivers. Each kind is delivered explicitly into the
attack's ``context.knowledge`` and recorded with its output:

- by the threat model, from the run config, when the attack is built (``threat_model_knowledge``);
- by the coordinator once the roster is complete (``deliver_server_knowledge``);
- by the protocol, as its contract declares (``Protocol.provides``; split-he: ``public_key`` from the
  admission reply; param-server: ``architecture``, from the parameters the coordinator holds);
- by a model release message (``released_model``, vflnet/threat/release.py ``accept_release``);
- by the party after each training step (the own view, ``OwnStepView``);
- by the active party after each prediction step (``predictions``, a ``PredictionView``).

Ground truth appears here only where a threat model grants it by assumption (D_target's IDs,
auxiliary labels), drawn from the training set with a fixed seed; never as the thing to infer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vflnet.config import Config
from vflnet.data.alignment import intersect, split_train_test
from vflnet.data.datasets import Dataset, load_dataset
from vflnet.data.partition import party_view
from vflnet.v1 import messages_pb2


@dataclass(frozen=True)
class Knowledge:
    name: str
    description: str
    unavailable: Callable[[Config, str], str | None]  # why `party` cannot have it in this config, or None
    # delivered by the run's protocol: only under a protocol whose contract lists it (`Protocol.provides`)
    by_protocol: bool = False
    # absent under the other protocols, and the attacks that declare it read it only where the protocol
    # encrypts (gradient scaling and the backdoor run under split too): not refused there
    optional: bool = False


def _coordinator_only(cfg: Config, party: str) -> str | None:
    return None if cfg.party(party).role == "coordinator" else "only the coordinator knows it"


def _anyone(cfg: Config, party: str) -> str | None:
    return None


def _feature_region(cfg: Config, party: str) -> str | None:
    features = cfg.party(party).features
    return None if features is not None and features.region is not None else "the party holds no image region"


def _released(cfg: Config, party: str) -> str | None:
    if any(r.recipient == party for r in cfg.model_release):
        return None
    return "no model_release entry hands a model to this party"


def _architecture(cfg: Config, party: str) -> str | None:
    if cfg.party(party).role != "coordinator":
        return "only the coordinator knows it"
    if not all(p.bottom is not None and p.bottom.kind in ("cafe-conv", "cafe-fc") for p in cfg.passives):
        return "every passive party needs a cafe-conv or cafe-fc bottom"
    return None


def _predictions(cfg: Config, party: str) -> str | None:
    if cfg.party(party).role != "active":
        return "only the active party receives the confidence vectors"
    return None if cfg.predict.set != "none" else "the run has no prediction phase (predict.set: none)"


def _own_view(cfg: Config, party: str) -> str | None:
    return None if cfg.party(party).bottom is not None else "the party trains no bottom model of its own"


KNOWLEDGE: dict[str, Knowledge] = {
    k.name: k
    for k in (
        Knowledge(
            "public_key",
            "the run's Paillier public key (absent where the protocol has none)",
            _anyone,
            by_protocol=True,
            optional=True,
        ),
        Knowledge("feature_region", "the party's own image region [r0, r1, c0, c1]", _feature_region),
        Knowledge("target_ids", "paper 004's D_target: n_target training IDs of target_class", _anyone),
        Knowledge(
            "aux_labels", "a few labelled training samples {id: label} (model completion, MARVELL)", _anyone
        ),
        Knowledge("train_ids", "the training-set IDs the coordinator scheduled", _coordinator_only),
        Knowledge(
            "candidate_ids",
            "a list of candidate sample IDs, the population (a town's e-mail addresses): the attack's "
            "`candidates` file, else every ID of data.dataset",
            _anyone,
        ),
        Knowledge("party_addresses", "which roster address is which party", _coordinator_only),
        Knowledge("workers", "the passive parties' names, in roster order", _coordinator_only),
        Knowledge("label_holder", "the active party's name", _coordinator_only),
        Knowledge(
            "architecture",
            "the CAFE model architecture (paper 002's server learns it from the parameters it holds)",
            _architecture,
            by_protocol=True,
        ),
        Knowledge("released_model", "another party's model, from a model release message", _released),
        Knowledge(
            "predictions",
            "the confidence vectors of the prediction phase, with the party's own rows and model (paper 003)",
            _predictions,
        ),
        Knowledge(
            "own_view",
            "the party's own view of each training step (rows, bottom model, its gradient)",
            _own_view,
        ),
    )
}


def needs(attack: Any) -> list[str]:
    """The knowledge an attack class declares, the own view included."""
    return [*attack.knowledge, *(["own_view"] if attack.wants_own_view else [])]


def why_unavailable(
    kind: Knowledge, cfg: Config, party: str, provides: dict[str, frozenset[str]]
) -> str | None:
    """Why ``party`` cannot have ``kind`` in this config, or None; ``provides``: each registered
    protocol's knowledge (`Protocol.provides`), by name."""
    if kind.by_protocol and not kind.optional and kind.name not in provides.get(cfg.protocol.kind, ()):
        givers = sorted(n for n, given in provides.items() if kind.name in given)
        return f"protocol {cfg.protocol.kind!r} does not provide it (protocols that do: {givers or 'none'})"
    return kind.unavailable(cfg, party)


def missing_knowledge(cfg: Config, party: str, attack: Any, provides: dict[str, frozenset[str]]) -> list[str]:
    """Why an attack at ``party`` would lack what it declares, one line per missing kind."""
    out = []
    for name in needs(attack):
        kind = KNOWLEDGE.get(name)
        if kind is None:
            out.append(f"{name!r} is no known kind of knowledge (known: {', '.join(sorted(KNOWLEDGE))})")
            continue
        why = why_unavailable(kind, cfg, party, provides)
        if why:
            out.append(f"needs {name!r} ({kind.description}), but {why}")
    return out


# ------------------------------------------------------------------------------- providers
def run_split(cfg: Config, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The run's train/test IDs, computed as the coordinator will (alignment of every party's IDs)."""
    common = intersect([party_view(cfg, p.name, data).ids for p in cfg.parties if p.role != "coordinator"])
    return split_train_test(common, cfg.data.test_fraction, cfg.run.seed)


def train_labels(cfg: Config) -> tuple[dict[int, int], int]:
    """Ground-truth labels of the run's training samples and the number of classes: only for what a threat
    model grants an attacker by assumption (never handed to an attack as such)."""
    data = load_dataset(cfg.data.dataset, cfg.data.params)
    train, _ = run_split(cfg, data)
    label_of = dict(zip(data.ids.tolist(), data.labels.tolist(), strict=True))
    return {i: label_of[i] for i in train.tolist()}, data.n_classes


def threat_model_knowledge(cfg: Config, name: str, attack: Any) -> dict[str, Any]:
    """What an attack's threat model grants beyond the wire and that its party cannot derive itself.

    - ``feature_region``: the party's own image region [r0, r1, c0, c1] (its own config).
    - ``target_ids``: paper 004's D_target, ``n_target`` training samples of ``target_class`` the
      attacker knows (ground truth by assumption), seeded by the attack's ``seed`` so colluding
      parties with the same parameters know the same samples.
    - ``aux_labels``: {sample id: label}, a few labelled training samples (model completion's
      auxiliary set, MARVELL's known positive), drawn in a fixed order per class, so a party whose
      attacks ask for k and k' > k samples of a class knows the first k' of them; the attacks of one
      party share what it knows.
    """
    out: dict[str, Any] = {}
    if "feature_region" in attack.knowledge:
        features = cfg.party(name).features
        out["feature_region"] = None if features is None or features.region is None else list(features.region)
    if "target_ids" in attack.knowledge:
        label_of, _ = train_labels(cfg)
        pool = np.array([i for i, y in label_of.items() if y == attack.p["target_class"]], dtype=np.int64)
        n = min(int(attack.p["n_target"]), len(pool))
        out["target_ids"] = np.sort(
            np.random.default_rng([int(attack.p["seed"]), 7]).choice(pool, size=n, replace=False)
        )
    if "aux_labels" in attack.knowledge:
        label_of, n_classes = train_labels(cfg)
        known = dict(attack.context.knowledge.get("aux_labels", {}))
        for label, count in attack.aux_quota(n_classes).items():
            pool = np.array(sorted(i for i, y in label_of.items() if y == label), dtype=np.int64)
            known.update(
                (int(i), label)
                for i in np.random.default_rng([cfg.run.seed, 8, label]).permutation(pool)[:count]
            )
        out["aux_labels"] = known
    if "candidate_ids" in attack.knowledge:
        out["candidate_ids"] = candidate_ids(cfg, attack.p.get("candidates"))
    return out


def deliver_server_knowledge(
    cfg: Config,
    knowledge: dict[str, Any],
    reply: messages_pb2.JoinReply,
    joined: dict[str, messages_pb2.JoinRequest],
) -> None:
    """What the server knows a priori (paper 002's threat model), handed to its attacks explicitly:
    the training-set IDs it scheduled, which roster address is which party, and, under param-server
    with CAFE models, the model architecture (the config it coordinates and the shapes of the
    parameters it holds). No data, no labels."""
    knowledge["train_ids"] = np.asarray(reply.train_ids, dtype=np.int64)
    knowledge["party_addresses"] = {p.address: p.name for p in reply.roster}
    knowledge["workers"] = [p.name for p in cfg.passives]
    knowledge["label_holder"] = cfg.active.name
    top = joined[cfg.active.name].protocol.tensors.tensors.get("top.net.weight")
    if _architecture(cfg, cfg.coordinator.name) is None and top is not None:
        from vflnet.models.zoo import cafe_config

        bottoms = [p.bottom for p in cfg.passives]
        region = cfg.passives[0].features.region  # type: ignore[union-attr]
        shape = (1, region[1] - region[0], region[3] - region[2])
        knowledge["architecture"] = cafe_config(
            bottoms[0],
            shape,  # type: ignore[arg-type]
            n_workers=len(bottoms),
            n_classes=int(top.shape[0]),
            top_softmax=cfg.model.top.output_activation == "softmax",
        )


def candidate_ids(cfg: Config, path: str | None) -> list[str]:
    """An alignment attacker's list of candidate IDs, as text (its threat model's dictionary, e.g. the
    e-mails of a town): its file, else every ID of the dataset."""
    if path:
        return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    return [str(i) for i in load_dataset(cfg.data.dataset, cfg.data.params).ids.tolist()]
