"""CAFE (paper 002) as the coordinator's tap in a `param-server` run.

The honest-but-curious server's legitimate view, per training step: the batch sample IDs and
every party's parameters (its own broadcast, tapped on the RunStep requests) and every party's
batch-averaged parameter gradients (the StepReport uploads). The a-priori knowledge the paper
grants (model architecture, the training-set IDs, which address is which party) is delivered
by the coordinator explicitly; nothing else reaches the attack.

Its output: every worker's recovered image regions (Step III), Step II's estimates of fc1's inputs
(for an FC-only worker model these are the raw regions), the dummy-label beliefs, which training
samples it has seen, its last losses and, with ``snapshot_every``, the recovery every that many
iterations (to score PSNR against iterations, Table 5). ``score_recovery`` scores an output against
the ground truth, in the runner.

The attack iterates on a thread of its own, in step order, while the protocol goes on to the next step
(``output`` waits for it to finish); ``device: cuda`` puts it on a GPU.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflnet.attacks.cafe import CafeAttack, CafeParams, CafeResult, ServerObservation
from vflnet.config import Config
from vflnet.interceptors.events import WireEvent
from vflnet.models.cafe_net import TOP, CafeVFL, worker_name
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import Attack, Tap
from vflnet.v1 import messages_pb2
from vflnet.wire.tensors import from_tensor_map


def _choice(options: tuple[str, ...]) -> Param:
    return Param(options[0], f"one of {', '.join(options)}", lambda v: v in options, f"one of {options}")


def _positive(default: float, help_: str) -> Param:
    return Param(
        default,
        help_,
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0,
        "a positive number",
    )


def _count(default: int, help_: str) -> Param:
    return Param(
        default, help_, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"
    )


@ATTACKS.register
class CafeTap(Attack):
    name = "cafe"
    description = "paper 002 CAFE: recover every worker's training images from the server's parameters and gradient uploads"
    roles = frozenset({"coordinator"})
    taps = (Tap("RunStep", "request", "client"), Tap("RunStep", "response", "client"))
    knowledge = ("architecture", "train_ids", "party_addresses", "workers", "label_holder")
    truth_needed = "images"

    @classmethod
    def check_config(cls, cfg: Config, party: str) -> list[tuple[str, str]]:
        """CAFE's template is one worker model for every image region: the regions must be equal."""
        sizes = {
            p.name: (r[1] - r[0], r[3] - r[2])
            for p in cfg.passives
            if p.features is not None and (r := p.features.region) is not None
        }
        if len(set(sizes.values())) > 1:
            i = next(i for i, p in enumerate(cfg.parties) if p.name == list(sizes)[-1])
            shown = ", ".join(f"{n} {h}x{w}" for n, (h, w) in sizes.items())
            return [
                (f"parties[{i}].features.region", f"needs equal regions at every passive party, got {shown}")
            ]
        return []

    params = {
        "objective": _choice(("cafe", "dlg", "cosine", "sapag")),
        "loop": _choice(("single", "nested")),
        "lr_step1": _positive(1e-2, "Step I learning rate (Table 9: MNIST 1e-2)"),
        "lr_step3": _positive(1e-2, "Step III learning rate (Table 9: MNIST 1e-2)"),
        "nested_iterations": Param(
            [8000, 8000],
            "nested loop: iterations of Step I, then of Step II, before Step III",
            lambda v: isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) and i >= 0 for i in v),
            "two integers >= 0",
        ),
        "adam_bias_correction": _choice(("row", "global")),
        "tv_per_worker": Param(
            False,
            "TV weighted per worker: beta * sum of the workers' TVs (the authors' code) instead of their mean",
            lambda v: isinstance(v, bool),
            "true/false",
        ),
        "label_grad_scale": _positive(1.0, "the dummy labels' gradient times this (the authors' code: 1e4)"),
        "run_step3": Param(
            True, "run Step III (false: Steps I-II only)", lambda v: isinstance(v, bool), "true/false"
        ),
        "seed": Param(0, "seed of the dummy data", lambda v: isinstance(v, int), "an integer"),
        "snapshot_every": _count(0, "keep the recovery every this many iterations in the output (0: never)"),
        "device": Param(
            "cpu",
            "where the attack computes: cpu or cuda (fails at its first step where torch has no CUDA)",
            lambda v: v in ("cpu", "cuda"),
            "one of ('cpu', 'cuda')",
        ),
    }

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.attack: CafeAttack | None = None
        self.pending: dict[int, dict[str, Any]] = defaultdict(
            lambda: {"params": {}, "grads": {}, "ids": None}
        )
        self.snapshots: list[tuple[int, CafeResult]] = []
        self.residuals: list[tuple[int, float]] = []  # Step I's batch residual at each snapshot
        self.lock = threading.Lock()
        # The attack runs on a thread of its own, fed in step order: the protocol's next step (the
        # parties' training, the wire) overlaps this step's attack iteration instead of waiting for it.
        # Bounded, so the protocol runs at most two observations (~24 MB each at the paper setting) ahead.
        self._queue: queue.Queue[ServerObservation | None] = queue.Queue(maxsize=2)
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None

    def _attack(self) -> CafeAttack:
        if self.attack is None:
            k = self.context.knowledge
            template = CafeVFL(k["architecture"])
            cafe_params = CafeParams(
                n_samples=len(k["train_ids"]),
                objective=self.p["objective"],
                loop=self.p["loop"],
                lr_step1=float(self.p["lr_step1"]),
                lr_step3=float(self.p["lr_step3"]),
                nested_iterations=tuple(self.p["nested_iterations"]),
                run_step3=self.p["run_step3"],
                adam_bias_correction=self.p["adam_bias_correction"],
                tv_per_worker=self.p["tv_per_worker"],
                label_grad_scale=float(self.p["label_grad_scale"]),
                seed=self.p["seed"],
            )
            self.attack = CafeAttack(cafe_params, template, device=self.p["device"])
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
        with self.lock:  # the parties' RunStep replies arrive on concurrent threads
            self._observe(event)

    def _observe(self, event: WireEvent) -> None:
        k = self.context.knowledge
        step = int(event.step)
        slot = self.pending[step]
        if event.direction == "request":
            party = k["party_addresses"][event.peer]
            slot["params"][party] = from_tensor_map(event.message.protocol.tensors, "broadcast")
            slot["ids"] = event.sample_ids
            return
        party = event.sender
        slot["grads"][party] = from_tensor_map(event.message.protocol.tensors, "upload")
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
            self._submit(obs)

    def _submit(self, obs: ServerObservation) -> None:
        if self._error is not None:  # the attack failed on an earlier step: fail the run here
            raise RuntimeError("the CAFE attack failed") from self._error
        if self._worker is None:
            threads = torch.get_num_threads()  # the host thread's, which the run configured
            self._worker = threading.Thread(
                target=self._run, args=(threads,), name="cafe-attack", daemon=True
            )
            self._worker.start()
        self._queue.put(obs)

    def _run(self, threads: int) -> None:
        torch.set_num_threads(threads)  # per thread under OpenMP: as the run's other compute threads
        while (obs := self._queue.get()) is not None:
            try:
                if self._error is None:  # else keep taking observations: the protocol never blocks on it
                    self._step(obs)
            except BaseException as e:  # re-raised on the protocol's thread
                self._error = e
            finally:
                self._queue.task_done()

    def _step(self, obs: ServerObservation) -> None:
        attack = self._attack()
        attack.observe(obs)
        every = self.p["snapshot_every"]
        if every and attack.iterations % every == 0:
            result = attack.result()
            if "step1_residual" in result.last_losses:
                self.residuals.append((attack.iterations, result.last_losses["step1_residual"]))
            self.snapshots.append((attack.iterations, result))
            if attack.template.config.kind != "fc":  # Step II's estimates are images only without convs
                self.snapshots[-1][1].internal.clear()

    def _finish(self) -> None:
        """Wait until every observation handed to the attack thread has been consumed."""
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None
        if self._error is not None:
            raise RuntimeError("the CAFE attack failed") from self._error

    def state(self) -> dict[str, Any]:
        """For the coordinated checkpoint after step s: the attack once it has consumed observation s
        (every observation up to s is queued by then; this waits for the attack thread to take them)."""
        self._queue.join()
        if self._error is not None:
            raise RuntimeError("the CAFE attack failed") from self._error
        return {
            "attack": None if self.attack is None else self.attack.state_dict(),
            "snapshots": list(self.snapshots),
            "residuals": list(self.residuals),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        if state["attack"] is not None:
            self._attack().load_state_dict(state["attack"])
        self.snapshots = list(state["snapshots"])
        self.residuals = list(state["residuals"])

    def output(self) -> dict[str, np.ndarray]:
        self._finish()
        k = self.context.knowledge
        out: dict[str, np.ndarray] = {
            "train_ids": np.asarray(k.get("train_ids", []), dtype=np.int64),
            "workers": np.array(k.get("workers", [])),
        }
        if self.attack is None:
            return out
        result = self.attack.result()
        out.update(_result_arrays(result))
        for name, value in result.last_losses.items():
            out[f"losses/{name}"] = np.array(value)
        out["iterations"] = np.array(result.iterations)
        if self.residuals:
            out["residual_iterations"] = np.array([t for t, _ in self.residuals])
            out["residuals"] = np.array([r for _, r in self.residuals])
        if self.snapshots:
            out["snapshot_iterations"] = np.array([t for t, _ in self.snapshots])
            for i, (_, snap) in enumerate(self.snapshots):
                out.update(_result_arrays(snap, f"snapshot/{i}/"))
        return out

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: dict[str, Any]) -> dict[str, float]:
        """The final recovery's scores (``score_recovery``), and ``psnr@T`` (and ``internal_psnr@T``) for
        the snapshot after T iterations."""
        if "seen" not in output:
            return {"iterations": 0}
        scores = score_recovery(output, truth)
        scores["iterations"] = int(output["iterations"])
        if "losses/step1_residual" in output:  # the attack's own progress signal, no truth in it
            scores["step1_residual"] = float(output["losses/step1_residual"])
        residuals = zip(
            output.get("residual_iterations", np.zeros(0)).tolist(),
            output.get("residuals", np.zeros(0)).tolist(),
            strict=True,
        )
        scores.update({f"step1_residual@{t}": float(r) for t, r in residuals})
        for i, t in enumerate(output.get("snapshot_iterations", np.zeros(0, np.int64)).tolist()):
            snapshot = score_recovery(output, truth, f"snapshot/{i}/")
            scores.update(
                {
                    f"{key}@{t}": snapshot[key]
                    for key in ("psnr", "psnr_region", "internal_psnr")
                    if key in snapshot
                }
            )
        return scores

    @classmethod
    def pictures(cls, output: dict[str, np.ndarray], truth: dict[str, Any], out_dir: Path) -> list[Path]:
        from vflnet.metrics.images import save_image_grid

        if "seen" not in output:
            return []
        real, fake = _side_by_side(output, truth)
        path = out_dir / "cafe-real-vs-recovered.png"
        return [save_image_grid(real, fake, path, title="CAFE: real (top) vs recovered")]


def _result_arrays(result: CafeResult, prefix: str = "") -> dict[str, np.ndarray]:
    out = {f"{prefix}regions/{m}": region.numpy() for m, region in enumerate(result.regions)}
    out.update({f"{prefix}internal/{m}": h.numpy() for m, h in enumerate(result.internal)})
    out[f"{prefix}label_probs"] = result.label_probs.numpy()
    out[f"{prefix}seen"] = result.seen
    return out


def _side_by_side(
    output: dict[str, np.ndarray], truth: dict[str, Any], prefix: str = "", what: str = "regions"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every seen sample's true and recovered regions, the workers' regions side by side (along the
    width; ``what="internal"``: Step II's flat estimates, side by side along the features)."""
    ids, seen = output["train_ids"], output[f"{prefix}seen"]
    reals, fakes = [], []
    for m, party in enumerate(output["workers"].tolist()):
        truth_ids, images = truth[party]
        real = torch.from_numpy(images[np.searchsorted(truth_ids, ids)][seen])
        fake = torch.from_numpy(output[f"{prefix}{what}/{m}"][seen])
        reals.append(real if what == "regions" else real.flatten(1))
        fakes.append(fake)
    return torch.cat(reals, dim=-1), torch.cat(fakes, dim=-1)


def score_recovery(
    output: dict[str, np.ndarray], truth: dict[str, Any], prefix: str = ""
) -> dict[str, float]:
    """Score a CAFE output (its final recovery, or the snapshot under ``prefix``) against the ground
    truth over the samples it has seen: mean per-image PSNR and MSE of the recovered images (every
    worker's region of a sample together), the mean PSNR per region (each worker's region scored as an
    image of its own, as the authors' code does, over every seen sample rather than the current
    batch), recovered-label accuracy, and, where Step II's estimates
    have the shape of the regions (FC-only worker models), the PSNR of those estimates.

    ``truth`` is the runner's ``ground_truth(cfg, "images")``: the labels, and each passive party's
    own regions of every image as that party holds them."""
    from vflnet.metrics.images import mse, psnr, psnr_per_image

    real, fake = _side_by_side(output, truth, prefix)
    # the authors' form (DeRafael/CAFE utils.py PSNR): each worker's region its own image, averaged
    region_width = real.shape[-1] // len(output["workers"])
    per_region = [
        psnr_per_image(real[..., i : i + region_width], fake[..., i : i + region_width])
        for i in range(0, real.shape[-1], region_width)
    ]
    ids, seen = output["train_ids"], output[f"{prefix}seen"]
    labels = truth["labels"]
    true_labels = np.array([labels[int(i)] for i in ids[seen]])
    recovered = output[f"{prefix}label_probs"][seen].argmax(axis=1)
    scores = {
        "psnr": psnr(real, fake),
        "psnr_region": float(torch.cat(per_region).mean()),
        "mse": mse(real, fake),
        "label_accuracy": float((recovered == true_labels).mean()),
        "samples_seen": int(seen.sum()),
    }
    internal = f"{prefix}internal/0"
    if internal in output and output[internal].shape[1:] == (
        int(np.prod(real.shape[1:])) // len(output["workers"]),
    ):
        real_flat, fake_flat = _side_by_side(output, truth, prefix, "internal")
        scores["internal_psnr"] = psnr(real_flat, fake_flat)
    return scores
