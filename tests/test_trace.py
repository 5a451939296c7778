"""Trace files: round trip, reading while written, partial tails, the size cap, reopening, the CLI."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from test_interceptors import (
    DEADLINE,
    EXCHANGE,
    RUN_STEP,
    EchoActive,
    embeddings,
    out_of_field_order,
    start_server,
    values_of,
)

from vflnet.interceptors import (
    Chain,
    TraceError,
    TraceWriter,
    WireEvent,
    read_trace,
    trace_cli,
)
from vflnet.interceptors import trace as trace_mod
from vflnet.v1 import messages_pb2, services_pb2_grpc, trace_pb2
from vflnet.wire import tensors


def gradients(step: int, n: int = 4, dim: int = 3) -> messages_pb2.EmbeddingGradients:
    msg = embeddings(step=step, n=n, dim=dim, seed=step)
    return messages_pb2.EmbeddingGradients(header=msg.header, values=msg.values)


def exchange_events(steps: int, party: str = "passive-1", t0: float = 1000.0) -> list[WireEvent]:
    """A request and its response per step, as a client tap of ``party`` would see them."""
    events = []
    for step in range(1, steps + 1):
        t = t0 + step
        events.append(
            WireEvent("request", "client", EXCHANGE, party, "127.0.0.1:5", embeddings(step, seed=step), t)
        )
        events.append(
            WireEvent("response", "client", EXCHANGE, party, "127.0.0.1:5", gradients(step), t + 0.5)
        )
    return events


def same(a: WireEvent, b: WireEvent) -> bool:
    keys = ("direction", "side", "method", "party", "peer", "time")
    return all(getattr(a, k) == getattr(b, k) for k in keys) and a.message == b.message


def test_round_trip_rebuilds_every_event(tmp_path: Path) -> None:
    path = tmp_path / "p.trace"
    events = exchange_events(3)
    events.append(
        WireEvent(
            "request",
            "server",
            RUN_STEP,
            "passive-1",
            "ipv4:127.0.0.1:9",
            messages_pb2.StepCommand(header=embeddings(4).header, sample_ids=[1, 2]),
            1010.0,
        )
    )
    with TraceWriter(path, party="passive-1", run_id="r1") as writer:
        for event in events:
            assert writer(event) is None  # a tap: never rewrites
    back = list(read_trace(path))
    assert len(back) == len(events) and all(same(a, b) for a, b in zip(events, back, strict=True))
    np.testing.assert_array_equal(back[1].tensors()["values"], values_of(events[1].message))
    assert back[-1].step == 4 and back[-1].sample_ids.tolist() == [1, 2]
    header = next(trace_mod.iter_entries(path)).header
    assert (header.format_version, header.party, header.run_id) == (1, "passive-1", "r1")


def parts_of(event: WireEvent) -> tuple[tuple[bytes, ...], int]:
    return trace_mod.record_parts(event.as_record())


def test_a_record_is_written_as_the_bytes_protobuf_would_serialize(tmp_path: Path) -> None:
    """The writer frames a record itself, so that a message's bytes are not copied into it: the
    bytes must be exactly protobuf's, for large messages (one whose lengths cross into a varint's
    fourth byte), a small one and an empty one; for a time protobuf leaves out (0.0) and one it keeps
    (-0.0); and for a second message of the same route, whose record reuses the route's fields."""
    # its message's length takes 3 bytes as a varint, its record's and entry's 4 (from 2**21 on)
    crossing = WireEvent("request", "client", EXCHANGE, "p", "x" * 200, embeddings(2, n=8128, dim=64), 7.0)
    assert len(crossing.serialized()) < 1 << 21 <= len(b"".join(parts_of(crossing)[0][1:]))
    events = [
        *exchange_events(2),
        WireEvent("request", "client", EXCHANGE, "p", "x", embeddings(1, n=2000, dim=64), 5.0),
        crossing,
        WireEvent("response", "server", RUN_STEP, "p", "", messages_pb2.StepReport(), 6.0),
        WireEvent("response", "server", RUN_STEP, "p", "", messages_pb2.StepReport(), 0.0),
        WireEvent("response", "server", RUN_STEP, "p", "", messages_pb2.StepReport(), -0.0),
    ]
    for event in events:
        parts, framed = parts_of(event)
        data = b"".join(parts)
        entry = trace_pb2.TraceEntry.FromString(data[len(parts[0]) :])
        assert same(trace_mod.record_to_event(entry.record), event)
        serialized = entry.SerializeToString()  # protobuf's own bytes for that record
        assert data == trace_mod._varint(len(serialized)) + serialized and framed == len(data)
    path = tmp_path / "p.trace"
    with TraceWriter(path, party="p") as writer:
        for event in events:
            writer(event)
    assert all(same(a, b) for a, b in zip(events, read_trace(path), strict=True))


def test_a_record_holds_the_bytes_that_crossed_the_wire(tmp_path: Path) -> None:
    """An event that carries its message's bytes from the wire is recorded with those bytes, even when
    protobuf would serialize the message otherwise (here: its fields in reverse order)."""
    msg = embeddings(3)
    wire = out_of_field_order(msg)
    path = tmp_path / "wire.trace"
    with TraceWriter(path, party="active") as writer:
        writer(WireEvent("request", "server", EXCHANGE, "active", "x", msg, 7.0, data=wire))
    (entry,) = [e for e in trace_mod.iter_entries(path) if e.WhichOneof("entry") == "record"]
    assert entry.record.message == wire


def test_reader_follows_a_file_being_written(tmp_path: Path) -> None:
    path = tmp_path / "live.trace"
    events = exchange_events(2)
    writer = TraceWriter(path, party="passive-1")
    assert list(read_trace(path)) == []
    writer(events[0])
    writer(events[1])
    assert [e.direction for e in read_trace(path)] == ["request", "response"]
    writer(events[2])
    assert len(list(read_trace(path))) == 3
    writer.close()
    writer.close()  # idempotent
    assert len(list(read_trace(path))) == 3


def test_partial_last_entry_is_skipped_and_dropped_on_reopen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "crash.trace"
    events = exchange_events(2)
    with TraceWriter(path, party="passive-1") as writer:
        for event in events[:3]:
            writer(event)
    whole = path.read_bytes()
    with TraceWriter(tmp_path / "four.trace", party="passive-1") as other:
        for event in events:
            other(event)
    ends = [end for end, _ in trace_mod._scan(tmp_path / "four.trace")]
    last_entry = (tmp_path / "four.trace").read_bytes()[ends[-2] : ends[-1]]
    for cut in (1, len(last_entry) // 2, len(last_entry) - 1):  # inside the varint, the body, the last byte
        path.write_bytes(whole + last_entry[:cut])
        assert len(list(read_trace(path))) == 3
        assert trace_mod.summarize(path).partial_tail
    with caplog.at_level(logging.WARNING), TraceWriter(path, party="passive-1", run_id="resumed") as writer:
        writer(events[3])
    assert "partial last entry" in caplog.text
    back = list(read_trace(path))
    assert len(back) == 4 and same(back[3], events[3])
    summary = trace_mod.summarize(path)
    assert not summary.partial_tail and summary.records == 4
    assert [h.run_id for h in summary.headers] == ["", "resumed"]


def test_size_cap_stops_writing_records_the_truncation_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "capped.trace"
    cap = 8192
    events = exchange_events(40)  # ~300 B each: far past the cap
    with caplog.at_level(logging.WARNING), TraceWriter(path, party="p", max_bytes=cap) as writer:
        written = [writer.write(e) for e in events]
    assert (
        writer.truncated and writer.records == sum(written) and writer.dropped == len(events) - writer.records
    )
    assert written == [True] * writer.records + [False] * writer.dropped  # stops for good at the cap
    assert path.stat().st_size <= cap
    kinds = [e.WhichOneof("entry") for e in trace_mod.iter_entries(path)]
    assert kinds == ["header"] + ["record"] * writer.records + ["truncated"]
    marker = list(trace_mod.iter_entries(path))[-1].truncated
    assert marker.max_bytes == cap and marker.first_dropped_method == EXCHANGE
    assert sum("reached its cap" in r.getMessage() for r in caplog.records) == 1
    assert trace_mod.summarize(path).truncated
    with pytest.raises(ValueError, match="max_bytes"):
        TraceWriter(tmp_path / "tiny.trace", party="p", max_bytes=100)


def test_writes_after_close_are_dropped_not_raised(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.trace", party="p")
    writer.close()
    assert writer.write(exchange_events(1)[0]) is False and writer.dropped == 1


def test_concurrent_writers_never_interleave_entries(tmp_path: Path) -> None:
    """Threads append outside the writer's lock: whole entries, small ones and ones of 2 MB (many
    pages each, so a write that the kernel did not keep whole would show)."""
    path = tmp_path / "threads.trace"
    big = [
        WireEvent(
            "request", "client", EXCHANGE, "p", "peer", embeddings(i, n=4096, dim=128, seed=i), 2000.0 + i
        )
        for i in range(3)
    ]
    events = exchange_events(25) + big
    with TraceWriter(path, party="p") as writer:
        threads = [threading.Thread(target=lambda: [writer(e) for e in events]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert writer.extent() == (path.stat().st_size, 4 * len(events))
    back = list(read_trace(path))
    assert len(back) == 4 * len(events)
    assert sorted(e.time for e in back) == sorted(e.time for e in events * 4)
    assert all(same(b, e) for b in back if b.time >= 2000.0 for e in big if e.time == b.time)


class HeldAppend:
    """One thread's append held after its bytes reach the file, before the writer counts them (the
    moment a thread can be descheduled on a busy machine); other threads append as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.holder: threading.Thread | None = None
        real_writev = os.writev

        def writev(fd: int, buffers: list[bytes]) -> int:
            written = real_writev(fd, buffers)
            if threading.current_thread() is self.holder:
                self.entered.set()
                assert self.release.wait(10)
            return written

        monkeypatch.setattr(trace_mod.os, "writev", writev)

    def start(self, target: object, *args: object) -> threading.Thread:
        self.holder = threading.Thread(target=target, args=args)  # type: ignore[arg-type]
        self.holder.start()
        assert self.entered.wait(10)
        return self.holder


def blocked(target: object, *args: object) -> tuple[threading.Thread, list[object]]:
    """``target(*args)`` in a thread, asserted to be still waiting 0.2 s later; its result in the list."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(target(*args)))  # type: ignore[operator]
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()
    return thread, out


def entry_ends(path: Path) -> list[int]:
    return [end for end, _ in trace_mod._scan(path)]


def test_extent_waits_for_the_appends_under_way_and_is_an_entry_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's extent while a pipelined message is being traced: an append that reached the
    file first and is counted last must not leave the extent in the middle of an entry."""
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, party="p")
    events = exchange_events(2)
    held = HeldAppend(monkeypatch)
    first = held.start(writer.write, events[0])
    assert writer.write(events[1])  # not held: it lands after the held one and is counted first
    waiting, extent = blocked(writer.extent)
    held.release.set()
    first.join(10)
    waiting.join(10)
    assert extent == [(path.stat().st_size, 2)] and extent[0][0] in entry_ends(path)  # type: ignore[index]
    writer.close()


def test_close_and_cut_wait_for_the_appends_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing or cutting the file waits for an append under way instead of closing or truncating the
    descriptor under it; two closes at once are one close."""
    path = tmp_path / "slow.trace"
    writer = TraceWriter(path, party="p")
    events = exchange_events(2)
    writer.write(events[0])
    checkpoint = writer.extent()
    held = HeldAppend(monkeypatch)
    writing = held.start(writer.write, events[1])
    cutting, _ = blocked(writer.cut, *checkpoint)
    held.release.set()
    writing.join(10)
    cutting.join(10)
    assert path.stat().st_size == checkpoint[0] and writer.extent() == checkpoint  # cut after the append

    held.entered.clear()
    held.release.clear()
    writing = held.start(writer.write, events[1])
    closes = [blocked(writer.close)[0] for _ in range(2)]
    held.release.set()
    for thread in (writing, *closes):
        thread.join(10)
        assert not thread.is_alive()
    assert (
        writer.records == 2
        and [same(e, x) for e, x in zip(read_trace(path), events[:2], strict=True)] == [True] * 2
    )
    with pytest.raises(ValueError, match="closed"):
        writer.cut(*checkpoint)


def test_the_cap_marker_comes_after_the_appends_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "capped.trace"
    events = exchange_events(40)
    writer = TraceWriter(path, party="p", max_bytes=8192)
    held = HeldAppend(monkeypatch)
    writing = held.start(writer.write, events[0])
    capping, dropped = blocked(lambda: [writer.write(e) for e in events[1:]])
    held.release.set()
    writing.join(10)
    capping.join(10)
    writer.close()
    kinds = [e.WhichOneof("entry") for e in trace_mod.iter_entries(path)]
    assert kinds == ["header"] + ["record"] * writer.records + ["truncated"] and writer.truncated
    assert writer.records == 1 + sum(dropped[0])  # type: ignore[arg-type]


def test_a_resumed_writer_cut_back_to_a_checkpoint_keeps_its_own_header_and_admission(tmp_path: Path) -> None:
    """A resumed party reopens its trace (a new header), is admitted (its Join crosses the wire), and
    only then learns the checkpoint to cut back to: the steps after the checkpoint go, the resumed
    session's own entries stay, after the checkpoint's, and each message appears once."""
    path = tmp_path / "resumed.trace"
    events = exchange_events(3)
    with TraceWriter(path, party="p", run_id="r") as first:
        first.write(events[0])
        first.write(events[1])
        checkpoint = first.extent()
        first.write(events[2])  # a step after the checkpoint: the resumed run repeats it
    admission = WireEvent("request", "client", EXCHANGE, "p", "peer", embeddings(99, seed=99), 3000.0)
    with TraceWriter(path, party="p", run_id="r") as resumed:
        resumed.write(admission)
        resumed.cut(*checkpoint)
        assert resumed.extent() == (path.stat().st_size, 3)
        resumed.write(events[2])
    entries = list(trace_mod.iter_entries(path))
    assert [e.WhichOneof("entry") for e in entries] == [
        "header",
        "record",
        "record",
        "header",
        "record",
        "record",
    ]
    back = list(read_trace(path))
    assert [same(a, b) for a, b in zip(back, [events[0], events[1], admission, events[2]], strict=True)] == [
        True
    ] * 4


def test_a_run_started_over_keeps_only_the_new_session(tmp_path: Path) -> None:
    """Resumed with no checkpoint yet, a run starts from its first step again: cut back to nothing,
    the trace keeps the new session's header and admission only."""
    path = tmp_path / "again.trace"
    events = exchange_events(2)
    with TraceWriter(path, party="p", run_id="first") as first:
        first.write(events[0])
    with TraceWriter(path, party="p", run_id="again") as again:
        again.write(events[1])  # the admission
        again.cut(0, 0)
        again.write(events[2])
    assert [h.run_id for h in trace_mod.summarize(path).headers] == ["again"]
    assert [same(e, x) for e, x in zip(read_trace(path), events[1:3], strict=True)] == [True, True]


def test_a_trace_reopened_over_its_cap_and_cut_back_carries_no_marker(tmp_path: Path) -> None:
    """A resumed party's trace already over its cap: its admission is dropped and a marker written,
    then the cut back to the checkpoint frees the room. The marker does not move down with the
    session's entries (no record may follow a marker), and the trace takes records again."""
    path = tmp_path / "capped.trace"
    events = exchange_events(40)  # ~300 B each
    with TraceWriter(path, party="p", max_bytes=8192) as first:
        first.write(events[0])
        checkpoint = first.extent()
        for event in events[1:]:
            first.write(event)
        assert first.truncated
    with TraceWriter(path, party="p", max_bytes=8192) as resumed:
        assert resumed.write(events[1]) is False and resumed.truncated  # over the cap at once
        resumed.cut(*checkpoint)
        assert resumed.write(events[1])
    kinds = [e.WhichOneof("entry") for e in trace_mod.iter_entries(path)]
    assert kinds == ["header", "record", "header", "record"]


def test_a_cut_past_the_end_of_the_file_is_refused(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.trace", party="p") as writer:
        size, records = writer.extent()
        with pytest.raises(ValueError, match="shorter than"):
            writer.cut(size + 1, records)


def test_a_resumed_trace_keeps_the_rest_of_the_checkpoint_step(tmp_path: Path) -> None:
    """A party saves its checkpoint within the step and answers after: the cut keeps the step's
    training records after the checkpoint's length, and stops at another step or phase."""
    from vflnet.threat.interception import _with_the_step_end

    def at(step: int, phase: int = messages_pb2.TRAIN) -> WireEvent:
        message = embeddings(step, seed=step)
        message.header.phase = phase
        return WireEvent("response", "server", EXCHANGE, "active", "peer", message, 1000.0 + step)

    path = tmp_path / "t.trace"
    with TraceWriter(path, party="active") as writer:
        writer.write(at(1))
        checkpoint = writer.extent()  # saved within step 2, before its replies
        writer.write(at(2))
        writer.write(at(2))
        kept = writer.extent()
        writer.write(at(3))
        assert _with_the_step_end(writer, *checkpoint, 2) == kept
        assert _with_the_step_end(writer, *checkpoint, 1) == checkpoint
    with TraceWriter(tmp_path / "eval.trace", party="active") as writer:
        checkpoint = writer.extent()
        writer.write(at(2, messages_pb2.EVAL))
        assert _with_the_step_end(writer, *checkpoint, 2) == checkpoint


def test_a_failed_append_names_the_file_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.trace"
    events = exchange_events(1)
    writer = TraceWriter(path, party="p")
    extent = writer.extent()
    real_writev = os.writev

    def full(fd: int, buffers: list[bytes]) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trace_mod.os, "writev", full)
    with pytest.raises(OSError, match="No space left") as raised:
        writer.write(events[0])
    assert raised.value.filename == str(path) and writer.extent() == extent and not writer.cut_short
    monkeypatch.setattr(trace_mod.os, "writev", real_writev)
    assert writer.write(events[1]) and writer.extent() == (path.stat().st_size, 1)  # the disk has room again
    writer.close()


def test_a_short_write_raises_instead_of_being_finished_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk writes part of an entry: finishing it with a second call could put another
    thread's entry in between, so the write fails, names the file, is not counted, and nothing is
    appended after it; reopened (a resumed run), the file drops the cut entry and goes on."""
    path = tmp_path / "full.trace"
    events = exchange_events(2)
    writer = TraceWriter(path, party="p")
    writer.write(events[0])
    extent = writer.extent()
    real_writev = os.writev
    monkeypatch.setattr(trace_mod.os, "writev", lambda fd, buffers: real_writev(fd, [b"".join(buffers)[:3]]))
    with pytest.raises(OSError, match="cut short") as raised:
        writer.write(events[1])
    assert raised.value.filename == str(path)
    assert writer.extent() == extent  # the complete entries: what a resumed run cuts the file back to
    monkeypatch.setattr(trace_mod.os, "writev", real_writev)
    assert writer.cut_short and writer.write(events[2]) is False and writer.dropped == 1
    writer.close()
    assert path.stat().st_size == extent[0] + 3 and trace_mod.summarize(path).partial_tail
    with TraceWriter(path, party="p") as reopened:
        reopened.write(events[3])
    assert [same(e, x) for e, x in zip(read_trace(path), [events[0], events[3]], strict=True)] == [True, True]


def test_foreign_and_newer_files_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "notes.trace"
    foreign.write_bytes(b"\x05hello world, not a trace")
    with pytest.raises(TraceError, match="not a vflnet trace"):
        list(read_trace(foreign))
    with pytest.raises(TraceError, match="not a vflnet trace"):
        TraceWriter(foreign, party="p")
    assert foreign.read_bytes().startswith(b"\x05hello")  # left as it was
    newer = tmp_path / "newer.trace"
    data = trace_pb2.TraceEntry(header=trace_pb2.TraceHeader(format_version=99)).SerializeToString()
    newer.write_bytes(trace_mod._varint(len(data)) + data)
    with pytest.raises(TraceError, match="newer"):
        list(read_trace(newer))


def test_writer_is_a_tap_on_a_real_server(tmp_path: Path) -> None:
    path = trace_mod.trace_path(tmp_path / "run", "active")
    writer = TraceWriter(path, party="active", run_id="r1")
    server, address = start_server(EchoActive(), Chain([writer]), "hook")  # as a party's server carries it
    try:
        with grpc.insecure_channel(address) as channel:
            stub = services_pb2_grpc.ActiveStub(channel)
            sent = [embeddings(step=s, seed=s) for s in (1, 2)]
            for msg in sent:
                stub.ExchangeEmbeddings(msg, timeout=DEADLINE)
    finally:
        server.stop(grace=0)
        writer.close()
    assert path == tmp_path / "run" / "traces" / "active.trace"
    back = list(read_trace(path))
    assert [(e.direction, e.step, e.side) for e in back] == [
        ("request", 1, "server"),
        ("response", 1, "server"),
        ("request", 2, "server"),
        ("response", 2, "server"),
    ]
    assert back[2].message == sent[1]


# ---------------------------------------------------------------------------------------- CLI
@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    with TraceWriter(trace_mod.trace_path(run, "passive-1"), party="passive-1", run_id="r1") as w:
        for e in exchange_events(3, "passive-1", t0=1000.0):
            w(e)
    with TraceWriter(trace_mod.trace_path(run, "active"), party="active", run_id="r1") as w:
        for e in exchange_events(3, "active", t0=1000.2):
            w(WireEvent(e.direction, "server", e.method, "active", "ipv4:x", e.message, e.time))
    return run


def test_cli_ls_lists_files_with_counts(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert trace_cli.main(["ls", str(run_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith(str(run_dir / "traces" / "active.trace"))
    assert all("records=6" in line and "ExchangeEmbeddings=6" in line and "run=r1" in line for line in out)


def test_cli_show_merges_by_time_and_filters(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert trace_cli.main(["show", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12
    assert lines[0].split()[1:4] == ["passive-1", "client", "request"] and lines[1].split()[1] == "active"
    assert (
        trace_cli.main(["show", str(run_dir), "--direction", "response", "--step", "2", "--party", "active"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "server response ExchangeEmbeddings step=2" in lines[0]
    assert "samples=" not in lines[0] and "values=float32[4, 3]" in lines[0]
    assert trace_cli.main(["show", str(run_dir), "--method", "RunStep"]) == 0
    assert capsys.readouterr().out == ""
    assert trace_cli.main(["show", str(run_dir / "traces" / "active.trace"), "--limit", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_cli_export_writes_arrays_per_record(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.npz"
    assert (
        trace_cli.main(
            ["export", str(run_dir), "--party", "passive-1", "--direction", "request", "--out", str(out)]
        )
        == 0
    )
    with np.load(out) as npz:
        assert npz["step"].tolist() == [1, 2, 3]
        assert npz["direction"].tolist() == ["request"] * 3 and npz["sender"].tolist() == ["passive-1"] * 3
        np.testing.assert_array_equal(npz["rec1_sample_ids"], np.arange(10, 14))
        np.testing.assert_array_equal(npz["rec2_values"], tensors.from_proto(embeddings(3, seed=3).values))
        assert "rec0_values" in npz.files and "rec3_values" not in npz.files
    assert "wrote 3 records" in capsys.readouterr().out


def test_cli_reports_missing_and_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert trace_cli.main(["ls", str(tmp_path / "nope")]) == 2
    (tmp_path / "empty").mkdir()
    assert trace_cli.main(["show", str(tmp_path / "empty")]) == 2
    bad = tmp_path / "bad.trace"
    shutil.copyfile(__file__, bad)
    assert trace_cli.main(["show", str(bad)]) == 1
    assert "vflnet trace:" in capsys.readouterr().err


def test_cli_export_keeps_the_numbers_of_control_messages(tmp_path: Path) -> None:
    """Security finding 8: export left out JoinReply and DecryptReply contents, the only plaintext
    numbers a passive party receives under split-he."""
    from vflnet.crypto.masking import ints_to_bytes

    ints = np.array([[2**70, -5], [7, -(2**65)]], dtype=object)
    data, width = ints_to_bytes(ints)
    join = messages_pb2.JoinReply(run_id="r1", train_ids=[4, 5, 6], test_ids=[9])
    join.protocol.values["public_key"] = b"{}"
    join.roster.add(name="active", role="active", address="127.0.0.1:1")
    decrypt = messages_pb2.DecryptReply(shape=[2, 2], integer_width=width, integers=data)
    run = tmp_path / "run"
    with TraceWriter(trace_mod.trace_path(run, "passive-1"), party="passive-1", run_id="r1") as w:
        w(WireEvent("response", "client", "/vflnet.v1.Coordinator/Join", "passive-1", "x", join, 1.0))
        w(WireEvent("response", "client", "/vflnet.v1.Coordinator/Decrypt", "passive-1", "x", decrypt, 2.0))
    out = tmp_path / "x.npz"
    assert trace_cli.main(["export", str(run), "--out", str(out)]) == 0
    with np.load(out) as npz:
        np.testing.assert_array_equal(npz["rec0_train_ids"], [4, 5, 6])
        np.testing.assert_array_equal(npz["rec0_test_ids"], [9])
        assert '"address": "127.0.0.1:1"' in str(npz["rec0_fields"])
        assert npz["rec1_integers"].tolist() == [[str(2**70), "-5"], ["7", str(-(2**65))]]


def test_requests_from_outside_the_run_are_counted_not_recorded(tmp_path: Path) -> None:
    """Security finding 8: a party's trace recorded refused garbage from non-roster senders until its
    cap, crowding out the run's own messages."""
    from tests.conftest import base_config
    from vflnet.threat.interception import party_interception
    from vflnet.validation import config_from_dict

    data = base_config()
    data["run"]["id"] = "r1"
    data["trace"] = {"parties": ["active"]}
    cfg = config_from_dict(data)
    interception = party_interception(cfg, "active", tmp_path)

    def request(msg: messages_pb2.Embeddings, side: str = "server") -> WireEvent:
        return WireEvent("request", side, EXCHANGE, "active", "ipv4:x", msg, 1.0)

    good = embeddings(1)
    good.header.run_id = "r1"
    mallory, other_run = messages_pb2.Embeddings(), messages_pb2.Embeddings()
    mallory.CopyFrom(good)
    mallory.header.sender = "mallory"
    other_run.CopyFrom(good)
    other_run.header.run_id = "r2"
    for msg in (mallory, other_run, good, mallory):
        interception.chain(request(msg))
    interception.chain(request(mallory, side="client"))  # what the party itself sent is always kept
    interception.finish(tmp_path)
    recorded = list(read_trace(trace_mod.trace_path(tmp_path, "active")))
    assert [(e.side, e.sender) for e in recorded] == [("server", "passive-1"), ("client", "mallory")]


def test_the_bench_tap_blocks_are_refused_beside_an_attack_and_announced_otherwise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The A/B of the tap (`vflnet bench goals`: a chain gate, tools/bench/tap_ab.py, in the run's
    `plugins:`) leaves every other block of steps out of the trace: never silently, and never under an
    attack that would miss them too."""
    from tests.conftest import base_config
    from vflnet.config import ConfigError
    from vflnet.threat.interception import party_interception
    from vflnet.validation import config_from_dict

    data = base_config()
    data["trace"] = {"parties": ["all"]}
    data["plugins"] = ["vflnet.tools.bench.tap_ab"]
    attacked = {
        **data,
        "attacks": [{"name": "gradient-scaling", "party": "passive-1", "params": {"gamma": 0.0}}],
    }
    with pytest.raises(ConfigError, match=r"key 'plugins'.*the attacks \(gradient-scaling\) would miss"):
        config_from_dict(attacked)
    cfg = config_from_dict(data)
    with caplog.at_level(logging.WARNING):
        active = party_interception(cfg, "active", tmp_path / "b")
    assert active.chain.passes is not None
    assert "plug-in vflnet.tools.bench.tap_ab gates the chain" in caplog.text
    data["plugins"] = []
    assert party_interception(config_from_dict(data), "active", tmp_path / "d").chain.passes is None


@pytest.mark.e2e
def test_a_run_under_the_bench_tap_blocks_traces_the_even_blocks_only(tmp_path: Path) -> None:
    """The A/B on real processes: every party's trace holds the steps of even blocks of 4, all of
    their messages, and none of the odd blocks' (the gate of tests/plugins/tap_blocks4.py)."""
    import yaml

    from tests.conftest import base_config
    from vflnet.runner.local import run_local

    data = base_config()
    data["train"].update(epochs=1, eval_every=100)  # steps 1 to 23, of 64 rows each
    data["trace"] = {"parties": ["all"]}
    data["plugins"] = ["tests.plugins.tap_blocks4"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    for party in ("coordinator", "active", "passive-1", "passive-2"):
        trace = trace_mod.trace_path(tmp_path / "run", party)
        steps = [e.step for e in read_trace(trace) if e.step is not None and e.phase == messages_pb2.TRAIN]
        assert steps and all(step // 4 % 2 == 0 for step in steps), (party, sorted(set(steps)))
        assert {1, 8, 11, 16, 19} <= set(steps), (party, sorted(set(steps)))


def test_a_trace_tap_alone_records_through_the_hooks_what_it_records_as_a_mod(tmp_path: Path) -> None:
    """A chain of the trace tap alone runs without an event per message (chain.Recorder): the hooks
    hand it the fields instead. Its trace must hold what the same tap writes when it runs as a mod
    among others: the same records, in the same order, and the same requests from outside the run
    left out."""
    from tests.conftest import base_config
    from vflnet.interceptors import grpc_adapters
    from vflnet.interceptors.grpc_adapters import ClientChainHook, ServerChainHook
    from vflnet.threat.interception import RunTrace
    from vflnet.validation import config_from_dict

    data = base_config()
    data["run"]["id"] = "r1"
    cfg = config_from_dict(data)
    good = embeddings(1)
    good.header.run_id = "r1"
    outsider = messages_pb2.Embeddings()
    outsider.CopyFrom(good)
    outsider.header.sender = "mallory"
    seen = []
    traces = {}
    for how, extra in (("alone", []), ("among others", [lambda event: seen.append(event.method)])):
        writer = TraceWriter(tmp_path / f"{how}.trace", party="active", run_id="r1")
        chain = Chain([RunTrace(writer, cfg), *extra])
        assert (chain.recorder is not None) == (how == "alone")
        server, client = ServerChainHook(chain, "active"), ClientChainHook(chain, "active", "passive-1:1")
        with pytest.MonkeyPatch.context() as patch:
            if how == "alone":  # the recorder's way builds no event at all
                patch.setattr(grpc_adapters, "WireEvent", None)
            before = time.time()
            for msg in (good, outsider):
                assert server.request(EXCHANGE, msg, "ipv4:x", msg.SerializeToString()) is msg
            reply, report = gradients(1), messages_pb2.StepReport()
            assert server.response(EXCHANGE, reply, "ipv4:x") is reply
            assert client.request(RUN_STEP, good) is good
            assert client.response(RUN_STEP, report) is report
            after = time.time()
        writer.close()
        recorded = list(read_trace(writer.path))
        assert all(before <= e.time <= after for e in recorded), how  # stamped when seen
        traces[how] = [dataclasses.replace(e, time=0.0) for e in recorded]
    assert len(seen) == 5  # the other mod saw every message, the outsider's too
    assert traces["alone"] == traces["among others"]
    assert [(e.side, e.direction, e.sender) for e in traces["alone"]] == [
        ("server", "request", "passive-1"),
        ("server", "response", "passive-1"),
        ("client", "request", "passive-1"),
        ("client", "response", ""),
    ]


def test_the_bench_tap_blocks_are_refused_for_a_run_that_traces_no_party(tmp_path: Path) -> None:
    """The bench's chain gate times the trace tap: listed by a run without one, it would do nothing."""
    import yaml

    from tests.conftest import base_config
    from vflnet.config import ConfigError
    from vflnet.runner.local import run_local

    data = base_config()
    data["plugins"] = ["vflnet.tools.bench.tap_ab"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        ConfigError, match="key 'plugins': .* and the run traces no party: it would gate nothing"
    ):
        run_local(path, run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "logs").exists() or not any((tmp_path / "run" / "logs").iterdir())
