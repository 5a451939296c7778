"""Step deadlines scale with the work (vflnet/sdk/deadlines.py): key size, batch, model, protocol."""

from __future__ import annotations

import json
import math

import grpc
import pytest

from tests.conftest import base_config, served_coordinator, write_config
from vflnet.interceptors import Chain
from vflnet.interceptors.bridge import GrpcBridge
from vflnet.roles.party import PartyHost
from vflnet.runner.local import run_local
from vflnet.shared_config import shared_json
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.validation import config_from_dict


def he_config(key_bits: int = 2048, batch: int = 128) -> dict:
    data = base_config(n_passive=2, aggregation="sum")
    data["run"]["id"] = "deadlines"
    data["protocol"] = {"kind": "split-he", "aggregation": "sum", "params": {"key_bits": key_bits}}
    data["train"].update(batch_size=batch)
    return data


def passive_estimate(tmp_path, data: dict) -> float:
    cfg = config_from_dict(data)
    return PartyHost(cfg, "passive-1", tmp_path, GrpcBridge(cfg.transport)).side.step_work_s()


def test_a_steps_work_estimate_grows_with_key_size_batch_and_protocol(tmp_path) -> None:
    at_2048 = passive_estimate(tmp_path, he_config(2048, 128))
    assert at_2048 / passive_estimate(tmp_path, he_config(1024, 128)) > 7  # Paillier: ~ bits^3
    assert at_2048 / passive_estimate(tmp_path, he_config(2048, 32)) > 2  # products: ~ batch
    plain = base_config(n_passive=2, aggregation="sum")
    assert passive_estimate(tmp_path, plain) < at_2048 / 100  # the same model without cryptography


def test_a_hostile_work_estimate_is_refused_and_the_coordinator_keeps_admitting(tmp_path) -> None:
    data = base_config(n_passive=2)
    data["run"]["id"] = "deadlines"
    data["transport"]["join_timeout_s"] = 3  # how long the admitted party's Join waits for the roster
    cfg = config_from_dict(data)
    with served_coordinator(cfg, tmp_path) as (host, bridge, address):
        stub = services_pb2_grpc.CoordinatorStub(bridge.open_channel(address, "passive-1", Chain()))

        def join(work: float) -> None:
            req = messages_pb2.JoinRequest(
                run_id="deadlines",
                name="passive-1",
                role="passive",
                address="127.0.0.1:1",
                sample_ids=[1, 2],
                step_work_s=work,
                config=shared_json(cfg),
            )
            stub.Join(req, timeout=1)  # a valid join waits for the roster: DEADLINE_EXCEEDED here

        for hostile in (math.nan, -1.0, math.inf, 1e12):
            with pytest.raises(grpc.RpcError) as info:
                join(hostile)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, hostile
            assert "step_work_s" in info.value.details()
        assert host.admission.joined == {}
        with pytest.raises(grpc.RpcError) as info:
            join(2.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert host.admission.joined["passive-1"].step_work_s == 2.5


@pytest.mark.e2e
def test_a_split_he_step_longer_than_rpc_timeout_completes_under_its_scaled_deadline(tmp_path) -> None:
    """2048-bit split-he steps of batch 128 take seconds; rpc_timeout_s is 1 s. With the deadline from
    the config alone every step would fail with DEADLINE_EXCEEDED; scaled with the work, the run ends."""
    data = he_config(2048, 128)
    data["train"].update(epochs=1, max_steps=2, eval_batch_size=128)
    data["transport"] = {"rpc_timeout_s": 1, "join_timeout_s": 300}
    run_dir = tmp_path / "run"
    assert run_local(write_config(tmp_path, data), run_dir=run_dir, progress=False) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["step_deadline_s"] > 1 + 10 * 1.0  # work_slack 10 x over a second of estimated work
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    slowest = max(s["step_time_s"] for s in steps if s["kind"] == "step")
    assert slowest > 1, "every step fit in rpc_timeout_s: the test no longer shows the scaled deadline"
