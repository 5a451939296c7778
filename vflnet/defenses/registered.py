"""The active party's label defenses of paper 004 (and its baselines), registered by name.

Each label defense builds its `implementation`, a `vflnet.defenses.label_defenses.LabelDefense`, which
the active party uses three ways: the training targets (CAE's soft fake labels), a transform of the
per-sample gradients it sends (noise, sparsification, discretisation, MARVELL), and the prediction rule
(CAE's decoder); MID, dCor and GradPerturb also change the split step itself
(`vflnet/defenses/training_defenses.py`). The upload defenses (param-server) build a transform of the gradient upload around theirs."""

from __future__ import annotations

from typing import Any

from vflnet.defenses import label_defenses as ld
from vflnet.defenses import training_defenses as td
from vflnet.defenses.base import Defense
from vflnet.defenses.dp_gradients import DpGradients
from vflnet.defenses.fake_gradients import FakeGradients
from vflnet.registry import DEFENSES, Param

_ACTIVE = frozenset({"active"})


def _p(default: Any, help_: str, lo: float, hi: float | None = None, integer: bool = False) -> Param:
    def check(v: Any) -> bool:
        ok_type = isinstance(v, int) if integer else isinstance(v, int | float)
        return ok_type and not isinstance(v, bool) and v >= lo and (hi is None or v < hi)

    kind = "an integer" if integer else "a number"
    bounds = f">= {lo}" + (f" and < {hi}" if hi is not None else "")
    return Param(default, help_, check, f"{kind} {bounds}")


@DEFENSES.register
class GaussianGradientNoise(Defense):
    name = "dp-gaussian"
    description = "clip each per-sample gradient to clip_norm, add N(0, scale^2) noise (DP-G)"
    implementation = ld.GaussianNoise
    roles = _ACTIVE
    params = {
        "scale": _p(0.01, "noise standard deviation", 0.0),
        "clip_norm": _p(0.2, "per-sample L2 clip", 1e-12),
    }

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(num_classes, self.p["scale"], self.p["clip_norm"], seed)


@DEFENSES.register
class LaplaceGradientNoise(Defense):
    name = "dp-laplace"
    description = "clip each per-sample gradient to clip_norm, add Laplace(0, scale) noise (DP-L)"
    implementation = ld.LaplaceNoise
    roles = _ACTIVE
    params = {"scale": _p(0.01, "noise scale", 0.0), "clip_norm": _p(0.2, "per-sample L2 clip", 1e-12)}

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(num_classes, self.p["scale"], self.p["clip_norm"], seed)


@DEFENSES.register
class Sparsification(Defense):
    name = "gradient-sparsification"
    description = "zero the smallest drop_rate% of the batch's gradient entries (GS)"
    implementation = ld.GradientSparsification
    roles = _ACTIVE
    params = {"drop_rate": _p(99.0, "percentage of entries zeroed", 0.0, 100.0)}

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(num_classes, self.p["drop_rate"])


@DEFENSES.register
class DiscreteGradients(Defense):
    name = "discrete-sgd"
    description = "quantise each gradient entry to one of `bins` levels (DiscreteSGD, DG)"
    implementation = ld.DiscreteSGD
    roles = _ACTIVE
    params = {"bins": _p(12, "number of levels", 1, integer=True)}

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(num_classes, self.p["bins"])


@DEFENSES.register
class Rounding(Defense):
    name = "rounding"
    description = "round gradient entries to `decimals` decimal places (baseline)"
    implementation = ld.GradientRounding
    roles = _ACTIVE
    params = {"decimals": _p(2, "decimal places kept", 0, integer=True)}

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(num_classes, self.p["decimals"])


@DEFENSES.register
class MarvellDefense(Defense):
    name = "marvell"
    description = "MARVELL optimised noise for binary tasks (power budget as a ratio of the gradient power)"
    implementation = ld.Marvell
    roles = _ACTIVE
    params = {"power_ratio": _p(1.0, "noise power budget / gradient power", 1e-12)}

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        if num_classes != 2:
            raise ValueError(f"marvell is defined for binary tasks, this dataset has {num_classes} classes")
        return self.implementation(self.p["power_ratio"], seed=seed)


def _autoencoder(num_classes: int, seed: int, params: dict[str, Any]) -> ld.ConfusionalAutoEncoder:
    import torch

    torch.manual_seed(seed)
    cae = ld.ConfusionalAutoEncoder(num_classes, lambda_2=params["lambda_2"])
    cae.fit(steps=params["ae_steps"])
    return cae


_CAE_PARAMS = {
    "lambda_2": _p(1.0, "weight of the entropy term (confusion)", 0.0),
    "ae_steps": _p(1000, "autoencoder training steps before the run (Algorithm 4)", 1, integer=True),
}


@DEFENSES.register
class CAE(Defense):
    name = "cae"
    description = (
        "confusional autoencoder: train on soft fake labels, decode predictions (paper 004 Alg. 4-5)"
    )
    implementation = ld.CAEDefense
    roles = _ACTIVE
    params = dict(_CAE_PARAMS)

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(_autoencoder(num_classes, seed, self.p))


@DEFENSES.register
class DCAE(Defense):
    name = "dcae"
    description = "CAE + DiscreteSGD on the sent gradients (paper 004)"
    implementation = ld.DCAEDefense
    roles = _ACTIVE
    params = {**_CAE_PARAMS, "bins": _p(12, "DiscreteSGD levels", 1, integer=True)}

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(_autoencoder(num_classes, seed, self.p), self.p["bins"])


_PLAINTEXT = frozenset({"plaintext-embeddings"})  # the active party sees embeddings in the clear


@DEFENSES.register
class MIDDefense(Defense):
    name = "mid"
    description = (
        "MID: a variational information bottleneck on each passive embedding, loss + lambda * KL (VFLAIR)"
    )
    implementation = td.MID
    roles = _ACTIVE
    requires = _PLAINTEXT
    params = {
        "lambda": _p(0.01, "weight of the KL term (VFLAIR's mid_lambda)", 0.0),
        "bottleneck_scale": _p(1, "bottleneck size / embedding size", 1, integer=True),
    }

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(num_classes, self.p["lambda"], self.p["bottleneck_scale"], seed)


@DEFENSES.register
class DistanceCorrelationDefense(Defense):
    name = "dcor"
    description = "dCor: loss + alpha * distance correlation of each passive embedding and the one-hot labels"
    implementation = td.DistanceCorrelation
    roles = _ACTIVE
    requires = _PLAINTEXT
    params = {"alpha": _p(0.5, "weight of the distance-correlation term", 0.0)}

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(num_classes, self.p["alpha"])


@DEFENSES.register
class GradPerturbDefense(Defense):
    name = "grad-perturb"
    description = (
        "GradPerturb: add sum_c u_c (gradient as if labelled c), u ~ Laplace(0, 2/perturb_epsilon) (VFLAIR)"
    )
    implementation = td.GradPerturb
    roles = _ACTIVE
    requires = _PLAINTEXT
    params = {
        "perturb_epsilon": _p(1.0, "privacy parameter: the Laplace scale is 2 / perturb_epsilon", 1e-12)
    }

    def build(self, num_classes: int, seed: int) -> ld.LabelDefense:
        return self.implementation(num_classes, self.p["perturb_epsilon"], seed)


def _numpy_transform(transform: Any) -> Any:
    """Adapt a dict-of-tensors transform to the party's dict-of-arrays gradient upload."""
    import numpy as np
    import torch

    def apply(grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = transform({k: torch.from_numpy(v) for k, v in grads.items()})
        return {k: v.detach().to(torch.float32).numpy() for k, v in out.items()}

    return apply


@DEFENSES.register
class FakeGradientsDefense(Defense):
    name = "fake-gradients"
    description = "paper 002 Algorithm 5: upload the nearest of nu sorted Gaussian candidates instead of the true gradient"
    roles = frozenset({"passive", "active"})
    acts_on = "upload"
    implementation = FakeGradients
    params = {
        "nu": _p(1000, "candidate vectors drawn per round", 1, integer=True),
        "sigma2": _p(1.1, "variance of the candidates", 1e-12),
        "max_rounds": _p(
            100, "rounds before the closest candidate is taken (keeps the loop finite)", 1, integer=True
        ),
    }

    def build(self, num_classes: int, seed: int) -> Any:
        return _numpy_transform(
            self.implementation(self.p["nu"], self.p["sigma2"], None, self.p["max_rounds"], seed)
        )


@DEFENSES.register
class DpGradientUpload(Defense):
    name = "dp-gradients"
    description = "clip the whole upload to clip_norm and add N(0, (noise_multiplier * clip_norm)^2) noise (DP baseline)"
    roles = frozenset({"passive", "active"})
    acts_on = "upload"
    implementation = DpGradients
    params = {
        "clip_norm": _p(3.0, "L2 clip of the upload", 1e-12),
        "noise_multiplier": _p(1.0, "noise std / clip_norm", 0.0),
    }

    def build(self, num_classes: int, seed: int) -> Any:
        return _numpy_transform(self.implementation(self.p["clip_norm"], self.p["noise_multiplier"], seed))
