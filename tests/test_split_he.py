"""split-he (paper 004 Algorithm 1): masking, encrypted backprop, the decryption service, and the
end-to-end equivalence with plaintext split learning."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import base_config, max_difference_from_reference, write_config
from vflnet.crypto import generate_keypair
from vflnet.crypto.masking import ints_from_bytes, ints_to_bytes, mask, unmask
from vflnet.crypto.wire import cipher_to_proto
from vflnet.protocols.he_backprop import check_supported, encrypted_param_grads, forward_with_cache
from vflnet.protocols.split_he import DecryptionService
from vflnet.runner.local import run_local
from vflnet.runner.reference import train_reference
from vflnet.v1 import messages_pb2
from vflnet.validation import config_from_dict
from vflnet.wire.errors import RpcFailure


@pytest.fixture(scope="module")
def keys():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 512-bit keys: tests only
        return generate_keypair(512, allow_insecure=True)


def test_mask_hides_values_and_unmask_is_exact(keys):
    pk, sk = keys
    values = np.array([[0.5, -1.25, 3e-6], [0.0, 7.0, -2.0]])
    enc = pk.encrypt(values, 20)
    masked, r = mask(enc)
    assert masked.packed  # packed before decryption: fewer ciphertexts for the coordinator
    seen = sk.decrypt_encoded(masked)
    plain = sk.decrypt_encoded(enc)
    assert np.all(np.abs(seen - plain) > 0)  # every value moved, low-order bits included
    np.testing.assert_allclose(unmask(seen, r, masked.frac_bits), values, atol=2**-20)
    data, width = ints_to_bytes(seen)
    assert (ints_from_bytes(data, width, seen.shape) == seen).all()


def test_encrypted_backprop_matches_autograd(keys):
    pk, sk = keys
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    check_supported(model)
    x = torch.randn(7, 6)
    g = torch.randn(7, 3) / 7
    out, cache = forward_with_cache(model, x)
    torch.testing.assert_close(out, model(x))
    enc = encrypted_param_grads(model, cache, pk.encrypt(g.double().numpy(), 24))
    model(x).backward(g)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(sk.decrypt(enc[name]), p.grad.double().numpy(), atol=1e-6, err_msg=name)


def test_unsupported_bottom_is_refused():
    with pytest.raises(ValueError, match="Linear/ReLU/Tanh/Sigmoid only"):
        check_supported(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2, 2)))


def test_decryption_service_checks_purpose_and_role(keys):
    data = base_config(n_passive=2, aggregation="sum")
    data["run"]["id"] = "he"
    data["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    }
    cfg = config_from_dict(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        service = DecryptionService(SimpleNamespace(cfg=cfg, run_dir=None))
    masked, r = mask(service.public_key.encrypt(np.array([[1.5, -2.0]]), 16))
    # step 1 is in flight (the coordinator's schedule sends its command first)
    step = messages_pb2.Header(run_id="he", sender="coordinator", step=1, phase=messages_pb2.TRAIN)
    service.command("passive-1", messages_pb2.StepCommand(header=step, sample_ids=[0]))

    def request(sender, purpose):
        hdr = messages_pb2.Header(run_id="he", sender=sender, step=1, phase=messages_pb2.TRAIN)
        return messages_pb2.DecryptRequest(header=hdr, purpose=purpose, cipher=cipher_to_proto(masked))

    reply = service.decrypt(request("passive-1", "masked_gradient"), None)
    ints = ints_from_bytes(reply.integers, reply.integer_width, tuple(reply.shape))
    np.testing.assert_allclose(unmask(ints, r, masked.frac_bits), [[1.5, -2.0]])
    with pytest.raises(RpcFailure) as info:
        service.decrypt(request("passive-1", "aggregate_logits"), None)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(RpcFailure, match="unknown decryption purpose"):
        service.decrypt(request("active", "everything"), None)
    assert service.requests == {"passive-1/masked_gradient": 1}


@pytest.mark.e2e
def test_split_he_run_ends_with_the_split_parameters(tmp_path):
    data = base_config(n_passive=2, aggregation="sum", active_features=True)
    data["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    }
    for p in data["parties"][1:]:
        p["bottom"] = {"kind": "mlp", "hidden": [6], "out": 10}
    data["train"].update(
        batch_size=16, max_steps=4, optimizer={"kind": "sgd", "lr": 0.5}, eval_batch_size=512
    )
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    # the coordinator decrypted only masked values: one masked aggregate per step for the active
    # party and one masked gradient per training step for each passive party
    assert summary["decryptions"]["requests"]["passive-1/masked_gradient"] == 4
    assert "passive-1/aggregate_logits" not in summary["decryptions"]["requests"]

    plain = dict(data, protocol={"kind": "split", "aggregation": "sum"})
    reference = train_reference(config_from_dict(plain), evaluate=False)
    assert max_difference_from_reference(tmp_path / "run", reference) < 1e-4
