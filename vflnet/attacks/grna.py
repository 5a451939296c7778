"""Paper 003 Sec. V, Algorithm 2: the generative regression network attack (GRNA).

Over many accumulated predictions (x_adv^t, v^t), the adversary trains a generator f_G(x_adv, r) ->
x_target-hat (r ~ N(0, 1), one value per target feature) so that the released model f, fed
(x_adv, x_target-hat), reproduces the observed confidence vectors; a penalty on the variance of the
generated values keeps them from drifting to meaningless samples (Eq. 9). The attacked samples are
the ones it trained on. A random forest is not differentiable: the adversary first fits an NN that
imitates it on dummy samples drawn from the whole (0, 1) feature space (Sec. V-B).

Hyperparameters the paper leaves open follow the authors' code: Adam lr 1e-4, batch 64,
lambda_var 0.25, sigmoid output, LayerNorm after every hidden layer (600, 200, 100).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from vflnet.attacks.prediction_base import PredictionAttack, rebuild_bottom, target_truth
from vflnet.metrics.features import random_guess
from vflnet.registry import ATTACKS, Param

Model = Callable[[torch.Tensor], torch.Tensor]  # full feature vector (n, d) -> confidence vectors (n, c)


@dataclass(frozen=True)
class GrnSettings:
    epochs: int = 60
    batch_size: int = 64
    lr: float = 1e-4
    lambda_var: float = 0.25
    use_x_adv: bool = True  # Table III case 1 turns it off
    use_noise: bool = True  # Table III case 2 turns it off
    seed: int = 0


def assemble(
    x_adv: torch.Tensor, x_target: torch.Tensor, adv_cols: np.ndarray, target_cols: np.ndarray
) -> torch.Tensor:
    """The full feature vector in the model's column order."""
    d = len(adv_cols) + len(target_cols)
    x = torch.empty(x_adv.shape[0], d, dtype=x_adv.dtype)
    x[:, torch.as_tensor(adv_cols)] = x_adv
    x[:, torch.as_tensor(target_cols)] = x_target.to(x_adv.dtype)
    return x


def generator(d_in: int, d_target: int) -> nn.Module:
    layers: list[nn.Module] = []
    for width in (600, 200, 100):
        layers += [nn.Linear(d_in, width), nn.LayerNorm(width), nn.ReLU()]
        d_in = width
    layers += [nn.Linear(d_in, d_target), nn.Sigmoid()]
    return nn.Sequential(*layers)


def generative_regression(
    model: Model,
    x_adv: np.ndarray,
    v: np.ndarray,
    adv_cols: np.ndarray,
    target_cols: np.ndarray,
    settings: GrnSettings = GrnSettings(),
) -> np.ndarray:
    """Train the generator on the accumulated predictions; return its estimates for those samples."""
    torch.manual_seed(settings.seed)
    xa = torch.as_tensor(np.asarray(x_adv), dtype=torch.float32)
    vt = torch.as_tensor(np.asarray(v), dtype=torch.float32)
    n, d_target = xa.shape[0], len(target_cols)
    d_in = (xa.shape[1] if settings.use_x_adv else 0) + (d_target if settings.use_noise else 0)
    if d_in == 0:
        raise ValueError("the generator needs x_adv or noise as input")
    gen = generator(d_in, d_target)
    opt = torch.optim.Adam(gen.parameters(), lr=settings.lr)

    def inputs(rows: torch.Tensor) -> torch.Tensor:
        parts = [xa[rows]] if settings.use_x_adv else []
        if settings.use_noise:
            parts.append(torch.randn(len(rows), d_target))
        return torch.cat(parts, 1)

    for _ in range(settings.epochs):
        for rows in torch.randperm(n).split(settings.batch_size):
            x_hat = gen(inputs(rows))
            out = model(assemble(xa[rows], x_hat, adv_cols, target_cols))
            loss = ((out - vt[rows]) ** 2).sum(1).mean()
            if settings.lambda_var and len(rows) > 1:
                loss = loss + settings.lambda_var * x_hat.var(0).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return gen(inputs(torch.arange(n))).double().numpy()


def naive_regression(
    model: Model,
    x_adv: np.ndarray,
    v: np.ndarray,
    adv_cols: np.ndarray,
    target_cols: np.ndarray,
    epochs: int = 60,
    lr: float = 1e-2,
    seed: int = 0,
) -> np.ndarray:
    """Table III case 4: no generator; x_target-hat are free per-sample parameters (from U(0, 1))
    fitted so that f reproduces v."""
    torch.manual_seed(seed)
    xa = torch.as_tensor(np.asarray(x_adv), dtype=torch.float32)
    vt = torch.as_tensor(np.asarray(v), dtype=torch.float32)
    x_hat = torch.rand(xa.shape[0], len(target_cols), requires_grad=True)
    opt = torch.optim.Adam([x_hat], lr=lr)
    for _ in range(epochs):
        loss = ((model(assemble(xa, x_hat, adv_cols, target_cols)) - vt) ** 2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return x_hat.detach().double().numpy()


def imitate(
    predict_proba: Callable[[np.ndarray], np.ndarray], d: int, n_dummy: int, seed: int = 0, epochs: int = 5
) -> nn.Module:
    """Sec. V-B: an MLP (2000, 200 hidden, sigmoid out) fitted to a non-differentiable model's
    outputs on dummy samples drawn from U(0, 1)^d."""
    torch.manual_seed(seed)
    x = np.random.default_rng(seed).uniform(0, 1, (n_dummy, d))
    y = torch.as_tensor(predict_proba(x), dtype=torch.float32)
    xt = torch.as_tensor(x, dtype=torch.float32)
    net = nn.Sequential(
        nn.Linear(d, 2000),
        nn.Dropout(),
        nn.ReLU(),
        nn.Linear(2000, 200),
        nn.Dropout(),
        nn.ReLU(),
        nn.Linear(200, y.shape[1]),
        nn.Sigmoid(),
    )
    opt = torch.optim.Adam(net.parameters())
    for _ in range(epochs):
        for rows in torch.randperm(n_dummy).split(64):
            loss = ((net(xt[rows]) - y[rows]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def _int_param(default: int, help_: str, lo: int) -> Param:
    return Param(
        default,
        help_,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo,
        f"an integer >= {lo}",
    )


@ATTACKS.register
class GenerativeRegression(PredictionAttack):
    name = "grna"
    description = "paper 003 generative regression network attack over the accumulated predictions (NN/LR; trees through an imitating NN)"
    params = {
        "epochs": _int_param(60, "generator training epochs", 1),
        "batch_size": _int_param(64, "generator batch size", 1),
        "lr": Param(
            1e-4, "Adam learning rate", lambda v: isinstance(v, int | float) and v > 0, "a positive number"
        ),
        "lambda_var": Param(
            0.25, "weight of the variance penalty", lambda v: isinstance(v, int | float), "a number"
        ),
        "aggregation": Param(
            "sum",
            "how the released model combines the bottoms (the run's protocol.aggregation)",
            lambda v: v in ("sum", "concat"),
            "'sum' or 'concat'",
        ),
        "dummy_factor": _int_param(10, "trees: dummy samples per prediction for the imitating NN", 1),
        "seed": _int_param(0, "seed", 0),
        # Table III's ablations
        "use_x_adv": Param(
            True, "feed x_adv to the generator (case 1: false)", lambda v: isinstance(v, bool), "a boolean"
        ),
        "use_noise": Param(
            True, "feed noise to the generator (case 2: false)", lambda v: isinstance(v, bool), "a boolean"
        ),
        "naive": Param(
            False,
            "no generator: naive regression of free estimates (case 4)",
            lambda v: isinstance(v, bool),
            "a boolean",
        ),
    }

    def output(self) -> dict[str, np.ndarray]:
        ids, v, x_adv, own = self.gathered()
        if len(ids) == 0:
            return {"sample_ids": ids, "x_target": np.zeros((0, 0))}
        released = self.released()
        widths = [int(np.prod(got["spec"]["bottom"]["input_shape"])) for got in released.values()]
        d_adv, d_t = x_adv.shape[1], sum(widths)
        adv_cols, target_cols = np.arange(d_adv), np.arange(d_adv, d_adv + d_t)
        if isinstance(own, dict) and "ensemble" in own:
            model = self._imitation(own, released, d_adv, widths, len(ids))
        else:
            model = self._network(own, released, d_adv, widths)
        if self.p["naive"]:
            x_hat = naive_regression(
                model, x_adv, v, adv_cols, target_cols, int(self.p["epochs"]), seed=int(self.p["seed"])
            )
            return {"sample_ids": ids, "x_target": x_hat}
        settings = GrnSettings(
            epochs=int(self.p["epochs"]),
            batch_size=int(self.p["batch_size"]),
            lr=float(self.p["lr"]),
            lambda_var=float(self.p["lambda_var"]),
            use_x_adv=bool(self.p["use_x_adv"]),
            use_noise=bool(self.p["use_noise"]),
            seed=int(self.p["seed"]),
        )
        out = {
            "sample_ids": ids,
            "x_target": generative_regression(model, x_adv, v, adv_cols, target_cols, settings),
            "confidence": v,  # what it observed, kept for the correlation diagnostics (Eqs. 16-17)
            "x_adv": x_adv,
        }
        if isinstance(own, dict) and "ensemble" in own:  # for the CBR of Fig. 8: the target's splits
            from vflnet.attacks.pra import split_tables

            tables = split_tables(released, 0)
            features, thresholds = [], []
            for tree in own["ensemble"].trees:
                for i in np.flatnonzero(tree.kind == 1):
                    owner = own["owners"][int(tree.owner[i])]
                    if owner in tables:
                        base, feats, cuts = tables[owner]
                        features.append(base + int(feats[tree.split_id[i]]))
                        thresholds.append(float(cuts[tree.split_id[i]]))
            out["split_target_feature"] = np.array(features, np.int64)
            out["split_threshold"] = np.array(thresholds, np.float64)
        return out

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        """The shared scores; on trees also the CBR of the estimates over every target split of every
        tree (paper Fig. 8, the authors' code), beside that of a U(0, 1) guess."""
        out = super().score(output, truth)
        if out and len(output.get("split_threshold", ())):
            x = target_truth(truth, output["sample_ids"])
            f, t = output["split_target_feature"], output["split_threshold"]
            side = x[:, f] <= t
            guess = random_guess(x.shape, "uniform")
            out["cbr"] = float(((output["x_target"][:, f] <= t) == side).mean())
            out["cbr_uniform"] = float(((guess[:, f] <= t) == side).mean())
            # trivial attackers on the data's own scale: each split's majority side, and draws from each
            # feature's marginal (its column, shuffled)
            out["cbr_constant"] = float(np.maximum(side.mean(0), 1 - side.mean(0)).mean())
            marginal = x[np.random.default_rng(0).permutation(len(x))]
            out["cbr_marginal"] = float(((marginal[:, f] <= t) == side).mean())
        return out

    def _network(
        self, own: dict[str, nn.Module], released: dict[str, Any], d_adv: int, widths: list[int]
    ) -> Model:
        """The joint network: the active party's own bottom and top, the passive parties' released bottoms."""
        from vflnet.models.zoo import aggregate

        bottoms = [rebuild_bottom(got) for got in released.values()]
        own_bottom, top = own.get("bottom"), own["top"]
        for m in [top, *bottoms, *([own_bottom] if own_bottom is not None else [])]:
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)
        bounds = np.cumsum([d_adv, *widths])

        def f(x: torch.Tensor) -> torch.Tensor:
            parts = [own_bottom(x[:, :d_adv])] if own_bottom is not None else []
            parts += [b(x[:, lo:hi]) for b, lo, hi in zip(bottoms, bounds[:-1], bounds[1:], strict=True)]
            return torch.softmax(top(aggregate(parts, self.p["aggregation"])), 1)

        return f

    def _imitation(
        self, own: dict[str, Any], released: dict[str, Any], d_adv: int, widths: list[int], n: int
    ) -> Model:
        """Sec. V-B: the tree ensemble (its thresholds all known to the adversary) imitated by an NN."""
        from vflnet.attacks.pra import tables_route

        route = tables_route(own, released, d_adv)
        ensemble = own["ensemble"]

        def proba(x: np.ndarray) -> np.ndarray:
            return ensemble.predict(lambda owner, ids: route(x, owner, ids), len(x))

        net = imitate(proba, d_adv + sum(widths), int(self.p["dummy_factor"]) * n, int(self.p["seed"]))
        return lambda x: net(x.float())
