"""HashVFL (paper 001): split learning in which each passive party sends only the +/-1 hash code of
its embedding, bit-packed, and the active party (the label holder, the paper's server) trains the top
model with cross-entropy plus the consistency term against pre-defined class codes.

Step order is split's (`vflnet/protocols/split.py`); what differs:

- passive: its model is ``HashedBottom`` (bottom -> BatchNorm1d, or no BN for the ``no_bn`` and
  ``greedy_hash`` variants); the code Sign(.) with Sign(0) = +1 is sent as dtype ``pm1`` (1 bit per
  value, `vflnet.wire.tensors.to_pm1_proto`); the gradient it gets back is the gradient of the pre-sign
  activation (straight-through). The pre-sign activations are never encoded. With ``dp_epsilon`` the
  code is re-signed after Laplace noise (Table VII) before it is sent.
- active: it accepts only bit-packed codes of the expected shape (anything else: INVALID_ARGUMENT),
  holds the class codes (module ``codes``, C distinct +/-1 rows drawn from its seed) and adds
  ``consistency_loss`` to the cross-entropy unless the variant has no class codes (``greedy_hash``,
  ``bsl``).
- the code length is the passive parties' ``bottom.out`` (all equal; the paper's default is
  ceil(log2 C), `vflnet.defenses.hashing.default_code_len`).
- the ``base_bn`` variant is the no-hash ablation (Table V's comparably scaled Base): bottom -> BN and
  no Sign, CE only; the passive party sends its BN output as float32 and the active party accepts
  only float32 of the expected shape from it.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from vflnet.config import ModelConfig
from vflnet.data.partition import party_seed
from vflnet.defenses import hashing
from vflnet.models.zoo import build_bottom
from vflnet.protocols.split import (
    SPLIT_HOOKS,
    ActiveSplit,
    PassiveSplit,
    SplitActive,
    SplitCoordinator,
    SplitPassive,
    StepResult,
    label_loss,
    outcome,
)
from vflnet.sdk import (
    PROTOCOLS,
    Config,
    LabelDefense,
    LocalModel,
    Param,
    Protocol,
    TopModel,
    from_pm1_proto,
    from_proto,
    invalid,
    to_pm1_proto,
    to_proto,
    to_tensor_map,
)
from vflnet.v1 import messages_pb2, tensor_pb2


class ClassCodes(nn.Module):
    """The label holder's class-code table o (C x d, +/-1), kept with its checkpoint."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("table", torch.from_numpy(table))


class CodeModel(nn.Module):
    """A party's model up to its code, BN kept in inference mode: the own view's ``model`` under
    HashVFL (what an attacker that completes its own model starts from is its code, not the pre-sign
    activation)."""

    def __init__(self, hashed: hashing.HashedBottom, sign: bool = True) -> None:
        super().__init__()
        self.hashed = hashed
        self.sign = sign
        self.hashed.eval()

    def train(self, mode: bool = True) -> CodeModel:
        super().train(mode)
        self.hashed.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hashed.code(x) if self.sign else self.hashed(x)


# ------------------------------------------------------------------------------- compute
class PassiveHash(PassiveSplit):
    def __init__(self, local: LocalModel, variant: str, dp_epsilon: float, seed: int) -> None:
        super().__init__(local)
        self.variant = variant
        self.sign = hashing.USES_SIGN[variant]
        self.dp_epsilon = dp_epsilon
        self.noise = torch.Generator().manual_seed(seed)
        self._pre: torch.Tensor | None = None

    def forward(self, x: np.ndarray, train: bool) -> np.ndarray:
        self.local.train(train)
        with torch.set_grad_enabled(train):
            pre = self.bottom(torch.from_numpy(x))
            code = hashing.sign_ste(pre) if self.sign else pre  # base_bn: the BN output itself
            if self.dp_epsilon > 0:
                code = hashing.laplace_resign(code, self.dp_epsilon, self.noise)
        self._pending, self._pre = (code, pre) if train else (None, None)
        return code.detach().numpy()

    def backward(self, grad: np.ndarray) -> None:
        if self._pending is None or self._pre is None:
            raise RuntimeError("backward without a training forward pass")
        code, pre = self._pending, self._pre
        self._pending = self._pre = None
        if self.variant == "greedy_hash":  # its quantisation penalty needs V, which only this party has
            torch.autograd.backward([code, hashing.greedy_penalty(pre)], [torch.from_numpy(grad), None])
        else:
            code.backward(torch.from_numpy(grad))
        self.local.apply_update()


class ActiveHash(ActiveSplit):
    def __init__(self, local: LocalModel, defense: LabelDefense | None, use_codes: bool) -> None:
        super().__init__(local, "concat", defense)
        codes: ClassCodes = local.modules["codes"]  # type: ignore[assignment]
        self.table: torch.Tensor | None = codes.table if use_codes else None

    def step(
        self, x_own: np.ndarray | None, received: list[np.ndarray], y: np.ndarray | None, train: bool
    ) -> StepResult:
        train = train and y is not None
        self.local.train(train)
        with torch.set_grad_enabled(train):
            inputs = [torch.from_numpy(e).requires_grad_(train) for e in received]
            logits = self.top(torch.cat(inputs, dim=1))
            loss = None
            if y is not None:
                target = torch.from_numpy(y)
                loss = label_loss(logits, target, self.defense)
                if self.table is not None:
                    loss = loss + hashing.consistency_loss(inputs, self.table, target)
            grads = []
            if train:
                assert loss is not None and y is not None
                loss.backward()
                grads = [self._outgoing(t.grad, torch.from_numpy(y)) for t in inputs]
        return outcome(logits, loss, y, self.defense, grads)


# --------------------------------------------------------------------------------- sides
def _params(cfg: Config) -> dict[str, Any]:
    return {k: p.default for k, p in HashVFL.params.items()} | dict(cfg.protocol.params)


class HashPassive(SplitPassive):
    def make_local(self, modules: dict[str, Any]) -> LocalModel:
        p, width = _params(self.cfg), self.host.me.bottom.out
        modules["bottom"] = hashing.HashedBottom(
            modules["bottom"], hashing.HashHead(width, hashing.USES_BN[p["variant"]])
        )
        return super().make_local(modules)

    def make_compute(self) -> Any:
        p = _params(self.cfg)
        return PassiveHash(
            self.host.local, p["variant"], float(p["dp_epsilon"]), party_seed(self.cfg, self.host.me)
        )

    def own_model(self) -> nn.Module:
        return CodeModel(
            copy.deepcopy(self.host.local.modules["bottom"]),  # type: ignore[arg-type]
            hashing.USES_SIGN[_params(self.cfg)["variant"]],
        )

    def encode(self, msg: messages_pb2.Embeddings, emb: Any) -> None:
        signed = hashing.USES_SIGN[_params(self.cfg)["variant"]]
        msg.values.CopyFrom(to_pm1_proto(emb) if signed else to_proto(emb))

    def release(self, modules: list[str]) -> tuple[tensor_pb2.TensorMap, dict[str, Any]]:
        """The bottom goes with its hash head (BN statistics included, BN's step counter left out: it is
        not a float); the spec says how to rebuild it (`rebuild_bottom`)."""
        local = self.host.local
        params = {
            f"{k}.{n}": v.detach().numpy()
            for k in modules
            for n, v in local.modules[k].state_dict().items()
            if not n.endswith("num_batches_tracked")
        }
        spec = {k: self.host.model_spec(k) for k in modules}
        if "bottom" in spec:
            p = _params(self.cfg)
            spec["bottom"]["hash"] = {
                "batch_norm": hashing.USES_BN[p["variant"]],
                "width": self.host.me.bottom.out,
            }
        return to_tensor_map(params), spec


class HashActive(SplitActive):
    def make_local(self, modules: dict[str, Any]) -> LocalModel:
        widths = set(self.embedding_dims.values())
        (width,) = widths
        modules["codes"] = ClassCodes(
            hashing.class_codes(self.host.data.n_classes, width, party_seed(self.cfg, self.host.me))
        )
        return super().make_local(modules)

    def make_compute(self) -> Any:
        variant = _params(self.cfg)["variant"]
        return ActiveHash(self.host.local, self.defense, hashing.USES_CLASS_CODES[variant])

    def decode(self, msg: messages_pb2.Embeddings, expect: tuple[int, int], what: str) -> Any:
        if msg.WhichOneof("payload") != "values":
            raise invalid(f"hashvfl expects bit-packed codes, got {msg.WhichOneof('payload')}")
        if not hashing.USES_SIGN[_params(self.cfg)["variant"]]:  # base_bn: real-valued BN outputs
            return from_proto(msg.values, expect_dtype="float32", expect_shape=expect, what=what)
        return from_pm1_proto(msg.values, expect_shape=expect, what=what)


@PROTOCOLS.register
class HashVFL(Protocol):
    name = "hashvfl"
    settings = frozenset({"aggregation"})
    description = "HashVFL (paper 001): passive parties send bit-packed +/-1 codes Sign(BN(f(x))); class codes + cosine loss"
    params = {
        "variant": Param(
            "hashvfl",
            "hashvfl (BN + Sign + class codes), no_bn, greedy_hash (Sign, no BN, Greedy Hash penalty 0.1 mean|V-Sign(V)|^3), bsl (BN + Sign, no class codes), base_bn (BN, no Sign, CE only: real-valued BN outputs on the wire)",
            lambda v: v in hashing.VARIANTS,
            f"one of {list(hashing.VARIANTS)}",
        ),
        "dp_epsilon": Param(
            0,
            "Laplace noise on the codes, Sign(H + Lap(2/eps)) (Table VII); 0: none",
            lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
            "a number >= 0",
        ),
    }
    coordinator = SplitCoordinator
    active = HashActive
    passive = HashPassive
    defense_hooks = SPLIT_HOOKS

    @classmethod
    def check_config(cls, cfg: Config) -> list[tuple[str, str]]:
        problems = []
        if cfg.protocol.aggregation != "concat":
            problems.append(("protocol.aggregation", "hashvfl concatenates the parties' codes: use concat"))
        if cfg.active.bottom is not None or cfg.active.features is not None:
            problems.append(
                (
                    "parties",
                    "hashvfl: the active party is the label holder and server; give features to passive parties",
                )
            )
        params = _params(cfg)
        if not hashing.USES_SIGN.get(params["variant"], True) and params["dp_epsilon"]:
            problems.append(
                ("protocol.params.dp_epsilon", "hashvfl: base_bn sends no codes to re-sign; use 0")
            )
        outs = {p.bottom.out for p in cfg.passives if p.bottom is not None}
        if len(outs) > 1:
            problems.append(
                (
                    "parties",
                    f"hashvfl: every passive bottom.out (the code length) must be equal, got {sorted(outs)}",
                )
            )
        return problems


def rebuild_bottom(released: dict[str, Any]) -> nn.Module:
    """A released bottom model as its recipient rebuilds it from the release message: the plain bottom,
    or under hashvfl the ``HashedBottom`` up to the pre-sign activation; in inference mode."""
    spec, params = released["spec"]["bottom"], released["parameters"]
    bottom = build_bottom(ModelConfig(**spec["config"]), tuple(spec["input_shape"]))
    model: nn.Module = bottom
    if "hash" in spec:
        model = hashing.HashedBottom(
            bottom, hashing.HashHead(spec["hash"]["width"], spec["hash"]["batch_norm"])
        )
    state = {
        k.removeprefix("bottom."): torch.from_numpy(v) for k, v in params.items() if k.startswith("bottom.")
    }
    model.load_state_dict(state, strict=False)
    missing = (
        set(model.state_dict())
        - set(state)
        - {k for k in model.state_dict() if k.endswith("num_batches_tracked")}
    )
    if missing:
        raise ValueError(f"the release lacks {sorted(missing)}")
    return model.eval()


def rebuild_top(released: dict[str, Any]) -> TopModel:
    """A released top model (an MLP's sizes read from its weights), in inference mode."""
    spec, params = released["spec"]["top"], released["parameters"]

    def layer_order(name: str) -> list[int]:  # a protobuf map keeps no order: top.net.0 before top.net.2
        return [int(t) for t in name.split(".") if t.isdigit()]

    weights = [
        params[k] for k in sorted(params, key=layer_order) if k.startswith("top.") and k.endswith("weight")
    ]
    top = TopModel(ModelConfig(**spec["config"]), int(weights[0].shape[1]), int(weights[-1].shape[0]))
    top.load_state_dict(
        {k.removeprefix("top."): torch.from_numpy(v) for k, v in params.items() if k.startswith("top.")}
    )
    return top.eval()
