"""Paper 003 Sec. IV-B, Algorithm 1: the path restriction attack (PRA) on a decision tree.

The adversary knows the tree (every node's feature owner and threshold, from the model release), its
own feature values and the predicted class. It keeps the root-to-leaf paths that agree with its own
features at its own nodes and end in a leaf of the predicted class, picks one of them uniformly at
random, and reads off, for every target-party node on that path, on which side of the threshold the
target's value lies. Scored with the correct branching rate (CBR).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vflnet.attacks.prediction_base import PredictionAttack, target_truth
from vflnet.registry import ATTACKS, Param


@dataclass(frozen=True)
class TreeView:
    """A binary tree as the adversary sees it, one entry per node (children -1 at leaves).

    ``adv_feature`` indexes x_adv at adversary nodes, ``target_feature`` indexes x_target at target
    nodes (-1 elsewhere); a sample goes left when its value <= ``threshold``."""

    left: np.ndarray
    right: np.ndarray
    threshold: np.ndarray
    adv_feature: np.ndarray
    target_feature: np.ndarray
    leaf_class: np.ndarray  # the class a leaf predicts, -1 at internal nodes

    def is_leaf(self, i: int) -> bool:
        return int(self.left[i]) < 0


def candidate_leaves(tree: TreeView, x_adv: np.ndarray, predicted: int) -> list[int]:
    """Algorithm 1: leaves reachable given the adversary's own values whose label is the predicted class."""
    out, queue = [], [0]
    while queue:
        i = queue.pop()
        if tree.is_leaf(i):
            if int(tree.leaf_class[i]) == predicted:
                out.append(i)
            continue
        f = int(tree.adv_feature[i])
        if f >= 0:
            queue.append(int(tree.left[i]) if x_adv[f] <= tree.threshold[i] else int(tree.right[i]))
        else:
            queue += [int(tree.left[i]), int(tree.right[i])]
    return sorted(out)


def path_to(tree: TreeView, leaf: int) -> list[tuple[int, bool]]:
    """(node, went left) from the root down to ``leaf``."""
    parent = {}
    for i in range(len(tree.left)):
        if not tree.is_leaf(i):
            parent[int(tree.left[i])] = (i, True)
            parent[int(tree.right[i])] = (i, False)
    steps = []
    while leaf in parent:
        node, went_left = parent[leaf]
        steps.append((node, went_left))
        leaf = node
    return steps[::-1]


def target_branches(tree: TreeView, leaf: int) -> list[tuple[int, bool]]:
    """The inference a chosen path makes: (target node, target value <= threshold) along it."""
    return [(n, left) for n, left in path_to(tree, leaf) if tree.target_feature[n] >= 0]


def path_restriction(
    tree: TreeView, x_adv: np.ndarray, predicted: np.ndarray, seed: int = 0
) -> list[list[tuple[int, bool]]]:
    """Per sample, the inferred branches of one uniformly chosen candidate path (empty if none)."""
    rng = np.random.default_rng(seed)
    out = []
    for x, k in zip(np.asarray(x_adv), np.asarray(predicted), strict=True):
        leaves = candidate_leaves(tree, x, int(k))
        out.append(target_branches(tree, int(rng.choice(leaves))) if leaves else [])
    return out


def random_path(tree: TreeView, n: int, seed: int = 0) -> list[list[tuple[int, bool]]]:
    """The paper's baseline: a uniformly random root-to-leaf path per sample."""
    rng = np.random.default_rng(seed)
    leaves = [i for i in range(len(tree.left)) if tree.is_leaf(i)]
    return [target_branches(tree, int(rng.choice(leaves))) for _ in range(n)]


def correct_branching_rate(
    tree: TreeView, inferred: list[list[tuple[int, bool]]], x_target: np.ndarray
) -> tuple[int, int]:
    """(correct, total) inferred target branches against the true values; CBR = correct / total."""
    correct = total = 0
    for branches, x in zip(inferred, np.asarray(x_target), strict=True):
        for node, left in branches:
            truth = bool(x[int(tree.target_feature[node])] <= tree.threshold[node])
            correct += truth == left
            total += 1
    return correct, total


def from_sklearn(model: object, adv_cols: np.ndarray, target_cols: np.ndarray) -> TreeView:
    """A fitted sklearn DecisionTreeClassifier as the adversary sees it, the columns split by owner."""
    t = model.tree_  # type: ignore[attr-defined]
    adv_index = {int(c): i for i, c in enumerate(adv_cols)}
    target_index = {int(c): i for i, c in enumerate(target_cols)}
    internal = t.children_left >= 0
    return TreeView(
        left=t.children_left.copy(),
        right=t.children_right.copy(),
        threshold=t.threshold.copy(),
        adv_feature=np.array(
            [adv_index.get(int(f), -1) if i else -1 for f, i in zip(t.feature, internal, strict=True)]
        ),
        target_feature=np.array(
            [target_index.get(int(f), -1) if i else -1 for f, i in zip(t.feature, internal, strict=True)]
        ),
        leaf_class=np.where(internal, -1, t.value[:, 0, :].argmax(1)),
    )


def split_tables(
    released: dict[str, dict[str, Any]], start: int
) -> dict[str, tuple[int, np.ndarray, np.ndarray]]:
    """{passive party: (offset of its first feature, split id -> feature, split id -> threshold)} from
    the released split tables, the parties' features numbered from ``start`` in party-name order."""
    tables, offset = {}, start
    for name in sorted(released):
        p = released[name]["parameters"]
        tables[name] = (
            offset,
            np.asarray(p["bottom.feature"]).astype(np.int64),
            np.asarray(p["bottom.threshold"], np.float64),
        )
        offset += int(np.prod(released[name]["spec"]["bottom"]["input_shape"]))
    return tables


def secureboost_view(model: dict[str, Any], released: dict[str, dict[str, Any]], tree: int = 0) -> TreeView:
    """A secureboost tree as the active party sees it: its own splits from its own table, the passive
    parties' from their released tables (target features numbered in party-name order)."""
    t = model["ensemble"].trees[tree]
    own_features, own_cuts = model["own_splits"]
    owners = list(model["owners"])
    tables = split_tables(released, 0)
    size = len(t.kind)
    internal = t.kind == 1
    adv = np.full(size, -1)
    target = np.full(size, -1)
    thr = np.zeros(size)
    for i in np.flatnonzero(internal):
        owner, sid = owners[int(t.owner[i])], int(t.split_id[i])
        if owner in tables:
            base, feats, cuts = tables[owner]
            target[i], thr[i] = base + int(feats[sid]), float(cuts[sid])
        else:
            adv[i], thr[i] = int(own_features[sid]), float(own_cuts[sid])
    idx = np.arange(size)
    return TreeView(
        left=np.where(internal, 2 * idx + 1, -1),
        right=np.where(internal, 2 * idx + 2, -1),
        threshold=thr,
        adv_feature=adv,
        target_feature=target,
        leaf_class=np.where(t.kind == 2, t.value.argmax(1), -1),
    )


def tables_route(model: dict[str, Any], released: dict[str, Any], d_adv: int) -> Any:
    """Evaluate any party's splits on full feature vectors [x_adv | x_target] from the split tables the
    adversary holds (its own, the released ones): route(x, owner index, split ids) -> go-left bits."""
    owners = list(model["owners"])
    tables = split_tables(released, d_adv)
    own_features, own_cuts = model["own_splits"]

    def route(x: np.ndarray, owner: int, ids: np.ndarray) -> np.ndarray:
        base, feats, cuts = tables.get(owners[owner], (0, np.asarray(own_features), np.asarray(own_cuts)))
        return (x[:, base + feats[ids]] <= cuts[ids]).T

    return route


def _flat(branches: list[list[tuple[int, bool]]]) -> dict[str, np.ndarray]:
    rows = [(s, n, left) for s, b in enumerate(branches) for n, left in b]
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return {"sample": arr[:, 0], "node": arr[:, 1], "left": arr[:, 2].astype(bool)}


def _unflat(out: dict[str, np.ndarray], prefix: str, n: int) -> list[list[tuple[int, bool]]]:
    branches: list[list[tuple[int, bool]]] = [[] for _ in range(n)]
    for s, node, left in zip(
        out[f"{prefix}_sample"], out[f"{prefix}_node"], out[f"{prefix}_left"], strict=True
    ):
        branches[int(s)].append((int(node), bool(left)))
    return branches


@ATTACKS.register
class PathRestriction(PredictionAttack):
    name = "pra"
    description = (
        "paper 003 path restriction attack on a secureboost decision tree (CBR against a random path)"
    )
    model_needs = ("tree",)
    params = {
        "seed": Param(
            0, "seed of the uniform choice among candidate paths", lambda v: isinstance(v, int), "an integer"
        )
    }

    def output(self) -> dict[str, np.ndarray]:
        ids, v, x_adv, own = self.gathered()
        if len(ids) == 0 or not isinstance(own, dict) or "ensemble" not in own:
            raise RuntimeError("pra needs the predictions of a secureboost tree at the active party")
        tree = secureboost_view(own, self.released())
        seed = int(self.p["seed"])
        pra = _flat(path_restriction(tree, x_adv, v.argmax(1), seed))
        rnd = _flat(random_path(tree, len(ids), seed))
        out = {
            "sample_ids": ids,
            "tree_threshold": tree.threshold,
            "tree_target_feature": tree.target_feature,
        }
        out.update({f"pra_{k}": a for k, a in pra.items()})
        out.update({f"random_{k}": a for k, a in rnd.items()})
        return out

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        x = target_truth(truth, output["sample_ids"])
        n = len(x)
        size = len(output["tree_threshold"])
        tree = TreeView(
            np.full(size, -1),
            np.full(size, -1),
            output["tree_threshold"],
            np.full(size, -1),
            output["tree_target_feature"],
            np.full(size, -1),
        )
        pra = correct_branching_rate(tree, _unflat(output, "pra", n), x)
        rnd = correct_branching_rate(tree, _unflat(output, "random", n), x)
        return {
            "cbr": pra[0] / max(1, pra[1]),
            "cbr_random": rnd[0] / max(1, rnd[1]),
            "branches": float(pra[1]),
            "d_target": float(x.shape[1]),
        }
