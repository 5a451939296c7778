"""What an attack needs of the model: one declaration form, checked by `vflnet config check` and used by
the audit's selection alike.

An attack lists the names of what its algorithm reads in its ``model_needs`` (``Attack.model_needs``);
``vflnet.validation`` refuses a config in which one does not hold, naming the config key and why, so
an attack is never run (nor audited) where its output would mean something else: behind a top model
the batch-level label attacks' "labels" are embedding units, not classes. An unknown name is refused
when the attack class is defined (``Attack.__init_subclass__``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vflnet.config import Config


@dataclass(frozen=True)
class ModelNeed:
    name: str
    description: str  # what it needs, in words (the refusal starts with "needs " and this)
    problem: Callable[[Config, str], tuple[str, str] | None]  # (config key, what it got) or None


def _summed_logits(cfg: Config, party: str) -> tuple[str, str] | None:
    if cfg.protocol.aggregation == "sum" and cfg.model.top.kind == "none":
        return None
    key = "protocol.aggregation" if cfg.protocol.aggregation != "sum" else "model.top.kind"
    return (
        key,
        f"got protocol.aggregation {cfg.protocol.aggregation!r} and model.top.kind {cfg.model.top.kind!r}",
    )


def _linear_bottoms(passive_only: bool) -> Callable[[Config, str], tuple[str, str] | None]:
    def problem(cfg: Config, party: str) -> tuple[str, str] | None:
        for i, p in enumerate(cfg.parties):
            if p.role == "coordinator" or (passive_only and p.role != "passive"):
                continue
            if (passive_only and p.bottom is None) or (p.bottom is not None and p.bottom.kind != "linear"):
                kind = "none" if p.bottom is None else repr(p.bottom.kind)
                return f"parties[{i}].bottom.kind", f"{p.name}'s bottom is {kind}"
        return None

    return problem


def _plaintext_embeddings(cfg: Config, party: str) -> tuple[str, str] | None:
    if cfg.protocol.kind == "split-he":
        return "protocol.kind", "under split-he the embeddings arrive encrypted"
    return None


def _tree(cfg: Config, party: str) -> tuple[str, str] | None:
    if cfg.protocol.kind == "secureboost":
        return None
    return "protocol.kind", f"got protocol {cfg.protocol.kind!r}"


MODEL_NEEDS: dict[str, ModelNeed] = {
    n.name: n
    for n in (
        ModelNeed(
            "summed-logits",
            "passive parties that send logits summed at the active party, no top model (paper 004, Lemma 1 "
            "and Theorem 1: the gradient a passive party gets is over the classes)",
            _summed_logits,
        ),
        ModelNeed(
            "input-layer-cut",
            "an input-layer cut (paper 000): every passive bottom one linear layer ({kind: linear})",
            _linear_bottoms(passive_only=True),
        ),
        ModelNeed(
            "linear-model",
            "logistic regression: every bottom 'linear' (with summed logits, the sum of linear bottoms)",
            _linear_bottoms(passive_only=False),
        ),
        ModelNeed(
            "plaintext-embeddings", "plaintext embeddings on the wire (not split-he)", _plaintext_embeddings
        ),
        ModelNeed("tree", "a decision tree (protocol 'secureboost')", _tree),
    )
}


def model_problems(needs: tuple[str, ...], cfg: Config, party: str) -> list[tuple[str, str]]:
    """(config key, refusal) for each declared need the config does not meet, in declaration order."""
    out = []
    for name in needs:
        need = MODEL_NEEDS[name]
        found = need.problem(cfg, party)
        if found is not None:
            out.append((found[0], f"needs {need.description}; {found[1]}"))
    return out


def check_declared(owner: str, needs: tuple[str, ...]) -> None:
    """Refuse a declaration naming no known need (at class definition, not at the first run)."""
    unknown = [n for n in needs if n not in MODEL_NEEDS]
    if unknown:
        raise TypeError(f"{owner} declares model needs {unknown}, which are none of {sorted(MODEL_NEEDS)}")
