"""CAFE attack, fake-gradients and DP defenses, CAFE model and image metrics (CPU, seeded).

The attack runs where it runs in a deployment: as the coordinator's tap (``cafe``) in real
``param-server`` runs (vflnet.protocols.param_server), every role in this process over the loopback
bridge (vflnet.runner.loopback). Its saved output is scored against the ground truth by the runner
(vflnet.attacks.cafe_tap.score_recovery); the training loss comes from the run's metrics.jsonl."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import Tensor
from torch.func import functional_call

from vflnet.attacks.cafe import (
    CafeAttack,
    CafeParams,
    ServerObservation,
    objective_from_params,
    table9_params,
)
from vflnet.attacks.cafe_tap import CafeTap
from vflnet.data.datasets import load_dataset
from vflnet.defenses.dp_gradients import DpGradients
from vflnet.defenses.fake_gradients import FakeGradients
from vflnet.interceptors.trace import read_trace, trace_path
from vflnet.metrics.images import (
    iterations_to_psnr,
    label_accuracy,
    mse,
    psnr,
    psnr_per_image,
    save_image_grid,
)
from vflnet.models.cafe_net import (
    CafeNetConfig,
    CafeVFL,
    flat_name,
    merge_image_grid,
    party_gradients,
    party_parameters,
    soft_cross_entropy,
    split_image_grid,
)
from vflnet.threat.attack import AttackContext
from vflnet.threat.knowledge import deliver_server_knowledge, run_split
from vflnet.tools.reproduce.cafe import RunResult, execute, reproduce, run_config
from vflnet.tools.reproduce.cafe import main as reproduce_main
from vflnet.v1 import messages_pb2
from vflnet.wire.loopback import SCHEME
from vflnet.wire.tensors import from_tensor_map, to_tensor_map

GRID = (2, 2)
WORKERS = [f"worker-{m}" for m in range(4)]


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: on a shared 2-core box this is several times faster than oversubscribing."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(before)


def digits(n: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.images[:n] / 16.0, dtype=torch.float32).unsqueeze(1)
    return split_image_grid(x, GRID), torch.tensor(d.target[:n], dtype=torch.int64)


FC_DIGITS = CafeNetConfig(kind="fc", region_shape=(1, 4, 4), fc1_out=64, fc2_out=32)
# The same worker models as run configs' bottoms (fc2 and the worker output are `hidden[1]` and `out`).
FC_BOTTOM = {"kind": "cafe-fc", "hidden": [64, 32], "out": 10}  # FC_DIGITS on a 4x4 quadrant of digits
CONV_SMALL = {
    "kind": "cafe-conv",
    "channels": [8, 16],
    "hidden": [64, 32],
    "out": 10,
}  # 14x14 MNIST quadrants
CONV_TINY = {"kind": "cafe-conv", "channels": [4, 8], "hidden": [16, 8], "out": 10}  # 4x4 digits quadrants


def cafe_run(root: Path, name: str, **kwargs: Any) -> tuple[RunResult, Path]:
    """A real param-server run of the CAFE setting (vflnet.tools.reproduce.cafe.run_config) and its directory."""
    run_dir = root / name
    return execute(run_config(**kwargs), run_dir), run_dir


def attack_output(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "attacks" / "cafe@coordinator.npz") as f:
        return {k: f[k] for k in f.files}


def server_knowledge(result: RunResult, run_dir: Path) -> dict[str, Any]:
    """What the coordinator delivered to its tap in the run, delivered again the same way (for replays)."""
    cfg = result.cfg
    train, _ = run_split(cfg, load_dataset(cfg.data.dataset, cfg.data.params))
    roster = [
        messages_pb2.PartyInfo(name=p.name, role=p.role, address=f"{SCHEME}{p.name}")
        for p in cfg.parties
        if p.role != "coordinator"
    ]
    top = torch.load(run_dir / "checkpoints" / "param-server.pt")["active"]["top.net.weight"]
    joined = {
        cfg.active.name: messages_pb2.JoinRequest(
            protocol=messages_pb2.ProtocolData(tensors=to_tensor_map({"top.net.weight": top.numpy()}))
        )
    }
    knowledge: dict[str, Any] = {}
    deliver_server_knowledge(cfg, knowledge, messages_pb2.JoinReply(train_ids=train, roster=roster), joined)
    return knowledge


def replay(result: RunResult, run_dir: Path, params: dict[str, Any], steps: int | None = None) -> CafeTap:
    """The coordinator's recorded wire (its trace), first ``steps`` steps, fed to a fresh tap offline."""
    tap = CafeTap(
        AttackContext("coordinator", "coordinator", result.cfg.run.id, server_knowledge(result, run_dir)),
        **params,
    )
    tap.run(
        e for e in read_trace(trace_path(run_dir, "coordinator")) if steps is None or (e.step or 0) <= steps
    )
    return tap


def broadcasts(run_dir: Path) -> list[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
    """(step, batch IDs, worker-0's broadcast parameters) of every training step, from the coordinator's trace."""
    out = []
    for e in read_trace(trace_path(run_dir, "coordinator")):
        if e.short_method == "RunStep" and e.direction == "request" and e.phase == messages_pb2.TRAIN:
            if e.peer == f"{SCHEME}worker-0":
                out.append(
                    (int(e.step), e.sample_ids, from_tensor_map(e.message.protocol.tensors, "broadcast"))
                )
    return out


@pytest.fixture(scope="module")
def static_fc(tmp_path_factory) -> tuple[RunResult, Path]:
    """Steps I-II against static parameters: digits, N = 100, four 4x4 quadrants, FC-only workers, K = 10,
    2,500 steps, a snapshot of the recovery every 500."""
    return cafe_run(
        tmp_path_factory.mktemp("cafe"),
        "static-fc",
        dataset="digits",
        n=100,
        k=10,
        iterations=2500,
        bottom=FC_BOTTOM,
        attack={"run_step3": False, "snapshot_every": 500},
    )


# ---------------------------------------------------------------- parameters and model


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"lr_step1": 0.0}, "lr_step1"),
        ({"lr_step3": float("nan")}, "lr_step3"),
        ({"gamma": -1.0}, "gamma"),
        ({"xi": -0.5}, "xi"),
        ({"loop": "double"}, "loop"),
        ({"nested_iterations": (5, -1)}, "nested_iterations"),
        ({"objective": "gradinversion"}, "objective"),
        ({"n_samples": 1}, "n_samples"),
        ({"adam_betas": (0.9, 1.0)}, "adam_betas"),
    ],
)
def test_cafe_params_validation_names_the_parameter(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        CafeParams(**kwargs)


def test_table9_defaults_and_rows() -> None:
    p = CafeParams()
    assert (p.lr_step1, p.lr_step2, p.lr_step3, p.alpha, p.beta, p.gamma, p.xi) == (
        1e-2,
        1e-2,
        1e-2,
        1e-2,
        1e-4,
        1e-3,
        25.0,
    )
    c = table9_params("cifar10")
    assert (c.lr_step1, c.lr_step2, c.lr_step3, c.xi) == (5e-3, 8e-3, 2e-2, 90.0)
    with pytest.raises(ValueError, match="dataset"):
        table9_params("imagenet")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"nu": 0}, "nu"),
        ({"sigma2": -1.0}, "sigma2"),
        ({"tau": 0.0}, "tau"),
        ({"max_rounds": 0}, "max_rounds"),
    ],
)
def test_fake_gradients_validation(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        FakeGradients(**kwargs)


def test_dp_validation() -> None:
    with pytest.raises(ValueError, match="clip_norm"):
        DpGradients(clip_norm=0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        DpGradients(noise_multiplier=-1.0)
    with pytest.raises(ValueError, match="epsilon"):
        DpGradients.from_epsilon(0.0)


def test_paper_model_shapes_and_grid_roundtrip() -> None:
    model = CafeVFL(CafeNetConfig())  # authors' MNIST model: 14x14 quadrant -> 4*4*128 = 2048 -> 256
    assert model.bottoms[0].fc1.weight.shape == (256, 2048)
    x = torch.rand(3, 1, 28, 28)
    regions = split_image_grid(x, GRID)
    assert [r.shape for r in regions] == [(3, 1, 14, 14)] * 4
    assert torch.equal(merge_image_grid(regions, GRID), x)
    assert model(regions).shape == (3, 10)


def test_party_gradients_are_batch_averages_of_sample_gradients() -> None:
    regions, y = digits(6)
    model = CafeVFL(FC_DIGITS)
    _, batch = party_gradients(model, regions, y)
    singles = [party_gradients(model, [r[i : i + 1] for r in regions], y[i : i + 1])[1] for i in range(6)]
    for party, grads in batch.items():
        for name, g in grads.items():
            mean = torch.stack([s[party][name] for s in singles]).mean(0)
            torch.testing.assert_close(g, mean, rtol=1e-4, atol=1e-7)
    # bias gradient of fc1 = sum over the batch of dL/du_n (eq. 6), each carrying 1/K
    assert set(batch) == {"worker0", "worker1", "worker2", "worker3", "top"}


# ---------------------------------------------------------------- attack


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_steps_one_and_two_recover_fc_inputs(static_fc: tuple[RunResult, Path]) -> None:
    result, run_dir = static_fc
    out = attack_output(run_dir)
    assert out["seen"].all() and result.scores["samples_seen"] == 100
    assert float(out["losses/F1"]) < 1e-6
    assert result.scores["internal_psnr"] >= 30.0, (
        result.scores
    )  # for FC-only workers Step II's H^ is the data


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_cafe_beats_dlg_on_conv_model_same_budget(tmp_path: Path) -> None:
    scores = {}
    for objective in ("cafe", "dlg"):
        result, _ = cafe_run(
            tmp_path,
            objective,
            dataset="mnist",
            n=32,
            k=8,
            iterations=700,
            bottom=CONV_SMALL,
            attack={"objective": objective, "lr_step1": 0.05, "lr_step3": 0.05},
        )
        scores[objective] = result.scores
    print("conv model scores", scores)
    assert scores["cafe"]["psnr"] > scores["dlg"]["psnr"] + 3.0, scores
    assert scores["cafe"]["psnr"] > 14.0, scores
    assert scores["cafe"]["label_accuracy"] == 1.0, scores


@pytest.fixture(scope="module")
def training_runs(tmp_path_factory) -> dict[str, tuple[RunResult, Path, dict[str, Any]]]:
    """CAFE online (single and nested loop) while the coordinator trains (Adam 1e-2): digits, N = 24,
    tiny conv workers, K = 6, 12 steps; the coordinator's wire is traced."""
    root, runs = tmp_path_factory.mktemp("cafe"), {}
    for loop in ("single", "nested"):
        params = {"loop": loop, "nested_iterations": [4, 4], "seed": 7}
        result, run_dir = cafe_run(
            root,
            f"training-{loop}",
            dataset="digits",
            n=24,
            k=6,
            iterations=12,
            bottom=CONV_TINY,
            attack=params,
            train_lr=1e-2,
            trace=["coordinator"],
        )
        runs[loop] = (result, run_dir, params)
    return runs


def test_only_the_server_view_is_used_and_rows_update_lazily(training_runs) -> None:
    result, run_dir, params = training_runs["single"]
    # the first 3 steps of the recorded wire, to two taps whose architecture templates have other weights
    taps = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        taps.append(replay(result, run_dir, params, steps=3))
    a, b = (t.attack for t in taps)
    assert a is not None and b is not None and a.iterations == b.iterations == 3
    assert not torch.equal(a.template.bottoms[0].fc1.weight, b.template.bottoms[0].fc1.weight)
    for xa, xb in zip(a.X, b.X, strict=True):
        assert torch.equal(xa, xb)  # the template only gives the architecture
    fresh = CafeAttack(CafeParams(n_samples=24, seed=7), CafeVFL(a.template.config))  # the dummy data's start
    touched = np.zeros(24, dtype=bool)
    for _, ids, _ in broadcasts(run_dir)[:3]:
        touched[np.searchsorted(a_train_ids(taps[0]), ids)] = True
    untouched = torch.as_tensor(~touched)
    assert untouched.any()
    for before, after in zip(fresh.X, a.X, strict=True):
        assert torch.equal(before[untouched], after[untouched])
        assert not torch.equal(before[~untouched], after[~untouched])


def a_train_ids(tap: CafeTap) -> np.ndarray:
    return np.asarray(tap.context.knowledge["train_ids"])


@pytest.mark.parametrize("loop", ["single", "nested"])
def test_online_equals_offline_in_training_mode(training_runs, loop: str) -> None:
    result, run_dir, params = training_runs[loop]
    sent = broadcasts(run_dir)
    assert [s for s, _, _ in sent] == list(range(1, 13))
    assert not np.array_equal(sent[0][2]["bottom.fc1.weight"], sent[-1][2]["bottom.fc1.weight"])  # it trains
    online = attack_output(run_dir)
    offline = replay(result, run_dir, params).output()
    assert int(online["iterations"]) == int(offline["iterations"]) == 12
    assert online.keys() == offline.keys()
    for key, value in online.items():
        np.testing.assert_array_equal(value, offline[key], err_msg=key)
    # the run's own record of training: one finite loss per step
    losses = [s["loss"] for s in result.steps]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)


def test_observe_rejects_bad_batch_ids() -> None:
    regions, y = digits(10)
    model = CafeVFL(FC_DIGITS)
    _, grads = party_gradients(model, [r[:4] for r in regions], y[:4])
    attack = CafeAttack(CafeParams(n_samples=10), model)
    bad = ServerObservation(0, np.array([0, 0, 1, 2]), party_parameters(model), grads)
    with pytest.raises(ValueError, match="batch_ids"):
        attack.observe(bad)


# ---------------------------------------------------------------- defenses


def _first_last(losses: list[float], window: int) -> tuple[float, float]:
    return float(np.mean(losses[:window])), float(np.mean(losses[-window:]))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_fake_gradients_stop_cafe_while_training_loss_falls(tmp_path: Path, static_fc) -> None:
    sigma2 = 1e-4  # commensurate with this model's gradient entries (the paper's 1.1 suits its own scale)
    fake = [{"name": "fake-gradients", "party": w, "params": {"nu": 50, "sigma2": sigma2}} for w in WORKERS]
    # static attack (unchanged Theta, the strongest setting), same budget with and without the defense
    setting = dict(dataset="digits", n=100, k=10, bottom=FC_BOTTOM)
    defended, _ = cafe_run(
        tmp_path, "static-fake", iterations=1000, attack={"run_step3": False}, defenses=fake, **setting
    )
    scores = {"true": static_fc[0].scores["internal_psnr@1000"], "fake": defended.scores["internal_psnr"]}
    print("fake-gradients PSNR", scores)
    assert scores["fake"] < 12.0, scores
    assert scores["true"] > scores["fake"] + 5.0, scores

    # training with fake uploads (SGD, lr 0.1 as in Sec. 4.4) still reduces the loss: the mean batch loss of
    # the first and of the last epoch (10 steps each). This model sits on a plateau near 2.30 for ~150
    # steps before its loss falls (metrics.jsonl), hence 250 steps.
    losses = {}
    for name, d in (("true", []), ("fake", fake)):
        run, _ = cafe_run(
            tmp_path, f"training-{name}", iterations=250, train_lr=0.1, optimizer="sgd", defenses=d, **setting
        )
        losses[name] = _first_last([s["loss"] for s in run.steps], 10)
    print("training loss (first, last epoch)", losses)
    assert losses["fake"][1] < 0.8 * losses["fake"][0], losses
    assert losses["true"][1] < losses["true"][0], losses


def test_fake_gradients_shape_and_clipping_semantics() -> None:
    g = {"w": torch.randn(8, 5) * 1e-2, "b": torch.randn(5) * 1e-2}
    fake = FakeGradients(nu=50, sigma2=1e-4, seed=0)(g)
    assert fake.keys() == g.keys()
    for k in g:
        assert fake[k].shape == g[k].shape
        assert not torch.equal(fake[k], g[k])
        # each entry is either the true value clipped into a band, or a (negative) candidate value
        assert torch.all((fake[k].abs() <= g[k].abs() + 1e-12) | (fake[k] < 0))
    with pytest.raises(RuntimeError, match="tau"):
        FakeGradients(nu=5, sigma2=1.0, tau=1e-6, max_rounds=2)(g)


def test_dp_gradients_clip_and_noise() -> None:
    g = {"w": torch.full((10, 10), 1.0), "b": torch.zeros(10)}  # norm 10
    clipped = DpGradients(clip_norm=3.0, noise_multiplier=0.0)(g)
    norm = torch.sqrt(sum((t**2).sum() for t in clipped.values()))
    assert float(norm) == pytest.approx(3.0, rel=1e-6)
    noisy = DpGradients(clip_norm=1.0, noise_multiplier=2.0, seed=1)({"w": torch.zeros(100, 100)})
    assert float(noisy["w"].std()) == pytest.approx(2.0, rel=0.05)
    assert DpGradients.from_epsilon(1.0).noise_multiplier > DpGradients.from_epsilon(10.0).noise_multiplier


# ---------------------------------------------------------------- metrics


def test_image_metrics(tmp_path: Path) -> None:
    real = torch.rand(4, 1, 8, 8)
    assert psnr_per_image(real, real).min() > 100
    fake = real + 0.1
    assert mse(real.clamp(0, 0.9), (real.clamp(0, 0.9) + 0.1)) == pytest.approx(0.01, rel=1e-5)
    assert psnr(real.clamp(0, 0.9), real.clamp(0, 0.9) + 0.1) == pytest.approx(20.0, rel=1e-4)
    assert psnr(real, fake) > psnr(real, real + 0.3)
    assert label_accuracy(torch.tensor([1, 2, 3]), torch.tensor([1, 0, 3])) == pytest.approx(2 / 3)
    assert label_accuracy(torch.eye(3), torch.tensor([0, 1, 2])) == 1.0
    assert iterations_to_psnr([(0, 5.0), (100, 29.0), (200, 31.0)], 30.0) == 200
    assert iterations_to_psnr([(0, 5.0)], 30.0) is None
    path = save_image_grid(real, fake, tmp_path / "grid.png", n=3)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reproduce_writes_report_next_to_paper_numbers(tmp_path: Path) -> None:
    record = reproduce(
        n=16,
        k=4,
        iterations=4,
        sweep_k=(4, 8),
        baselines=("dlg",),
        conv_channels=(2, 4),
        fc1_out=8,
        eval_every=2,
        time_paper=False,
        out_dir=tmp_path,
        log=lambda _: None,
    )
    text = (tmp_path / "cafe_report.md").read_text()
    assert "43.15" in text and "7.96" in text and "| 8 |" in text
    assert [r["objective"] for r in record["main"]] == ["cafe", "dlg"]
    assert [r["k"] for r in record["sweep"]] == [4, 8]
    assert [r["iterations"] for r in record["main"]] == [4, 4]
    assert [t for t, _ in record["main"][0]["history"]] == [2, 4]  # scored snapshots of the real run's attack
    assert (tmp_path / "cafe_cafe_k4.png").exists() and (tmp_path / "cafe_report.json").exists()
    assert (tmp_path / "runs" / "cafe-k4" / "attacks" / "cafe@coordinator.npz").exists()


# ---------------------------------------------------------------- batched workers, devices


def _reference_per_worker(params: CafeParams, template: CafeVFL, observations: list[ServerObservation]):
    """The attack as it was written before its workers were stacked: one Python loop over the workers
    in Steps I-II and the Adam updates, one state tensor per worker (single loop, CAFE objective)."""
    cfg, workers = template.config, template.worker_names
    gen = torch.Generator().manual_seed(params.seed)
    n, d1, d2 = params.n_samples, cfg.feature_dim(), cfg.fc1_out
    V = [(torch.rand(n, d2, generator=gen) * 2 - 1) * params.v_init for _ in workers]
    H = [torch.rand(n, d1, generator=gen) * params.h_init for _ in workers]
    X = [torch.rand(n, *cfg.region_shape, generator=gen) for _ in workers]
    Y = torch.rand(n, cfg.n_classes, generator=gen)
    moments: dict[int, list[Tensor]] = {}
    (b1, b2), eps = params.adam_betas, params.adam_eps

    def adam(param: Tensor, rows: Tensor, grad: Tensor, lr: float) -> None:
        m, v, t = moments.setdefault(
            id(param), [torch.zeros_like(param), torch.zeros_like(param), torch.zeros(n)]
        )
        t[rows] += 1
        tt = t[rows].view(-1, *([1] * (param.dim() - 1)))
        m[rows] = m[rows] * b1 + (1 - b1) * grad
        v[rows] = v[rows] * b2 + (1 - b2) * grad * grad
        param[rows] -= lr * (m[rows] / (1 - b1**tt)) / ((v[rows] / (1 - b2**tt)).sqrt() + eps)

    objective = objective_from_params(params)
    names = [(p, n_) for p, mod in template.party_modules().items() for n_, _ in mod.named_parameters()]
    for obs in observations:
        rows = torch.as_tensor(obs.batch_ids)
        for m, w in enumerate(workers):
            V[m][rows] -= params.lr_step1 * 2 * (V[m][rows].sum(0) - obs.grads[w]["fc1.bias"])
        for m, w in enumerate(workers):
            v = V[m][rows]
            adam(H[m], rows, 2 * v @ (v.T @ H[m][rows] - obs.grads[w]["fc1.weight"]), params.lr_step2)
        theta = {flat_name(p, n_): obs.params[p][n_].clone().requires_grad_(True) for p, n_ in names}
        xs = [x[rows].clone().requires_grad_(True) for x in X]
        ys = Y[rows].clone().requires_grad_(True)
        logits, internal = functional_call(template, theta, (xs,), {"return_internal": True})
        fake = torch.autograd.grad(
            soft_cross_entropy(logits, torch.softmax(ys, 1)), list(theta.values()), create_graph=True
        )
        true = [obs.grads[p][n_] for p, n_ in names]
        loss = objective(true, fake, xs, internal, [h[rows] for h in H])
        *gx, gy = torch.autograd.grad(loss, [*xs, ys])
        with torch.no_grad():
            for m, g in enumerate(gx):
                adam(X[m], rows, g, params.lr_step3)
            adam(Y, rows, gy, params.lr_step3)
    return V, H, X, Y


@pytest.mark.parametrize("xi", [0.0, 1e9])  # the TV term on, and truncated away
def test_stacked_workers_equal_the_per_worker_computation(xi: float) -> None:
    cfg = CafeNetConfig(
        n_workers=3,
        region_shape=(1, 6, 6),
        n_classes=3,
        conv_channels=(2, 3),
        fc1_out=8,
        fc2_out=6,
        worker_out=4,
    )
    model = CafeVFL(cfg)
    n, rng = 12, np.random.default_rng(0)
    images, labels = torch.rand(n, 3, 1, 6, 6), torch.randint(0, 3, (n,))
    observations = []
    for t in range(6):
        ids = np.sort(rng.choice(n, 5, replace=False))
        _, grads = party_gradients(model, list(images[ids].unbind(1)), labels[ids])
        observations.append(ServerObservation(t, ids, party_parameters(model), grads))
    params = CafeParams(n_samples=n, xi=xi, beta=1e-2, lr_step3=0.05, seed=3)
    attack = CafeAttack(params, CafeVFL(cfg))
    start = [t.clone() for t in (attack.V, attack.H, attack.X, attack.Y)]
    attack.run(observations)
    V, H, X, Y = _reference_per_worker(params, CafeVFL(cfg), observations)
    for name, stacked, reference, before in zip(
        "VHXY",
        (attack.V, attack.H, attack.X, attack.Y),
        (torch.stack(V), torch.stack(H), torch.stack(X), Y),
        start,
        strict=True,
    ):
        assert not torch.equal(stacked, before), name  # the attack moved it
        torch.testing.assert_close(
            stacked, reference, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_fails_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError, match="cannot use CUDA"):
        CafeAttack(CafeParams(n_samples=10), CafeVFL(FC_DIGITS), device="cuda")
    with pytest.raises(SystemExit) as exit_info:
        reproduce_main(["--quick", "--device", "cuda", "--out-dir", "/nonexistent/never-written"])
    assert exit_info.value.code == 2  # argparse's usage error, before any run starts
    assert "--device cuda" in capsys.readouterr().err


def test_an_attack_failing_on_its_thread_fails_the_run() -> None:
    knowledge = {"architecture": FC_DIGITS, "train_ids": np.arange(10)}
    tap = CafeTap(AttackContext("coordinator", "coordinator", "run", knowledge))
    regions, y = digits(10)
    model = CafeVFL(FC_DIGITS)
    _, grads = party_gradients(model, [r[:4] for r in regions], y[:4])
    tap._submit(ServerObservation(0, np.array([0, 0, 1, 2]), party_parameters(model), grads))  # bad IDs
    with pytest.raises(RuntimeError, match="CAFE attack failed") as failure:
        tap.output()  # waits for the attack thread, then re-raises what it hit
    assert isinstance(failure.value.__cause__, ValueError)


# ---------------------------------------------------------------- the authors' code, progress, resuming


def test_global_bias_correction_is_the_authors_formula() -> None:
    """``t=T``: lr * sqrt(1 - b2^T) / (1 - b1^T) * m^ / (sqrt(v^) + eps), m^ and v^ corrected by T too;
    without it each row is corrected by its own step count."""
    from vflnet.attacks.cafe import RowAdam

    b1, b2, eps, lr = 0.9, 0.999, 1e-7, 0.01
    grad = torch.tensor([[[0.5], [-2.0]]])
    rows = torch.tensor([0, 1])
    for t in (None, 7):
        param = torch.zeros(1, 3, 1)
        RowAdam(param.shape, lr, (b1, b2), eps).step(param, rows, grad, t)
        m, v = (1 - b1) * grad, (1 - b2) * grad**2
        count = 1 if t is None else t
        step_lr = lr if t is None else lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        expected = -step_lr * (m / (1 - b1**count)) / ((v / (1 - b2**count)).sqrt() + eps)
        torch.testing.assert_close(param[:, :2], expected)
        assert param[0, 2, 0] == 0  # a row outside the batch does not move
    # the same rows seen once: global correction at T = 7 takes a different step than the row's own
    a, b = torch.zeros(1, 3, 1), torch.zeros(1, 3, 1)
    RowAdam(a.shape, lr, (b1, b2), eps).step(a, rows, grad)
    RowAdam(b.shape, lr, (b1, b2), eps).step(b, rows, grad, 7)
    assert not torch.equal(a, b)


def test_tv_per_worker_weights_every_worker_by_beta() -> None:
    """With the TV term on (its mean over workers above xi) and nothing else, each worker's images get
    beta * dTV_m (the authors' code), not beta / M * dTV_m."""
    from vflnet.attacks.cafe import CafeObjective

    images = [torch.rand(5, 1, 6, 6, requires_grad=True) for _ in range(3)]
    grads = {}
    for per_worker in (False, True):
        none = [torch.zeros(1)]  # alpha = gamma = 0: the gradient and internal terms weigh nothing
        loss = CafeObjective(0.0, 1e-2, 0.0, 0.0, per_worker)(none, none, images, none, none)
        grads[per_worker] = torch.autograd.grad(loss, images)
    for mean, each in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(each, 3 * mean)


def _one_observation(params: CafeParams) -> tuple[CafeAttack, dict[str, Tensor]]:
    torch.manual_seed(0)  # the same victim and images on every call
    cfg = CafeNetConfig(n_workers=2, region_shape=(1, 4, 4), n_classes=3, conv_channels=(2, 2), fc1_out=4)
    model = CafeVFL(cfg)
    images, labels = torch.rand(6, 2, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    ids = np.array([1, 3, 4])
    _, grads = party_gradients(model, list(images[ids].unbind(1)), labels[ids])
    attack = CafeAttack(params, CafeVFL(cfg))
    before = {"V": attack.V.clone(), "X": attack.X.clone(), "Y": attack.Y.clone()}
    attack.observe(ServerObservation(1, ids, party_parameters(model), grads))
    v_sums = before["V"][:, torch.as_tensor(ids)].sum(1)
    bias = torch.stack([grads[w]["fc1.bias"] for w in attack.workers])
    before["residual"] = (v_sums - bias).norm() / bias.norm()
    return attack, before


def test_step1_residual_is_the_batch_residual_and_label_scale_moves_only_the_labels() -> None:
    attack, before = _one_observation(CafeParams(n_samples=6, seed=1))
    result = attack.result()
    # the attacker's own progress signal: ||sum over the batch of V - uploaded fc1 bias grad|| / ||grad||
    assert result.last_losses["step1_residual"] == pytest.approx(float(before["residual"]), rel=1e-6)
    scaled, _ = _one_observation(CafeParams(n_samples=6, seed=1, label_grad_scale=1e4))
    assert torch.equal(scaled.X, attack.X)  # the images' update does not depend on the labels' scale
    assert not torch.equal(scaled.Y, attack.Y)  # Adam's eps makes a x1e4 gradient a different step


def test_attack_state_round_trips_and_continues_identically() -> None:
    """``state_dict`` / ``load_state_dict``: a second attack loaded with the first's state, fed the
    same next observation, ends where the first does."""
    cfg = CafeNetConfig(n_workers=2, region_shape=(1, 4, 4), n_classes=3, conv_channels=(2, 2), fc1_out=4)
    model = CafeVFL(cfg)
    images, labels = torch.rand(6, 2, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    params = CafeParams(n_samples=6, adam_bias_correction="global", tv_per_worker=True, xi=0.0)
    observations = []
    for t, ids in enumerate((np.array([0, 2, 5]), np.array([1, 2, 3]))):
        _, grads = party_gradients(model, list(images[ids].unbind(1)), labels[ids])
        observations.append(ServerObservation(t, ids, party_parameters(model), grads))
    first = CafeAttack(params, CafeVFL(cfg))
    first.observe(observations[0])
    second = CafeAttack(replace_seed(params), CafeVFL(cfg))
    second.load_state_dict(first.state_dict())
    for attack in (first, second):
        attack.observe(observations[1])
    for name in ("V", "H", "X", "Y"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    assert np.array_equal(first.result().seen, second.result().seen) and second.iterations == 2


def replace_seed(params: CafeParams) -> CafeParams:
    """Other starting values: only the loaded state can make the two attacks agree."""
    from dataclasses import replace

    return replace(params, seed=params.seed + 1)


def test_reproduce_stopped_and_resumed_ends_bit_identical(tmp_path: Path) -> None:
    """A report stopped by --max-seconds after its first piece, then continued with `--resume DIR`
    (its own settings), ends with the attack output of the uninterrupted report, bit for bit."""
    sizes: dict[str, Any] = dict(
        n=16, k=4, iterations=12, sweep_k=(), baselines=(), conv_channels=(2, 4), fc1_out=8, eval_every=4
    )
    options = {"adam_bias_correction": "global", "tv_per_worker": True, "label_grad_scale": 1e4}
    quiet = dict(time_paper=False, attack_options=options, checkpoint_every=4, log=lambda _: None)
    whole = reproduce(**sizes, **quiet, out_dir=tmp_path / "whole")
    stopped = reproduce(**sizes, **quiet, out_dir=tmp_path / "pieces", max_seconds=0)
    assert (stopped["main"][0]["iterations"], stopped["main"][0]["stopped"]) == (4, "max-seconds")
    assert reproduce_main(["--resume", str(tmp_path / "pieces")]) == 0
    resumed = __import__("json").loads((tmp_path / "pieces" / "cafe_report.json").read_text())
    assert (resumed["main"][0]["iterations"], resumed["main"][0]["stopped"]) == (12, "budget")
    a = attack_output(tmp_path / "whole" / "runs" / "cafe-k4")
    b = attack_output(tmp_path / "pieces" / "runs" / "cafe-k4")
    assert sorted(a) == sorted(b) and int(a["iterations"]) == 12
    assert all(np.array_equal(a[key], b[key]) for key in a), [k for k in a if not np.array_equal(a[k], b[k])]
    # both PSNR forms and Step I's residual curve are in the record
    record = whole["main"][0]
    assert [t for t, _ in record["residuals"]] == [4, 8, 12] and math.isfinite(record["psnr_region"])
    assert "PSNR per region" in (tmp_path / "whole" / "cafe_report.md").read_text()


def test_resume_of_a_directory_without_settings_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        reproduce_main(["--resume", str(tmp_path)])
    assert exit_info.value.code == 2 and "cafe_settings.json" in capsys.readouterr().err


def test_the_authors_victim_keras_init_and_double_softmax_and_the_attackers_template_mirrors_it() -> None:
    """`init: keras` gives Glorot-uniform weights and zero biases; `output_activation: softmax` makes the
    top end in probabilities that the loss softmaxes again; the coordinator's architecture knowledge
    carries it, so the attacker's template computes the victim's outputs."""
    from vflnet.models.zoo import build_party_modules
    from vflnet.threat.knowledge import deliver_server_knowledge
    from vflnet.tools.reproduce.cafe import config_in, top_model, worker_model

    data = run_config(
        n=16, k=4, iterations=2, bottom=worker_model((2, 4), 8, "keras"), top=top_model("keras", True)
    )
    cfg = config_in(data, Path("/nonexistent/run"))
    modules = {p.name: build_party_modules(cfg, p, (1, 14, 14), 10) for p in cfg.parties[1:]}
    bottom, top = modules["worker-0"][0], modules["active"][1]
    assert bottom is not None and top is not None
    for layer in [*bottom.modules(), *top.modules()]:
        if isinstance(layer, torch.nn.Linear | torch.nn.Conv2d):
            fan_out, fan_in = layer.weight.shape[0], layer.weight[0].numel()
            receptive = layer.weight[0, 0].numel()
            bound = math.sqrt(6 / (fan_in + fan_out * receptive))
            assert layer.weight.abs().max() <= bound and torch.equal(layer.bias, torch.zeros_like(layer.bias))
    x = [torch.rand(3, 1, 14, 14) for _ in range(4)]
    embeddings = torch.cat([modules[f"worker-{m}"][0](x[m]) for m in range(4)], dim=1)
    victim = top(embeddings)
    torch.testing.assert_close(victim.sum(1), torch.ones(3))  # probabilities, then the loss's softmax
    knowledge: dict[str, Any] = {}
    joined = {
        "active": messages_pb2.JoinRequest(
            protocol=messages_pb2.ProtocolData(tensors=to_tensor_map({"top.net.weight": np.zeros((10, 40))}))
        )
    }
    roster = [messages_pb2.PartyInfo(name=p.name, role=p.role, address=p.name) for p in cfg.parties[1:]]
    deliver_server_knowledge(
        cfg, knowledge, messages_pb2.JoinReply(train_ids=range(16), roster=roster), joined
    )
    template = CafeVFL(knowledge["architecture"])
    with torch.no_grad():
        for m in range(4):
            template.bottoms[m].load_state_dict(modules[f"worker-{m}"][0].state_dict())
        template.top.out.load_state_dict(top.net.state_dict())
    torch.testing.assert_close(template(x), victim)
