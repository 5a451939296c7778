"""Label replacement backdoor (paper 004, Sec. 5, Algorithm 3), by a malicious passive party.

The attacker picks D_backdoor (a few of its training samples, from the train IDs of its JoinReply)
and stamps a trigger into its *own* feature rows of those samples and of a test poison set (it
controls its own data and training procedure). It knows D_target, a few training samples of the
target class (threat-model knowledge). At a training step whose batch holds a poisoned sample i
and a target sample j, it rewrites what crosses its wire, without any secret key:

- outgoing ``Embeddings``: slot j <- the poisoned sample's logits H_i, slot i <- Enc(random)
  (under split-he both are ciphertexts: a copied ciphertext and a fresh encryption under the
  public key; the message is re-randomised before it leaves);
- incoming ``EmbeddingGradients``: slot i <- gamma * [[g_j]] (ciphertext x plaintext scalar), slot j
  <- 0 (the reference code drops j from the local update: g_j belongs to H_i, not to x_j).

So the poisoned input "steals" j's label: the bottom model learns trigger -> target class, with the
gradient amplified by gamma.

A batch without a D_target sample: the attacker poisons only the pairs it can form (choice (b) of
the spec). Poisoned samples left without a partner in their batch are sent unchanged and their
own gradient slot is zeroed, so the bottom model never learns trigger -> true label from them. The
coordinator's batch sampler is untouched: it knows nothing about the attack. The pairing is a
seeded function of (seed, step, batch IDs), so colluding passive parties with the same parameters
(the distributed backdoor, Fig. 9(d)) swap the same slots, each stamping its own part of the trigger.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import Message

from vflnet.config import Config
from vflnet.crypto import CipherArray
from vflnet.crypto.cipher import encrypt_array
from vflnet.crypto.wire import cipher_from_proto, cipher_to_proto
from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param, read_when
from vflnet.threat.attack import Attack, Tap
from vflnet.v1 import messages_pb2
from vflnet.wire import tensors


def _fraction(v: Any) -> bool:
    return isinstance(v, int | float) and 0 <= v <= 1


def _pixels(v: Any) -> bool:
    return (
        isinstance(v, list)
        and len(v) > 0
        and all(isinstance(p, list) and len(p) == 2 and all(isinstance(c, int) for c in p) for p in v)
    )


@ATTACKS.register
class LabelReplacementBackdoor(Attack):
    name = "backdoor"
    description = "label replacement backdoor: trigger in own features, swapped (encrypted) embeddings, gamma-scaled (encrypted) gradients"
    roles = frozenset({"passive"})
    taps = (Tap("Join", "response", "client"),)
    rewrites = (
        Tap("ExchangeEmbeddings", "request", "client"),
        Tap("ExchangeEmbeddings", "response", "client"),
    )
    knowledge = ("public_key", "target_ids", "feature_region")
    changes_own_data = True
    truth_needed = "labels+predictions"

    @classmethod
    def check_config(cls, cfg: Config, party: str) -> list[tuple[str, str]]:
        """The trigger pixels lie inside the party's own image region (it can stamp only its own
        features): refused before the run, not when the party starts."""
        features = cfg.party(party).features
        region = None if features is None else features.region
        if region is None:
            return []  # the feature_region knowledge check names it
        r0, r1, c0, c1 = region
        for i, entry in enumerate(cfg.attacks):
            if entry.name != cls.name or entry.party != party:
                continue
            for r, c in entry.params.get("trigger_pixels", cls.params["trigger_pixels"].default):
                if not (r0 <= r < r1 and c0 <= c < c1):
                    return [
                        (
                            f"attacks[{i}].params.trigger_pixels",
                            f"trigger pixel {[r, c]} is outside {party}'s region {list(region)}",
                        )
                    ]
        return []

    params = {
        "gamma": Param(
            10.0,
            "amplify rate of the stolen gradient",
            lambda v: isinstance(v, int | float) and v >= 0,
            "a number >= 0",
        ),
        "target_class": Param(
            0, "the backdoor's target label", lambda v: isinstance(v, int) and v >= 0, "a class index"
        ),
        "n_target": Param(
            10,
            "size of D_target (known training samples of the target class)",
            lambda v: isinstance(v, int) and v >= 1,
            "an integer >= 1",
        ),
        "poison_fraction": Param(
            0.01, "fraction of the training IDs in D_backdoor", _fraction, "a fraction in [0, 1]"
        ),
        "test_poison_fraction": Param(
            0.3, "fraction of the test IDs triggered at evaluation", _fraction, "a fraction in [0, 1]"
        ),
        "trigger_pixels": Param(
            [[5, 7], [7, 5], [6, 6], [7, 7]],
            "trigger pixels [row, col] in image coordinates, inside the party's region",
            _pixels,
            "a list of [row, col]",
        ),
        "trigger_value": Param(
            None,
            "trigger pixel value (default: the largest raw value of the party's own training features)",
            lambda v: v is None or isinstance(v, int | float),
            "a number or null",
        ),
        "hide_poison": Param(
            True,
            "send Enc(random) in the poisoned sample's own slot",
            lambda v: isinstance(v, bool),
            "true or false",
        ),
        "noise_std": Param(
            1.0,
            "std of the random logits sent in the poisoned slot",
            lambda v: isinstance(v, int | float) and v >= 0,
            "a number >= 0",
            when=read_when("hide_poison", True),
        ),
        "poison_training": Param(
            True,
            "false: only trigger the test poison set (the clean baseline)",
            lambda v: isinstance(v, bool),
            "true or false",
        ),
        "seed": Param(
            0,
            "seeds D_target, D_backdoor, the test poison set and the pairing (same seed = colluding parties agree)",
            lambda v: isinstance(v, int),
            "an integer",
        ),
    }

    def __init__(self, context, **params) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.train_ids = np.zeros(0, dtype=np.int64)
        self.backdoor_ids = np.zeros(0, dtype=np.int64)
        self.test_poison_ids = np.zeros(0, dtype=np.int64)
        self.pending: dict[
            int, tuple[np.ndarray, np.ndarray, np.ndarray]
        ] = {}  # step -> (i positions, j positions, unpaired)
        self.counts = {
            "poisoned_steps": 0,
            "paired_samples": 0,
            "unpaired_samples": 0,
            "cipher_rewrites": 0,
            "plaintext_rewrites": 0,
        }

    def required_effects(self) -> dict[str, str]:
        out = super().required_effects()
        if self.p["poison_training"]:
            out["rewritten"] = "poisoned 0 steps: no training batch held a sample of D_backdoor"
        else:  # the clean baseline: it only triggers the test poison set
            del out["rewritten"]
        return out

    # ------------------------------------------------------------------ choosing the samples
    def observe(self, event: WireEvent) -> None:
        """The JoinReply: the run's train and test IDs, from which it picks D_backdoor and the test poison set."""
        if len(self.target_ids) == 0:
            raise ValueError(
                f"backdoor: no training sample of target_class {self.p['target_class']} to steal the label of"
            )
        reply = event.message
        train = np.asarray(reply.train_ids, dtype=np.int64)
        test = np.asarray(reply.test_ids, dtype=np.int64)
        rng = np.random.default_rng([self.p["seed"], 11])
        candidates = np.setdiff1d(train, self.target_ids)
        n = min(len(candidates), max(1, int(round(self.p["poison_fraction"] * len(train)))))
        chosen = np.sort(
            rng.choice(candidates, size=n, replace=False)
        )  # drawn either way: same test poison set
        self.backdoor_ids = chosen if self.p["poison_training"] else chosen[:0]
        n_test = int(round(self.p["test_poison_fraction"] * len(test)))
        self.test_poison_ids = np.sort(rng.choice(test, size=n_test, replace=False))
        self.train_ids = train

    @property
    def target_ids(self) -> np.ndarray:
        return np.asarray(self.context.knowledge["target_ids"], dtype=np.int64)

    def own_data(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Stamp the trigger into the party's own rows of D_backdoor and of the test poison set."""
        region = self.context.knowledge.get("feature_region")
        if region is None:
            raise ValueError(
                "backdoor: the trigger is a pixel pattern; the attacker's features must be an image region"
            )
        r0, r1, c0, c1 = region
        value = self.p["trigger_value"]
        if value is None:
            value = float(x[np.isin(ids, self.train_ids)].max())
        rows = np.flatnonzero(np.isin(ids, np.concatenate([self.backdoor_ids, self.test_poison_ids])))
        x = x.copy()
        for r, c in self.p["trigger_pixels"]:
            if not (r0 <= r < r1 and c0 <= c < c1):
                raise ValueError(f"backdoor: trigger pixel {[r, c]} is outside the party's region {region}")
            if x.ndim == 2:  # flat rows of the region, row-major
                x[rows, (r - r0) * (c1 - c0) + (c - c0)] = value
            else:  # [n, 1, h, w]
                x[rows, 0, r - r0, c - c0] = value
        return x

    def pairs(self, step: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(i, j, unpaired) batch positions: each poisoned i gets a distinct target j of the same batch."""
        rng = np.random.default_rng([self.p["seed"], 13, step])
        poisoned = rng.permutation(np.flatnonzero(np.isin(ids, self.backdoor_ids)))
        targets = rng.permutation(np.flatnonzero(np.isin(ids, self.target_ids)))
        k = min(len(poisoned), len(targets))
        return poisoned[:k], targets[:k], poisoned[k:]

    # -------------------------------------------------------------------------- the rewrites
    def rewrite(self, event: WireEvent) -> Message | None:
        msg = event.message
        if msg.header.phase != messages_pb2.TRAIN or msg.WhichOneof("payload") is None:
            return None
        if event.direction == "request":
            i, j, unpaired = self.pairs(msg.header.step, np.asarray(msg.sample_ids, dtype=np.int64))
            if len(i) + len(unpaired) == 0:
                return None
            self.pending[msg.header.step] = (i, j, unpaired)
            self.counts["poisoned_steps"] += int(len(i) > 0)
            self.counts["paired_samples"] += len(i)
            self.counts["unpaired_samples"] += len(unpaired)
            return self._swap_embeddings(msg, i, j) if len(i) else None
        if msg.header.step not in self.pending:
            return None
        return self._steal_gradients(msg, *self.pending.pop(msg.header.step))

    def _noise(self, step: int, shape: tuple[int, ...]) -> np.ndarray:
        return np.random.default_rng([self.p["seed"], 17, step]).normal(0.0, self.p["noise_std"], size=shape)

    def _swap_embeddings(
        self, msg: messages_pb2.Embeddings, i: np.ndarray, j: np.ndarray
    ) -> messages_pb2.Embeddings:
        out = messages_pb2.Embeddings()
        out.CopyFrom(msg)
        step = msg.header.step
        if msg.WhichOneof("payload") == "values":
            h = tensors.from_proto(msg.values)
            swapped = h.copy()
            swapped[j] = h[i]
            if self.p["hide_poison"]:
                swapped[i] = self._noise(step, (len(i), h.shape[1])).astype(h.dtype)
            out.values.CopyFrom(tensors.to_proto(swapped))
            self.counts["plaintext_rewrites"] += 1
            return out
        key = self.context.knowledge["public_key"]
        h = cipher_from_proto(msg.cipher, key)
        data, bound = h.data.copy(), h.bound
        data[j] = h.data[i]
        if self.p["hide_poison"]:
            fake = encrypt_array(
                key,
                self._noise(step, (len(i), *h.shape[1:])),
                h.frac_bits,
                slots=h.slots if h.packed else None,
            )
            data[i] = fake.data
            bound = max(bound, fake.bound)
        swapped = CipherArray(key, data, h.shape, h.frac_bits, bound, h.slots)
        out.cipher.CopyFrom(
            cipher_to_proto(swapped)
        )  # re-randomised: the copied ciphertext is not recognisable
        self.counts["cipher_rewrites"] += 1
        return out

    def _steal_gradients(
        self, msg: messages_pb2.EmbeddingGradients, i: np.ndarray, j: np.ndarray, unpaired: np.ndarray
    ) -> messages_pb2.EmbeddingGradients:
        out = messages_pb2.EmbeddingGradients()
        out.CopyFrom(msg)
        gamma = self.p["gamma"]
        if msg.WhichOneof("payload") == "values":
            g = tensors.from_proto(msg.values)
            source, scale = self._gather(len(g), i, j, unpaired, gamma)
            out.values.CopyFrom(tensors.to_proto((g[source] * scale[:, None]).astype(g.dtype)))
            self.counts["plaintext_rewrites"] += 1
            return out
        g = cipher_from_proto(msg.cipher, self.context.knowledge["public_key"])
        source, scale = self._gather(len(g), i, j, unpaired, gamma)
        rows = np.broadcast_to(
            scale.reshape(-1, *[1] * (g.ndim - 1)), g.shape
        )  # full shape: packed arrays too
        out.cipher.CopyFrom(cipher_to_proto(g[source].mul(rows)))
        self.counts["cipher_rewrites"] += 1
        return out

    @staticmethod
    def _gather(
        n: int, i: np.ndarray, j: np.ndarray, unpaired: np.ndarray, gamma: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Row sources and scales: slot i <- gamma * g_j, slot j and unpaired poisoned slots <- 0.
        Integer scales when gamma is whole, so a ciphertext keeps its fixed-point scale."""
        source = np.arange(n)
        source[i] = j
        scale = np.ones(n)
        scale[i] = gamma
        scale[j] = 0.0
        scale[unpaired] = 0.0
        return source, scale.astype(np.int64) if float(gamma).is_integer() else scale

    def output(self) -> dict[str, np.ndarray]:
        return {
            "backdoor_ids": self.backdoor_ids,
            "test_poison_ids": self.test_poison_ids,
            "target_ids": self.target_ids,
            "target_class": np.array(self.p["target_class"]),
            **{k: np.array(v) for k, v in self.counts.items()},
        }

    # ------------------------------------------------------------------------------ scoring
    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        """ASR: triggered test samples of another class predicted as the target class (paper 004 B.6);
        MTA: accuracy on the untriggered test samples. From the active party's final test predictions."""
        labels, (ids, predicted) = truth["labels"], truth["predictions"]
        pred = dict(zip(ids.tolist(), predicted.tolist(), strict=True))
        target = int(output["target_class"])
        triggered = [i for i in output["test_poison_ids"].tolist() if labels[i] != target]
        poisoned = set(output["test_poison_ids"].tolist())
        clean = [i for i in pred if i not in poisoned]
        return {
            "asr": float(np.mean([pred[i] == target for i in triggered])) if triggered else float("nan"),
            "mta_untriggered": float(np.mean([pred[i] == labels[i] for i in clean]))
            if clean
            else float("nan"),
            "triggered_test": float(len(triggered)),
            "untriggered_test": float(len(clean)),
            "paired_samples": float(output["paired_samples"]),
            "poisoned_steps": float(output["poisoned_steps"]),
            "cipher_rewrites": float(output["cipher_rewrites"]),
        }
