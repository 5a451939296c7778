"""A test attack that records what a passive attacker legitimately holds at each training step, the
way the real label attacks get it: the per-sample gradients in the replies to its ExchangeEmbeddings
requests (plaintext split; ciphertexts under split-he) and its own view (`OwnStepView`: its rows of the
batch, its bottom model before the update, the batch-level gradient it applied). The label attack and
defense unit tests (tests/paper004.py) run the algorithm cores on these views."""

from __future__ import annotations

import numpy as np

from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import OwnStepView, PerSampleGradientAttack


def _step(default: int, help_: str) -> Param:
    return Param(default, help_, lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")


@ATTACKS.register
class ViewRecorder(PerSampleGradientAttack):
    name = "view-recorder"
    description = "test only: records a passive party's per-sample gradients and own view of training steps"
    wants_own_view = True
    params = {
        "first_step": _step(1, "first training step recorded (the coordinator's step number)"),
        "last_step": _step(0, "last training step recorded (0: every step from first_step on)"),
    }

    def __init__(self, context, **params) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.arrays: dict[str, np.ndarray] = {}
        self.steps: set[int] = set()
        self.num_classes = 0

    def _wanted(self, step: int) -> bool:
        return step >= self.p["first_step"] and (not self.p["last_step"] or step <= self.p["last_step"])

    def observe_batch(self, step: int, ids: np.ndarray, reply: WireEvent) -> None:
        grad = reply.tensors().get("values")  # None under split-he: ciphertexts
        if self._wanted(step) and grad is not None:
            self.arrays[f"{step}/grad_logits"] = grad

    def observe_own(self, view: OwnStepView) -> None:
        if not self._wanted(view.step):
            return
        self.steps.add(view.step)
        self.num_classes = view.num_classes
        self.arrays[f"{view.step}/sample_ids"] = view.sample_ids
        self.arrays[f"{view.step}/features"] = view.features
        for name, value in view.model.state_dict().items():
            self.arrays[f"{view.step}/model/{name}"] = value.numpy()
        for name, grad in view.param_grads.items():
            self.arrays[f"{view.step}/grad/{name}"] = grad.numpy()

    def output(self) -> dict[str, np.ndarray]:
        return {
            "steps": np.array(sorted(self.steps), dtype=np.int64),
            "num_classes": np.array(self.num_classes),
            **self.arrays,
        }
