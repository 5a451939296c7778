"""Paper 000's binary feature reconstruction at the active party (`feature-reconstruction`).

With an input-layer cut every passive party sends z_A = W_A x_A. The attack records the embeddings it
receives (`ExchangeEmbeddings` requests, server side), keeps the rows of one model version (the
prediction pass over the training rows after training, the paper's setting: ``phase: predict`` and
``predict.set: train``; or one evaluation pass; or one training batch larger than d_A), and after the
run searches col(Z_A) for binary vectors (vflnet.attacks.feature_reconstruction): Algorithm 1 (every
exact hit, one-hot groups reassembled) and Algorithm 2 (leverage-score regression, both scoring
rules). Under split-he the passive embeddings arrive encrypted and the attack counts them; see
docs/attacks.md for what the active party can still see there.

It uses nothing but the wire: no knowledge is granted. Ground truth (the passive parties' raw
columns) is only read by `score`, after the run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from vflnet.attacks import feature_reconstruction as fr
from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param, read_when
from vflnet.threat.attack import Attack, Tap
from vflnet.v1 import messages_pb2

_PHASES = {"predict": messages_pb2.PREDICT, "eval": messages_pb2.EVAL, "train": messages_pb2.TRAIN}


def _int(lo: int, default: int, help_: str) -> Param:
    return Param(
        default,
        help_,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo,
        f"an integer >= {lo}",
    )


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _choice(default: str, help_: str, options: tuple[str, ...]) -> Param:
    return Param(default, help_, lambda v: v in options, " or ".join(options))


def estimate_rank(s: np.ndarray, rank_tol: float) -> int:
    """The attacker's d from the singular values alone: those above rank_tol * s_1; if none vanish
    (noise), those above twice the noise floor, taken as the median singular value (the noise part's
    singular values are nearly flat, and k >= 2 d_A keeps the median among them)."""
    d = int((s > rank_tol * s[0]).sum())
    if d < len(s):
        return d
    return max(1, int((s > 2.0 * np.median(s)).sum()))


@ATTACKS.register
class FeatureReconstruction(Attack):
    name = "feature-reconstruction"
    description = "paper 000: binary passive features from first-layer outputs (Algorithm 1 exact, Algorithm 2 regression)"
    roles = frozenset({"active"})
    taps = (Tap("ExchangeEmbeddings", "request", "server"),)
    truth_needed = "features"
    # each passive embedding is W_k x_k (+ b_k, which ``bias_trick`` removes), so col(Z_k) holds the binary
    # feature columns; behind a hidden layer the search has nothing to find
    model_needs = ("input-layer-cut",)

    params = {
        "phase": _choice(
            "predict", "which traffic: predict pass, eval pass, or one train batch", tuple(_PHASES)
        ),
        "step": Param(
            -1,
            "phase train: the training step whose batch is attacked (-1: the last of the largest batches)",
            lambda v: isinstance(v, int) and not isinstance(v, bool),
            "an integer",
            when=read_when("phase", "train"),
        ),
        "algorithm": _choice("both", "which algorithms run", ("both", "1", "2")),
        "method": _choice(
            "mitm", "Algorithm 1 search: mitm (exact, fast) or brute (the paper's)", ("mitm", "brute")
        ),
        "rank": _int(0, 0, "d, the basis width (0: estimated from the singular values)"),
        "rank_tol": Param(
            1e-5,
            "relative singular value below which Z_A has no more rank",
            lambda v: _number(v) and 0 < v < 1,
            "a number in (0, 1)",
        ),
        "tol": Param(
            1e-3,
            "binary test of Algorithm 1: every entry within tol of 0 or 1",
            lambda v: _number(v) and 0 < v < 0.5,
            "a number in (0, 0.5)",
        ),
        "bias_trick": Param(
            False,
            "subtract one row from every row first (paper Sec. VII): passive bias, {a, b} encodings, standardised columns",
            lambda v: isinstance(v, bool),
            "true/false",
        ),
        "max_rows": _int(0, 5000, "rows attacked at most (0: all)"),
        "r": _int(0, 0, "Algorithm 2 rows sampled (0: d + 1, the paper's)"),
        "repeats": _int(1, 20, "Algorithm 2 repeats (the paper's 20)"),
        "max_r": _int(1, 12, "Algorithm 2 is skipped when r exceeds this (2^r candidates x n x 20 repeats)"),
        "criterion": _choice(
            "normalized",
            "Algorithm 2's reported x*: paper (smallest residual) or normalized",
            ("normalized", "paper"),
        ),
        "seed": _int(0, 0, "Algorithm 2 sampling seed"),
        "adaptive": Param(
            False,
            "Sec. VII's adaptive attack on the masquerade: when Algorithm 1 finds a single feature, search "
            "again on the rows where it is 0",
            lambda v: isinstance(v, bool),
            "true/false",
        ),
    }

    def __init__(self, context: Any, **params: Any) -> None:
        super().__init__(context, **params)
        # sender -> group key (model version, or step for train) -> [(ids, values)]
        self.rows: dict[str, dict[int, list[tuple[np.ndarray, np.ndarray]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self.encrypted: dict[str, int] = defaultdict(int)

    def observe(self, event: WireEvent) -> None:
        if event.phase != _PHASES[self.p["phase"]]:
            return
        values = event.tensors().get("values")
        if values is None:  # split-he: ciphertexts the active party cannot read
            self.encrypted[event.sender] += 1
            return
        key = int(event.step) if self.p["phase"] == "train" else int(event.model_version)
        self.rows[event.sender][key].append((event.sample_ids, values))

    def _matrix(
        self, groups: dict[int, list[tuple[np.ndarray, np.ndarray]]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The rows of one fixed W_A: the requested training step, or the latest model version."""
        if self.p["phase"] == "train" and self.p["step"] >= 0:
            if self.p["step"] not in groups:
                return np.zeros(0, np.int64), np.zeros((0, 0))
            key = self.p["step"]
        elif self.p["phase"] == "train":  # the last of the largest batches (a final batch may be short)
            key = max(groups, key=lambda step: (sum(len(i) for i, _ in groups[step]), step))
        else:
            key = max(groups)
        ids = np.concatenate([i for i, _ in groups[key]]).astype(np.int64)
        z = np.concatenate([v for _, v in groups[key]]).astype(np.float64)
        ids, first = np.unique(ids, return_index=True)
        z = z[first]
        if self.p["max_rows"]:
            ids, z = ids[: self.p["max_rows"]], z[: self.p["max_rows"]]
        return ids, z

    def output(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for sender, groups in sorted(self.rows.items()):
            ids, z = self._matrix(groups)
            if len(ids) == 0:
                continue
            out.update({f"{sender}/{k}": v for k, v in self.attack(z).items()})
            out[f"{sender}/sample_ids"] = ids
        for sender, count in sorted(self.encrypted.items()):
            out[f"{sender}/encrypted_batches"] = np.array(count)
        return out

    def attack(self, z: np.ndarray) -> dict[str, np.ndarray]:
        p = self.p
        _, s = fr.attack_basis(z, rank=None, bias_trick=p["bias_trick"])
        d = p["rank"] or estimate_rank(s, p["rank_tol"])
        a, _ = fr.attack_basis(z, rank=d, bias_trick=p["bias_trick"])
        out: dict[str, np.ndarray] = {
            "singular_values": s,
            "rank": np.array(d),
            "z_rms": np.array(float(np.sqrt((z**2).mean()))),
            "bias_trick": np.array(p["bias_trick"]),
            "criterion": np.array(p["criterion"]),
        }
        if len(z) <= d:  # no more rows than unknowns: every x' would be a "hit"
            out["too_few_rows"] = np.array(len(z))
            return out
        if p["algorithm"] in ("both", "1"):
            start = time.perf_counter()
            m, pivots = fr.solve_matrix(a)
            codes = (
                fr.search_mitm(m, pivots, p["tol"]) if p["method"] == "mitm" else fr.search_brute(m, p["tol"])
            )
            raw = fr.hit_vectors(m, codes)
            groups = fr.onehot_groups(raw)
            out["alg1_seconds"] = np.array(time.perf_counter() - start)
            out["alg1_raw_hits"] = raw
            out["alg1_hits"] = fr.canonical_hits(raw)
            out["alg1_categorical"] = np.array([fr.categorical(raw, g) for g in groups], np.int64).reshape(
                len(groups), raw.shape[1]
            )
            if p["adaptive"] and len(out["alg1_hits"]) == 1:  # the one vector as found, not complemented
                out.update(self.adaptive(z, next(h for h in raw if h.any() and not h.all())))
        r = p["r"] or d + 1
        if p["algorithm"] in ("both", "2") and r <= p["max_r"]:
            start = time.perf_counter()
            res = fr.leverage_regression(a, r, p["repeats"], np.random.default_rng([p["seed"], 0]))
            out["alg2_seconds"] = np.array(time.perf_counter() - start)
            out["alg2_paper"], out["alg2_normalized"] = res.paper, res.normalized
            out["alg2_paper_residual"] = np.array(res.paper_residual)
            out["alg2_normalized_score"] = np.array(res.normalized_score)
            out["alg2"] = res.paper if p["criterion"] == "paper" else res.normalized
        return out

    def adaptive(self, z: np.ndarray, found: np.ndarray) -> dict[str, np.ndarray]:
        """Paper 000 Sec. VII: the rows where the one feature found (the fabricated a) is 0 lose the mask
        a u, so Z_A there spans W_A's (d_A - 1)-dimensional image; search it again (Algorithm 1)."""
        p = self.p
        rows = np.nonzero(found == 0)[0]
        sub = z[rows]
        _, s = fr.attack_basis(sub, bias_trick=p["bias_trick"])
        d = estimate_rank(s, p["rank_tol"])
        out = {"adaptive_rows": rows, "adaptive_rank": np.array(d)}
        if len(rows) <= d:
            out["adaptive_hits"] = np.zeros((0, len(rows)), np.uint8)
            return out
        a, _ = fr.attack_basis(sub, rank=d, bias_trick=p["bias_trick"])
        m, pivots = fr.solve_matrix(a)
        codes = fr.search_mitm(m, pivots, p["tol"]) if p["method"] == "mitm" else fr.search_brute(m, p["tol"])
        out["adaptive_hits"] = fr.canonical_hits(fr.hit_vectors(m, codes))
        return out

    # --------------------------------------------------------------------------- scoring
    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        scores: dict[str, float] = {}
        senders = sorted({k.split("/")[0] for k in output if k.endswith("/sample_ids")})
        for sender in senders:
            ids = output[f"{sender}/sample_ids"]
            truth_ids, x = truth[sender]
            cols = binary_columns(x[np.searchsorted(truth_ids, ids)])
            scores.update({f"{sender}/{k}": v for k, v in score_sender(output, sender, cols).items()})
        for key, value in output.items():
            if key.endswith("/encrypted_batches"):
                scores[key] = float(value)
        return scores


def binary_columns(x: np.ndarray) -> dict[int, np.ndarray]:
    """The two-valued columns of a party's raw features as 0/1 (the larger value is 1)."""
    out = {}
    for j in range(x.shape[1]):
        values = np.unique(x[:, j])
        if len(values) == 2:
            out[j] = (x[:, j] == values[1]).astype(np.uint8)
    return out


def _match(v: np.ndarray, col: np.ndarray) -> tuple[float, float]:
    """(accuracy, accuracy up to complement) of one recovered vector against one true column."""
    acc = float((v == col).mean())
    return acc, max(acc, 1.0 - acc)


def onehot_sums(cols: dict[int, np.ndarray]) -> list[np.ndarray]:
    """The combinations (sums of 2 or more columns) of the true one-hot groups: 3 or more binary
    columns, pairwise disjoint, that together cover every row."""
    out: list[np.ndarray] = []
    used: set[int] = set()
    for i in cols:
        if i in used:
            continue
        group = [i]
        for j in cols:
            if j not in used and j not in group and all(not (cols[j] & cols[m]).any() for m in group):
                group.append(j)
        if len(group) < 3 or not np.sum([cols[j] for j in group], axis=0).all():
            continue
        used.update(group)
        for mask in range(1, 1 << len(group)):
            members = [group[b] for b in range(len(group)) if mask >> b & 1]
            if len(members) >= 2:
                out.append(np.sum([cols[j] for j in members], axis=0).astype(np.uint8))
    return out


def explained(hit: np.ndarray, cols: dict[int, np.ndarray]) -> bool:
    """Whether a hit (or its complement) is a true binary column or a sum of disjoint true columns
    (a one-hot group's subset sum)."""
    for v in (hit, 1 - hit):
        inside = [c for c in cols.values() if not (c & (1 - v)).any() and c.any()]
        if inside and np.array_equal(np.sum(inside, axis=0), v):
            return True
    return False


def score_sender(output: dict[str, np.ndarray], sender: str, cols: dict[int, np.ndarray]) -> dict[str, float]:
    out: dict[str, float] = {"binary_features": float(len(cols)), "rank": float(output[f"{sender}/rank"])}
    if f"{sender}/too_few_rows" in output:
        out["too_few_rows"] = float(output[f"{sender}/too_few_rows"])
    raw = output.get(f"{sender}/alg1_raw_hits")
    if raw is not None:
        hits = output[f"{sender}/alg1_hits"]
        found = found_c = 0
        accs = []
        for j, col in cols.items():
            matches = [_match(h, col) for h in raw]
            oriented = max((m[0] for m in matches), default=0.0)
            either = max((m[1] for m in matches), default=0.0)
            found += oriented == 1.0
            found_c += either == 1.0
            accs.append(either if bool(output[f"{sender}/bias_trick"]) else oriented)
            out[f"col{j}/alg1"] = accs[-1]
            out[f"col{j}/baseline"] = float(max(col.mean(), 1 - col.mean()))
        out["alg1_raw_hits"] = float(len(raw))
        out["alg1_hits"] = float(len(hits))
        out["alg1_found"] = float(found)
        out["alg1_found_up_to_complement"] = float(found_c)
        out["alg1_false_hits"] = float(sum(not explained(h, cols) for h in hits))
        out["alg1_groups"] = float(len(output[f"{sender}/alg1_categorical"]))
        out["alg1_mean_accuracy"] = float(np.mean(accs)) if accs else 0.0
        out["alg1_seconds"] = float(output[f"{sender}/alg1_seconds"])
    adaptive = output.get(f"{sender}/adaptive_hits")
    if adaptive is not None:
        rows = output[f"{sender}/adaptive_rows"]
        sub = {j: c[rows] for j, c in cols.items()}
        out["adaptive_hits"] = float(len(adaptive))
        out["adaptive_rank"] = float(output[f"{sender}/adaptive_rank"])
        out["adaptive_found"] = float(
            sum(any(_match(h, c)[1] == 1.0 for h in adaptive) for c in sub.values() if 0 < c.mean() < 1)
        )
        out["adaptive_false_hits"] = float(sum(not explained(h, sub) for h in adaptive))
    candidates = [*cols.values(), *onehot_sums(cols)]
    for crit in ("paper", "normalized"):
        v = output.get(f"{sender}/alg2_{crit}")
        if v is None:
            continue
        # the paper's attack accuracy: the best match of x* over the input features, the one-hot
        # groups' combinations included
        out[f"alg2_{crit}_accuracy"] = max((_match(v, c)[0] for c in candidates), default=0.0)
        out[f"alg2_{crit}_accuracy_up_to_complement"] = max(
            (_match(v, c)[1] for c in candidates), default=0.0
        )
        out[f"alg2_{crit}_ones"] = float(v.mean())
    out["z_rms"] = float(output[f"{sender}/z_rms"])
    if f"{sender}/alg2_seconds" in output:
        out["alg2_seconds"] = float(output[f"{sender}/alg2_seconds"])
    out["baseline"] = max((float(max(c.mean(), 1 - c.mean())) for c in cols.values()), default=0.0)
    return out
