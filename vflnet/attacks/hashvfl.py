"""The attacks paper 001 measures HashVFL against, each on one party's wire.

- `model-inversion` (active party = the paper's server; Table IV, Fig. 3): white-box inversion of a
  passive party's inputs from what that party sent for test samples, with the party's model obtained
  through a model release: argmin_x MSE(f(x), h) + tv_weight * TV(x), x clamped to [0, 1], from a
  constant 0.5 start. Under hashvfl, h is the observed +/-1 code and f the released
  bottom -> BN up to the pre-sign activation (in inference mode); under plain split (the no-defense
  control) h is the real-valued embedding and f the released bottom. TV is the paper's isotropic form.
- `pgd-code-rewrite` (a malicious passive party; Table V): at prediction time it rewrites the
  intermediate result it submits by targeted PGD on the released top model,
  x_m = x_{m-1} - eta * sign(grad CE(top(x_{m-1}), target)), phi = clip(x_m - x_0, -omega, omega).
  The other parties' inputs are unknown to it and taken as zeros (the mean of balanced +/-1 bits).
  Under hashvfl the wire only carries +/-1 codes, so it sends Sign(x_0 + phi) bit-packed; a
  perturbation below 1 cannot flip a bit. Under split it sends x_0 + phi.
- `hamming-detector` (active party; Table VI's runtime check): pairs the parties' codes of each
  evaluation / prediction sample and flags those whose Hamming distance exceeds d/2.

Ground truth never reaches them: scores (SSIM, MSE) are computed by the runner after the run.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch
from google.protobuf.message import Message
from torch.nn import functional as F

from vflnet.config import Config
from vflnet.defenses.hashing import hamming, hard_sign
from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import Attack, Tap
from vflnet.v1 import messages_pb2
from vflnet.wire import tensors


def _num(lo: float, help_: str, default: float) -> Param:
    return Param(
        default,
        help_,
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= lo,
        f"a number >= {lo}",
    )


def _int(lo: int, help_: str, default: int) -> Param:
    return Param(
        default,
        help_,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo,
        f"an integer >= {lo}",
    )


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Isotropic TV of each image [N, 1, H, W]: sum_ij sqrt(dx^2 + dy^2) (paper 001's form)."""
    dx = x[..., 1:, :-1] - x[..., :-1, :-1]
    dy = x[..., :-1, 1:] - x[..., :-1, :-1]
    return (dx**2 + dy**2 + 1e-8).sqrt().flatten(1).sum(1)


def invert(
    model: torch.nn.Module,
    targets: torch.Tensor,
    shape: tuple[int, ...],
    image_hw: tuple[int, int],
    iterations: int,
    lr: float,
    tv_weight: float,
) -> torch.Tensor:
    """Inputs x in [0, 1] (one per target row) whose model output matches the target rows."""
    x = torch.full((len(targets), *shape), 0.5, requires_grad=True)
    opt = torch.optim.Adam([x], lr=lr)
    model.requires_grad_(False)
    for _ in range(iterations):
        opt.zero_grad()
        fit = (model(x) - targets).pow(2).mean(1)
        loss = (fit + tv_weight * total_variation(x.reshape(len(x), 1, *image_hw))).sum()
        loss.backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(0, 1)
    return x.detach()


@ATTACKS.register
class ModelInversion(Attack):
    name = "model-inversion"
    description = "paper 001: white-box inversion (MSE + TV) of a passive party's inputs from its codes / embeddings, model from a release"
    roles = frozenset({"active"})
    taps = (Tap("ExchangeEmbeddings", "request", "server"),)
    knowledge = ("released_model",)
    model_needs = ("plaintext-embeddings",)  # it inverts the target's codes or embeddings as sent
    truth_needed = "images"
    params = {
        "target": Param(
            "passive-1",
            "the passive party whose inputs are reconstructed",
            lambda v: isinstance(v, str),
            "a party name",
        ),
        "n_samples": _int(1, "test samples reconstructed (evenly spaced over the evaluated IDs)", 16),
        "iterations": _int(1, "optimisation steps (paper: 3,000)", 3000),
        "lr": _num(0.0, "Adam learning rate", 0.01),
        "tv_weight": _num(0.0, "weight of the TV prior", 0.001),
        "image_shape": Param(
            [],
            "[h, w] of the target's region when its inputs are flat (mlp bottoms)",
            lambda v: isinstance(v, list),
            "a list",
        ),
    }

    @classmethod
    def check_config(cls, cfg: Config, party: str) -> list[tuple[str, str]]:
        """Plaintext codes or embeddings of a target that holds an image region, whose shape is known:
        its bottom takes the image, or ``image_shape`` gives it (a flat mlp input)."""
        from vflnet.data.partition import takes_image

        for i, entry in enumerate(cfg.attacks):
            if entry.name != cls.name or entry.party != party:
                continue
            target = entry.params.get("target", cls.params["target"].default)
            owner = next((p for p in cfg.passives if p.name == target), None)
            if owner is None:
                return [(f"attacks[{i}].params.target", f"{target!r} is no passive party of the run")]
            if owner.features is None or owner.features.region is None or owner.bottom is None:
                return [(f"attacks[{i}].params.target", f"{target} holds no image region to reconstruct")]
            if not takes_image(owner.bottom) and not entry.params.get("image_shape"):
                return [
                    (
                        f"attacks[{i}].params.image_shape",
                        f"{target}'s {owner.bottom.kind!r} bottom takes flat inputs: give [h, w] of its region",
                    )
                ]
        return []

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.seen: dict[int, np.ndarray] = {}

    def observe(self, event: WireEvent) -> None:
        if event.phase != messages_pb2.EVAL or event.sender != self.p["target"]:
            return
        values = event.tensors()["values"]
        self.seen.update(zip(event.sample_ids.tolist(), values, strict=True))

    def output(self) -> dict[str, np.ndarray]:
        from vflnet.protocols.hashvfl import rebuild_bottom

        released = self.context.knowledge.get("released_model", {}).get(self.p["target"])
        if released is None or not self.seen:
            raise ValueError(
                f"{self.name}: needs {self.p['target']}'s released bottom and its evaluation traffic"
            )
        model = rebuild_bottom(released)
        shape = tuple(released["spec"]["bottom"]["input_shape"])
        image_hw = tuple(self.p["image_shape"]) or shape[-2:]
        seen = np.array(sorted(self.seen), dtype=np.int64)  # the last evaluation's output per sample
        ids = seen[np.linspace(0, len(seen) - 1, min(self.p["n_samples"], len(seen))).round().astype(int)]
        targets = torch.from_numpy(np.stack([self.seen[int(i)] for i in ids]))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            x = invert(
                model, targets, shape, image_hw, self.p["iterations"], self.p["lr"], self.p["tv_weight"]
            )
        return {
            "sample_ids": ids,
            "targets": targets.numpy(),
            "reconstructions": x.reshape(len(x), 1, *image_hw).numpy(),
            "party": np.array(self.p["target"]),
        }

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        from vflnet.metrics.images import mse, ssim_per_image

        real, fake = cls.pair(output, truth)
        return {
            "ssim": float(ssim_per_image(real, fake).mean()),
            "ssim_std": float(ssim_per_image(real, fake).std()),
            "mse": mse(real, fake),
            "samples": len(real),
        }

    @staticmethod
    def pair(output: dict[str, np.ndarray], truth: Any) -> tuple[torch.Tensor, torch.Tensor]:
        ids, x = truth[str(output["party"])]
        row = {int(i): k for k, i in enumerate(ids)}
        fake = torch.from_numpy(output["reconstructions"])
        real = torch.from_numpy(np.stack([x[row[int(i)]] for i in output["sample_ids"]])).reshape(fake.shape)
        return real.float(), fake

    @classmethod
    def pictures(cls, output: dict[str, np.ndarray], truth: Any, out_dir: Any) -> list[Any]:
        from pathlib import Path

        from vflnet.metrics.images import save_image_grid

        real, fake = cls.pair(output, truth)
        return [save_image_grid(real, fake, Path(out_dir) / f"{cls.name}-grid.png", n=16, title=cls.name)]


def pgd(
    top: torch.nn.Module,
    x0: torch.Tensor,
    before: torch.Tensor,
    after: torch.Tensor,
    target_class: int,
    omega: float,
    eta: float,
    iterations: int,
) -> torch.Tensor:
    """Targeted PGD (paper 001, Eq. 1) on one block x0 of the top model's input, the other parties'
    blocks (``before``, ``after``) held fixed: x_m = x_{m-1} - eta sign(grad), |x_m - x0| <= omega."""
    target = torch.full((len(x0),), target_class, dtype=torch.long)
    x = x0.clone()
    for _ in range(iterations):
        x.requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(top(torch.cat([before, x, after], dim=1)), target), x)
        with torch.no_grad():
            x = x0 + (x - eta * grad.sign() - x0).clamp(-omega, omega)
    return x.detach()


@ATTACKS.register
class PgdCodeRewrite(Attack):
    name = "pgd-code-rewrite"
    description = "paper 001 Table V: targeted PGD on the intermediate result a malicious passive party submits at prediction time"
    roles = frozenset({"passive"})
    taps = ()
    rewrites = (Tap("ExchangeEmbeddings", "request", "client"),)
    knowledge = ("released_model",)
    params = {
        "owner": Param(
            "active",
            "the party whose released top model is used",
            lambda v: isinstance(v, str),
            "a party name",
        ),
        "target_class": _int(0, "the class the attack pushes samples to", 0),
        "omega": _num(0.0, "bound of the total perturbation |phi|", 1.0),
        "eta": _num(0.0, "step size", 0.1),
        "iterations": _int(1, "PGD steps (the paper gives none)", 5),
        "position": _int(
            0, "index of this party's block in the top model's input (roster order of the passive parties)", 1
        ),
        "n_blocks": _int(1, "number of parties' blocks the top model concatenates", 2),
    }

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.ids: list[np.ndarray] = []
        self.flipped: list[np.ndarray] = []

    def observe(self, event: WireEvent) -> None:
        """Rewrites only."""

    def rewrite(self, event: WireEvent) -> Message | None:
        msg = event.message
        if msg.header.phase != messages_pb2.PREDICT:
            return None
        from vflnet.protocols.hashvfl import rebuild_top

        released = self.context.knowledge.get("released_model", {}).get(self.p["owner"])
        if released is None:
            raise ValueError(f"{self.name}: no top model was released to {self.context.party}")
        top = rebuild_top(released)
        top.requires_grad_(False)
        packed = msg.values.dtype == tensors.PM1
        x0 = torch.from_numpy(tensors.from_proto(msg.values))
        x = self.perturb(top, x0)
        sent = hard_sign(x) if packed else x
        out = messages_pb2.Embeddings()
        out.CopyFrom(msg)
        out.values.CopyFrom(tensors.to_pm1_proto(sent) if packed else tensors.to_proto(sent))
        self.ids.append(np.asarray(msg.sample_ids, dtype=np.int64))
        self.flipped.append(
            (hard_sign(sent) != hard_sign(x0)).sum(1).numpy() if packed else np.zeros(len(x0))
        )
        return out

    def perturb(self, top: torch.nn.Module, x0: torch.Tensor) -> torch.Tensor:
        d, k, n = x0.shape[1], self.p["position"], self.p["n_blocks"]
        return pgd(
            top,
            x0,
            torch.zeros(len(x0), d * k),
            torch.zeros(len(x0), d * (n - k - 1)),
            self.p["target_class"],
            self.p["omega"],
            self.p["eta"],
            self.p["iterations"],
        )

    def output(self) -> dict[str, np.ndarray]:
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, np.int64)
        flipped = np.concatenate(self.flipped) if self.flipped else np.zeros(0)
        return {"sample_ids": ids, "bits_flipped": flipped}


@ATTACKS.register
class HammingDetector(Attack):
    name = "hamming-detector"
    description = "paper 001 Sec. V-D: flag evaluation / prediction samples whose parties' codes are more than d/2 apart"
    roles = frozenset({"active"})
    taps = (Tap("ExchangeEmbeddings", "request", "server"),)
    params = {
        "phase": Param(
            "predict",
            "which pass is checked: eval or predict",
            lambda v: v in ("eval", "predict"),
            "eval or predict",
        )
    }

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.codes: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = defaultdict(dict)

    def observe(self, event: WireEvent) -> None:
        want = messages_pb2.PREDICT if self.p["phase"] == "predict" else messages_pb2.EVAL
        if event.phase != want:
            return
        self.codes[int(event.step)][str(event.sender)] = (event.sample_ids, event.tensors()["values"])

    def output(self) -> dict[str, np.ndarray]:
        ids, dist, width = [], [], 0
        for _, by_party in sorted(self.codes.items()):
            if len(by_party) < 2:
                continue
            (ia, a), (_, b) = (by_party[p] for p in sorted(by_party)[:2])
            ids.append(ia)
            dist.append(hamming(torch.from_numpy(a), torch.from_numpy(b)).numpy())
            width = a.shape[1]
        d = np.concatenate(dist) if dist else np.zeros(0)
        return {
            "sample_ids": np.concatenate(ids) if ids else np.zeros(0, np.int64),
            "hamming": d,
            "flagged": d > width / 2,
        }
