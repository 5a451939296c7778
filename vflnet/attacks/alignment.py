"""What sample alignment leaks (docs/protocols.md, Alignment; docs/audit.md).

- ``alignment-id-recovery`` (the coordinator, semi-honest): from the alignment messages it relays,
  recover the parties' IDs, those outside the intersection included. Under ``plain`` it reads them
  (in ``Join`` over the dataset, in the ``Align`` offers over files); under ``hashed`` it runs a
  dictionary attack: it hashes a list of candidate IDs (the population: e.g. a town's e-mail
  addresses) and matches the digests; under ``psi`` the same dictionary matches nothing (the offers
  are blinded under the parties' secrets), and it is left with the sizes. An observer of a party's
  channel (no TLS) sees that party's offer: a part of what the coordinator sees.
- ``alignment-membership-probe`` (a passive party, malicious): it pads the set it offers with
  candidate IDs and learns from the intersection which of them every other party holds. Every
  method reveals the intersection to the parties, so this works under each (psi included).

Candidate IDs: the ``candidates`` file (one ID per line), or, over a built-in dataset, every ID of the
dataset (the attacker knows the whole population, the strongest dictionary).
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

import numpy as np

from vflnet.config import Config
from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import Attack, Tap
from vflnet.v1 import messages_pb2

POINT = 32


def _candidates_param() -> Param:
    return Param(
        None,
        "a file of candidate IDs, one a line (null: every ID of data.dataset)",
        lambda v: v is None or (isinstance(v, str) and v != ""),
        "a path or null",
    )


def _need_candidates(cfg: Config, params: dict[str, Any]) -> list[tuple[str, str]]:
    if cfg.sources and not params.get("candidates"):
        return [
            ("attacks", "the parties read their own files: give params.candidates (a file of candidate IDs)")
        ]
    return []


def score_recovery(recovered: set[str], truth: dict[str, Any]) -> dict[str, float]:
    """The share of the IDs outside the intersection that were recovered (the leak PSI must prevent)."""
    held: dict[str, set[str]] = truth["held"]
    union = set().union(*held.values())
    common = set.intersection(*held.values())
    outside = union - common
    return {
        "id_recovery": len(recovered & outside) / max(len(outside), 1),
        "non_intersection": float(len(outside)),
        "recovered": float(len(recovered & union)),
        "intersection_recovered": len(recovered & common) / max(len(common), 1),
    }


class _DictionaryAttack(Attack):
    """An alignment attack whose threat model hands it a list of candidate IDs (``candidates``)."""

    @classmethod
    def check_config(cls, cfg: Config, party: str) -> list[tuple[str, str]]:
        entry = next(e for e in cfg.attacks if e.name == cls.name and e.party == party)
        return _need_candidates(cfg, entry.params)


@ATTACKS.register
class AlignmentIdRecovery(_DictionaryAttack):
    name = "alignment-id-recovery"
    description = (
        "the coordinator recovers the parties' IDs from the alignment messages: read under plain, a "
        "dictionary attack under hashed, nothing beyond sizes under psi"
    )
    roles = frozenset({"coordinator"})
    taps = (Tap("Join", "request", "server"), Tap("Align", "response", "client"))
    knowledge = ("candidate_ids",)
    on_row_indices: ClassVar[bool] = True
    truth_needed: ClassVar[str] = "ids"
    params = {"candidates": _candidates_param()}

    def __init__(self, context: Any, **params: Any) -> None:
        super().__init__(context, **params)
        self.seen_ids: set[str] = set()  # IDs read in the clear
        self.digests: set[bytes] = set()  # 32-byte values of hashed or psi offers
        self.offers = 0

    def observe(self, event: WireEvent) -> None:
        msg = event.message
        if isinstance(msg, messages_pb2.JoinRequest):
            self.seen_ids.update(str(i) for i in msg.sample_ids)
            return
        if isinstance(msg, messages_pb2.AlignReply) and (msg.keys or msg.items):
            self.offers += 1
            self.seen_ids.update(msg.keys)
            self.digests.update(msg.items[k : k + POINT] for k in range(0, len(msg.items), POINT))

    def recovered(self, population: list[str]) -> set[str]:
        """The IDs read, and every candidate whose digest (SHA-256, as `hashed` sends; or the hash psi
        blinds) is among the values seen."""
        from vflnet.roles.alignment import DOMAIN

        found = set(self.seen_ids)
        if self.digests:
            for c in population:
                raw = c.encode()
                if (
                    hashlib.sha256(raw).digest() in self.digests
                    or hashlib.sha256(DOMAIN + raw).digest() in self.digests
                ):
                    found.add(c)
        return found

    def output(self) -> dict[str, np.ndarray]:
        population = self.context.knowledge["candidate_ids"] if self.digests else []
        return {
            "recovered": np.array(sorted(self.recovered(population)), dtype=str),
            "values_seen": np.array(len(self.digests) + len(self.seen_ids)),
        }

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        return score_recovery(set(output["recovered"].tolist()), truth)


@ATTACKS.register
class AlignmentMembershipProbe(_DictionaryAttack):
    name = "alignment-membership-probe"
    description = (
        "a passive party pads its ID set with candidate IDs and learns which of them every other party "
        "holds (the intersection is revealed by design: leaks under every alignment method)"
    )
    roles = frozenset({"passive"})
    taps = ()  # it pads the set its party offers (in Join, or in the alignment phase) and reads the result
    knowledge = ("candidate_ids",)
    on_row_indices: ClassVar[bool] = True
    pads_own_ids: ClassVar[bool] = True
    truth_needed: ClassVar[str] = "ids"
    params = {
        "candidates": _candidates_param(),
        "probes": Param(
            50,
            "candidate IDs it pads its set with",
            lambda v: isinstance(v, int) and v >= 1,
            "an integer >= 1",
        ),
        "seed": Param(0, "seed of the draw of the probes", lambda v: isinstance(v, int), "an integer"),
    }

    def __init__(self, context: Any, **params: Any) -> None:
        super().__init__(context, **params)
        self.probes: list[str] = []
        self.members: set[str] = set()

    def probe_ids(self) -> list[str]:
        """The candidate IDs the party adds to the set it offers."""
        population = self.context.knowledge["candidate_ids"]
        rng = np.random.default_rng([self.p["seed"], 58])
        n = min(self.p["probes"], len(population))
        self.probes = sorted(population[i] for i in rng.choice(len(population), n, replace=False))
        return self.probes

    def observe_aligned(self, keys: list[str]) -> None:
        """The party's IDs in the intersection (what every method tells it)."""
        self.members = set(keys) & set(self.probes)

    def observe(self, event: WireEvent) -> None:
        """Membership arrives with the party's aligned rows (`observe_aligned`)."""

    def output(self) -> dict[str, np.ndarray]:
        return {
            "probes": np.array(self.probes, dtype=str),
            "member": np.array([p in self.members for p in self.probes], dtype=bool),
            "party": np.array(self.context.party),
        }

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        """Accuracy of "held by every other party" over the probes; the baseline guesses the majority."""
        others = [ids for name, ids in truth["held"].items() if name != str(output["party"])]
        held = set.intersection(*others)
        probes = output["probes"].tolist()
        if not probes:
            return {"membership_accuracy": float("nan"), "probed": 0.0}
        true = np.array([p in held for p in probes])
        rate = float(true.mean())
        return {
            "membership_accuracy": float((output["member"] == true).mean()),
            "probed": float(len(probes)),
            "membership_baseline": max(rate, 1 - rate),
        }
