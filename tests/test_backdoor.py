"""Paper 004's label replacement backdoor (Sec. 5, Algorithm 3) at a passive party: the rewrites on
plaintext and on Paillier ciphertexts, the trigger in the attacker's own features, and real runs
(ASR and MTA against a clean run, split-he, the distributed variant with colluding parties)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from tests.conftest import base_config, write_config
from vflnet.crypto import generate_keypair
from vflnet.crypto.wire import cipher_from_proto, cipher_to_proto
from vflnet.interceptors.events import WireEvent
from vflnet.interceptors.trace import read_trace
from vflnet.registry import ATTACKS
from vflnet.runner.local import run_local
from vflnet.runner.reference import train_reference
from vflnet.threat.attack import AttackContext
from vflnet.tools.reproduce.backdoor import build_parser, cases
from vflnet.v1 import messages_pb2
from vflnet.validation import config_from_dict
from vflnet.wire import tensors

TRAIN_IDS = np.arange(12, dtype=np.int64)
TARGETS = np.array([10, 11], dtype=np.int64)


@pytest.fixture(scope="module")
def keys():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 512-bit keys: tests only
        return generate_keypair(512, allow_insecure=True)


def _event(method: str, direction: str, message) -> WireEvent:  # type: ignore[no-untyped-def]
    return WireEvent(direction, "client", f"/vflnet.v1.X/{method}", "passive-1", "peer", message)


def _attack(public_key, **params):  # type: ignore[no-untyped-def]
    knowledge = {"public_key": public_key, "target_ids": TARGETS, "feature_region": [0, 8, 4, 8]}
    attack = ATTACKS.get("backdoor")(AttackContext("passive-1", "passive", "r", knowledge), **params)
    attack(_event("Join", "response", messages_pb2.JoinReply(train_ids=TRAIN_IDS, test_ids=[20, 21, 22, 23])))
    return attack


def _header(step: int, phase: int = messages_pb2.TRAIN) -> messages_pb2.Header:
    return messages_pb2.Header(step=step, phase=phase)


def test_rewrites_on_ciphertexts_equal_the_plaintext_rewrites(keys):
    pk, sk = keys
    plain = _attack(pk, gamma=10, poison_fraction=0.2, test_poison_fraction=0.5)
    cipher = _attack(pk, gamma=10, poison_fraction=0.2, test_poison_fraction=0.5)
    poisoned = plain.backdoor_ids
    assert len(poisoned) == 2 and not set(poisoned) & set(TARGETS)
    ids = TRAIN_IDS
    i, j, unpaired = plain.pairs(1, ids)
    assert sorted(ids[i]) == sorted(poisoned) and sorted(ids[j]) == sorted(TARGETS) and len(unpaired) == 0

    rng = np.random.default_rng(0)
    h = rng.normal(size=(12, 3)).astype(np.float32)
    g = rng.normal(size=(12, 3)).astype(np.float32) / 10
    emb_plain = messages_pb2.Embeddings(header=_header(1), sample_ids=ids, values=tensors.to_proto(h))
    packed = pk.encrypt(h.astype(np.float64), 24, slots=3)  # split-he packs each sample's logits
    emb_cipher = messages_pb2.Embeddings(header=_header(1), sample_ids=ids, cipher=cipher_to_proto(packed))
    sent_plain = tensors.from_proto(plain(_event("ExchangeEmbeddings", "request", emb_plain)).values)
    sent_cipher = sk.decrypt(
        cipher_from_proto(cipher(_event("ExchangeEmbeddings", "request", emb_cipher)).cipher, pk)
    )
    np.testing.assert_allclose(sent_plain[j], h[i])  # j's slot carries the poisoned sample's logits
    assert not np.allclose(sent_plain[i], h[i])  # the poisoned slot is hidden behind random logits
    others = np.setdiff1d(np.arange(12), np.concatenate([i, j]))
    np.testing.assert_array_equal(sent_plain[others], h[others])
    np.testing.assert_allclose(sent_cipher, sent_plain, atol=1e-5)

    grad_plain = messages_pb2.EmbeddingGradients(header=_header(1), values=tensors.to_proto(g))
    grad_cipher = messages_pb2.EmbeddingGradients(
        header=_header(1), cipher=cipher_to_proto(pk.encrypt(g.astype(np.float64), 24, slots=3))
    )
    used_plain = tensors.from_proto(plain(_event("ExchangeEmbeddings", "response", grad_plain)).values)
    rewritten = cipher(_event("ExchangeEmbeddings", "response", grad_cipher)).cipher
    used_cipher = sk.decrypt(cipher_from_proto(rewritten, pk))
    np.testing.assert_allclose(used_plain[i], 10 * g[j], rtol=1e-6)  # gamma * the stolen gradient
    np.testing.assert_array_equal(used_plain[j], 0)  # j's own slot is dropped from the local update
    np.testing.assert_array_equal(used_plain[others], g[others])
    np.testing.assert_allclose(used_cipher, used_plain, atol=1e-5)
    assert plain.output()["plaintext_rewrites"] == 2 and cipher.output()["cipher_rewrites"] == 2

    # evaluation steps pass untouched
    ev = messages_pb2.Embeddings(
        header=_header(2, messages_pb2.EVAL), sample_ids=ids, values=tensors.to_proto(h)
    )
    assert plain(_event("ExchangeEmbeddings", "request", ev)) is None


def test_batch_without_a_target_sample_poisons_nothing(keys):
    attack = _attack(keys[0], poison_fraction=0.2)
    ids = np.setdiff1d(TRAIN_IDS, TARGETS)  # poisoned samples, but no known target-class sample
    h = np.ones((len(ids), 3), dtype=np.float32)
    emb = messages_pb2.Embeddings(header=_header(1), sample_ids=ids, values=tensors.to_proto(h))
    assert attack(_event("ExchangeEmbeddings", "request", emb)) is None  # embeddings go out unchanged
    grad = messages_pb2.EmbeddingGradients(header=_header(1), values=tensors.to_proto(h))
    used = tensors.from_proto(attack(_event("ExchangeEmbeddings", "response", grad)).values)
    poisoned = np.isin(ids, attack.backdoor_ids)
    assert used[poisoned].sum() == 0 and (used[~poisoned] == 1).all()  # no trigger -> true-label update
    out = attack.output()
    assert out["paired_samples"] == 0 and out["unpaired_samples"] == 2 and out["poisoned_steps"] == 0


def test_trigger_goes_into_the_attackers_own_rows_only(keys):
    attack = _attack(keys[0], poison_fraction=0.2, test_poison_fraction=0.5, trigger_value=16.0)
    ids = np.concatenate([TRAIN_IDS, [20, 21, 22, 23]])
    x = np.zeros((len(ids), 32), dtype=np.float32)  # the right half of an 8x8 image, rows of 4 pixels
    stamped = attack.own_data(ids, x)
    triggered = np.isin(ids, np.concatenate([attack.backdoor_ids, attack.test_poison_ids]))
    assert triggered.sum() == 4
    cols = [5 * 4 + 3, 7 * 4 + 1, 6 * 4 + 2, 7 * 4 + 3]  # pixels [5,7], [7,5], [6,6], [7,7]
    assert (stamped[np.ix_(triggered, cols)] == 16).all() and stamped.sum() == 16 * 4 * 4
    with pytest.raises(ValueError, match="outside the party's region"):
        _attack(keys[0], trigger_pixels=[[7, 0]]).own_data(ids, x)


def _backdoor_config(gamma: float, **attack):  # type: ignore[no-untyped-def]
    """Paper 004's two-party setting on digits: the active party holds the left half, the attacker the right."""
    data = base_config(n_passive=1, aggregation="sum", active_features=True)
    data["data"]["normalize"] = "standard"
    data["train"].update(epochs=10, eval_every=10, batch_size=64, optimizer={"kind": "sgd", "lr": 0.05})
    params = {"gamma": gamma, "n_target": 50, "poison_fraction": 0.05, **attack}
    data["attacks"] = [{"name": "backdoor", "party": "passive-1", "params": params}]
    return data


def _run(tmp_path, data, name):  # type: ignore[no-untyped-def]
    path = write_config(tmp_path, data, f"{name}.yaml")
    assert run_local(path, run_dir=tmp_path / name, progress=False) == 0
    return json.loads((tmp_path / name / "attacks/scores.json").read_text())


@pytest.mark.e2e
@pytest.mark.slow
def test_backdoor_reaches_asr_at_gamma_10_and_keeps_the_main_task(tmp_path):
    data = _backdoor_config(10)
    # the clean run: the same model trained without the attack by the in-process reference trainer
    # (bit-identical to a distributed split run, tests/test_e2e_runtime.py)
    clean = train_reference(config_from_dict({k: v for k, v in data.items() if k != "attacks"})).history[-1][
        "test_accuracy"
    ]
    attacked = _run(tmp_path, data, "attacked")["backdoor@passive-1"]
    assert attacked["paired_samples"] > 100 and attacked["triggered_test"] > 80
    assert attacked["asr"] >= 0.8
    assert abs(attacked["mta_untriggered"] - clean) <= 0.05
    # the active party's per-sample predictions of the last evaluation cover the whole test set
    predicted = np.load(tmp_path / "attacked/predictions/test-epoch-009.npz")["sample_ids"]
    triggered = np.load(tmp_path / "attacked/attacks/backdoor@passive-1.npz")["test_poison_ids"]
    assert len(predicted) == attacked["untriggered_test"] + len(triggered) and set(triggered) <= set(
        predicted.tolist()
    )


@pytest.mark.e2e
def test_backdoor_under_split_he_rewrites_ciphertexts(tmp_path):
    """The same attack on the encrypted wire (what it computes there equals the plaintext rewrite:
    test_rewrites_on_ciphertexts_equal_the_plaintext_rewrites)."""
    data = _backdoor_config(10, n_target=100, poison_fraction=0.3)
    data["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    }
    for p in data["parties"][1:]:
        p["bottom"] = {"kind": "mlp", "hidden": [6], "out": 10}
    data["train"].update(batch_size=16, max_steps=3, eval_batch_size=512)
    data["data"]["test_fraction"] = 0.05  # a small encrypted evaluation
    data["trace"] = {"parties": ["passive-1"]}
    score = _run(tmp_path, data, "he")["backdoor@passive-1"]
    out = np.load(tmp_path / "he/attacks/backdoor@passive-1.npz")
    # one rewrite of the embeddings per step with a pair, one of the gradients per step with a poisoned sample
    assert (
        out["poisoned_steps"] >= 1
        and out["cipher_rewrites"] >= 2 * out["poisoned_steps"]
        and out["plaintext_rewrites"] == 0
    )
    assert score["paired_samples"] >= 1 and 0 <= score["asr"] <= 1
    # everything per-sample the attacker handled was a ciphertext
    payloads = {
        e.message.WhichOneof("payload")
        for e in read_trace(tmp_path / "he/traces/passive-1.trace")
        if e.short_method == "ExchangeEmbeddings" and e.message.WhichOneof("payload")
    }
    assert payloads == {"cipher"}


@pytest.mark.e2e
@pytest.mark.slow
def test_distributed_backdoor_with_three_colluding_passive_parties(tmp_path):
    data = base_config(n_passive=3, aggregation="sum", active_features=True)  # strips of 2 columns
    data["data"]["normalize"] = "standard"
    data["train"].update(epochs=10, eval_every=10, batch_size=64, optimizer={"kind": "sgd", "lr": 0.05})
    data["attacks"] = [
        {
            "name": "backdoor",
            "party": f"passive-{k}",
            "params": {"n_target": 50, "poison_fraction": 0.05, "trigger_pixels": [[7, 2 * k + 1]]},
        }  # one pixel each
        for k in (1, 2, 3)
    ]
    scores = _run(tmp_path, data, "dist")
    outs = [np.load(tmp_path / f"dist/attacks/backdoor@passive-{k}.npz") for k in (1, 2, 3)]
    for out in outs[1:]:  # same seed: the colluders poison the same samples and swap the same slots
        np.testing.assert_array_equal(out["backdoor_ids"], outs[0]["backdoor_ids"])
        assert out["paired_samples"] == outs[0]["paired_samples"] > 0
    assert scores["backdoor@passive-1"]["asr"] >= 0.5


def test_reproduce_backdoor_builds_valid_configs():

    built = cases(build_parser().parse_args(["--out-dir", "x"]))
    assert (
        len(built) == 1 + 5 + 1 + 2 + 2 * 3
    )  # clean, gamma sweep, split-he, (clean, attacked) distributed and per defense
    for case in built:
        cfg = config_from_dict(case.data)
        assert [a.name for a in cfg.attacks] and all(a.name == "backdoor" for a in cfg.attacks)
    distributed = config_from_dict(built[8].data)
    assert [p.name for p in distributed.passives] == ["passive-1", "passive-2", "passive-3"]
    assert [a.params["trigger_pixels"] for a in distributed.attacks] == [[[7, 3]], [[7, 5]], [[7, 7]]]
