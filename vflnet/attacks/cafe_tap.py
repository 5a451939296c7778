"""CAFE (paper 002) as the coordinator's tap in a `param-server` run.

The honest-but-curious server's legitimate view, per training step: the batch sample IDs and
every party's parameters (its own broadcast, tapped on the RunStep requests) and every party's
batch-averaged parameter gradients (the StepReport uploads). The a-priori knowledge the paper
grants (model architecture, the training-set IDs, which address is which party) is delivered
by the coordinator explicitly; nothing else reaches the attack.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflnet.attacks.base import Attack, Tap
from vflnet.attacks.cafe import CafeAttack, CafeParams, ServerObservation
from vflnet.interceptors.events import WireEvent
from vflnet.models.cafe_net import TOP, CafeVFL, worker_name
from vflnet.registry import ATTACKS, Param
from vflnet.v1 import messages_pb2
from vflnet.wire.tensors import from_tensor_map


def _choice(options: tuple[str, ...]) -> Param:
    return Param(options[0], f"one of {', '.join(options)}", lambda v: v in options, f"one of {options}")


@ATTACKS.register
class CafeTap(Attack):
    name = "cafe"
    description = "paper 002 CAFE: recover every worker's training images from the server's parameters and gradient uploads"
    roles = frozenset({"coordinator"})
    taps = (Tap("RunStep", "request", "client"), Tap("RunStep", "response", "client"))
    knowledge = ("architecture", "train_ids", "party_addresses", "workers", "label_holder")
    truth_needed = "images"
    params = {
        "objective": _choice(("cafe", "dlg", "cosine", "sapag")),
        "loop": _choice(("single", "nested")),
        "lr_step3": Param(
            1e-2,
            "Step III learning rate (Table 9: MNIST 1e-2)",
            lambda v: isinstance(v, int | float) and v > 0,
            "a positive number",
        ),
        "seed": Param(0, "seed of the dummy data", lambda v: isinstance(v, int), "an integer"),
    }

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.attack: CafeAttack | None = None
        self.pending: dict[int, dict[str, Any]] = defaultdict(
            lambda: {"params": {}, "grads": {}, "ids": None}
        )

    def _attack(self) -> CafeAttack:
        if self.attack is None:
            k = self.context.knowledge
            template = CafeVFL(k["architecture"])
            cafe_params = CafeParams(
                n_samples=len(k["train_ids"]),
                objective=self.p["objective"],
                loop=self.p["loop"],
                lr_step3=float(self.p["lr_step3"]),
                seed=self.p["seed"],
            )
            self.attack = CafeAttack(cafe_params, template)
        return self.attack

    def _cafe_name(self, party: str) -> str:
        k = self.context.knowledge
        return TOP if party == k["label_holder"] else worker_name(k["workers"].index(party))

    @staticmethod
    def _rename(party_is_top: bool, values: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        out = {}
        for name, v in values.items():
            if party_is_top:  # vflnet's linear top ("top.net.*") is CAFE's top layer ("out.*")
                out[name.replace("top.net.", "out.")] = torch.from_numpy(v)
            else:
                out[name.removeprefix("bottom.")] = torch.from_numpy(v)
        return out

    def observe(self, event: WireEvent) -> None:
        if event.phase != messages_pb2.TRAIN:
            return
        k = self.context.knowledge
        step = int(event.step)
        slot = self.pending[step]
        if event.direction == "request":
            party = k["party_addresses"][event.peer]
            slot["params"][party] = from_tensor_map(event.message.params, "broadcast")
            slot["ids"] = event.sample_ids
            return
        party = event.sender
        slot["grads"][party] = from_tensor_map(event.message.grads, "upload")
        parties = set(k["workers"]) | {k["label_holder"]}
        if set(slot["grads"]) == parties and set(slot["params"]) == parties:
            del self.pending[step]
            rows = np.searchsorted(k["train_ids"], slot["ids"])
            to_cafe = {p: self._cafe_name(p) for p in parties}
            obs = ServerObservation(
                iteration=step,
                batch_ids=rows,
                params={to_cafe[p]: self._rename(to_cafe[p] == TOP, v) for p, v in slot["params"].items()},
                grads={to_cafe[p]: self._rename(to_cafe[p] == TOP, v) for p, v in slot["grads"].items()},
            )
            self._attack().observe(obs)

    def output(self) -> dict[str, np.ndarray]:
        k = self.context.knowledge
        out: dict[str, np.ndarray] = {
            "train_ids": np.asarray(k.get("train_ids", []), dtype=np.int64),
            "workers": np.array(k.get("workers", [])),
        }
        if self.attack is None:
            return out
        result = self.attack.result()
        for m, region in enumerate(result.regions):
            out[f"regions/{m}"] = region.numpy()
        out["label_probs"] = result.label_probs.numpy()
        out["seen"] = result.seen
        out["iterations"] = np.array(result.iterations)
        return out

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: dict[str, Any]) -> dict[str, float]:
        from vflnet.metrics.images import mse, psnr

        if "seen" not in output:
            return {"iterations": 0}
        ids, seen = output["train_ids"], output["seen"]
        reals, fakes = [], []
        for m, party in enumerate(output["workers"].tolist()):
            truth_ids, images = truth[party]
            reals.append(torch.from_numpy(images[np.searchsorted(truth_ids, ids)][seen]))
            fakes.append(torch.from_numpy(output[f"regions/{m}"][seen]))
        real, fake = torch.cat(reals, dim=1), torch.cat(fakes, dim=1)  # all regions of a sample side by side
        labels = truth["labels"]
        true_labels = np.array([labels[int(i)] for i in ids[seen]])
        recovered = output["label_probs"][seen].argmax(axis=1)
        return {
            "psnr": psnr(real, fake),
            "mse": mse(real, fake),
            "label_accuracy": float((recovered == true_labels).mean()),
            "samples_seen": int(seen.sum()),
            "iterations": int(output["iterations"]),
        }

    @classmethod
    def pictures(cls, output: dict[str, np.ndarray], truth: dict[str, Any], out_dir: Path) -> list[Path]:
        from vflnet.metrics.images import save_image_grid

        if "seen" not in output:
            return []
        ids, seen = output["train_ids"], output["seen"]
        workers = output["workers"].tolist()
        reals = [torch.from_numpy(truth[p][1][np.searchsorted(truth[p][0], ids)][seen]) for p in workers]
        fakes = [torch.from_numpy(output[f"regions/{m}"][seen]) for m in range(len(workers))]
        path = out_dir / "cafe-real-vs-recovered.png"
        return [
            save_image_grid(
                torch.cat(reals, dim=3), torch.cat(fakes, dim=3), path, title="CAFE: real (top) vs recovered"
            )
        ]
