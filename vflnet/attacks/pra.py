"""Paper 003 Sec. IV-B, Algorithm 1: the path restriction attack (PRA) on a decision tree.

The adversary knows the tree (every node's feature owner and threshold, from the model release), its
own feature values and the predicted class. It keeps the root-to-leaf paths that agree with its own
features at its own nodes and end in a leaf of the predicted class, picks one of them uniformly at
random, and reads off, for every target-party node on that path, on which side of the threshold the
target's value lies. Scored with the correct branching rate (CBR).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
