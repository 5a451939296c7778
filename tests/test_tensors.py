import numpy as np
import pytest
import torch

from vflnet.v1 import messages_pb2
from vflnet.wire import tensors
from vflnet.wire.meter import GRPC_FRAME_PREFIX, Meter, tensor_payload_bytes


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8"])
def test_round_trip_keeps_dtype_shape_and_values(dtype):
    a = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    back = tensors.from_proto(tensors.to_proto(a))
    assert back.dtype == a.dtype and back.shape == a.shape
    np.testing.assert_array_equal(back, a)


def test_torch_tensors_and_big_endian_input_are_encoded_little_endian():
    msg = tensors.to_proto(torch.tensor([1.5, -2.0]))
    assert msg.data == np.array([1.5, -2.0], dtype="<f4").tobytes()
    big = np.array([1, 2], dtype=">i8")
    np.testing.assert_array_equal(tensors.from_proto(tensors.to_proto(big)), [1, 2])


def test_raw_bytes_not_repeated_doubles():
    a = np.random.default_rng(0).normal(size=(128, 32)).astype(np.float32)
    msg = tensors.to_proto(a)
    assert len(msg.data) == a.nbytes
    assert msg.ByteSize() < a.nbytes + 32  # header overhead only


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda m: setattr(m, "dtype", "object"), "not allowed"),
        (lambda m: setattr(m, "data", m.data[:-4]), "do not match shape"),
        (lambda m: m.shape.append(-1), "negative dimension"),
        (lambda m: m.shape.extend([1] * 40), "42 dimensions; at most 32"),
        # 2**32 x 2**32 elements: 2**64, which an int64 product wraps to 0, the length of no data
        (
            lambda m: (m.ClearField("shape"), m.shape.extend([2**32, 2**32]), m.ClearField("data")),
            "do not match",
        ),
    ],
)
def test_malformed_tensors_are_rejected(mutate, expect):
    msg = tensors.to_proto(np.zeros((2, 3), np.float32))
    mutate(msg)
    with pytest.raises(tensors.PayloadError, match=expect):
        tensors.from_proto(msg)


def test_expected_shape_dtype_and_finiteness():
    msg = tensors.to_proto(np.zeros((4, 3), np.float32))
    with pytest.raises(tensors.PayloadError, match=r"shape \(4, 3\) where \(4, 5\)"):
        tensors.from_proto(msg, expect_shape=(4, 5))
    assert tensors.from_proto(msg, expect_shape=(None, 3)).shape == (4, 3)
    with pytest.raises(tensors.PayloadError, match="float64 was expected"):
        tensors.from_proto(msg, expect_dtype="float64")
    for bad in (np.nan, np.inf):
        with pytest.raises(tensors.PayloadError, match="NaN or Inf"):
            tensors.from_proto(tensors.to_proto(np.array([1.0, bad], np.float32)))


def test_meter_counts_wire_and_payload_bytes_per_method():
    meter = Meter()
    msg = messages_pb2.Embeddings(values=tensors.to_proto(np.ones((8, 4), np.float32)), sample_ids=range(8))
    meter.record("ExchangeEmbeddings", msg)
    meter.record("ExchangeEmbeddings", msg)
    sent, payload = meter.take()
    assert sent == {"ExchangeEmbeddings": 2 * (msg.ByteSize() + GRPC_FRAME_PREFIX)}
    assert (
        payload
        == {"ExchangeEmbeddings": 2 * 8 * 4 * 4}
        == {"ExchangeEmbeddings": 2 * tensor_payload_bytes(msg)}
    )
    assert meter.take() == ({}, {})


@pytest.mark.parametrize(
    "array",
    [np.arange(12, dtype=np.float32).reshape(4, 3), np.arange(5, dtype=">i8"), np.zeros((0,), np.float64)],
)
def test_a_tensor_filled_into_a_message_field_is_the_tensor_to_proto_builds(array) -> None:
    built = messages_pb2.EmbeddingGradients()
    built.values.CopyFrom(tensors.to_proto(array))
    filled = messages_pb2.EmbeddingGradients()
    tensors.to_proto(array, into=filled.values)
    assert filled.HasField("values") and filled.SerializeToString() == built.SerializeToString()
