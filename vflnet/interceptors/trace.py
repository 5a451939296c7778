"""Trace files: what a tap saw on the wire, kept as a file a user can inspect and replay offline.

Format (``proto/vflnet/v1/trace.proto``): a sequence of ``TraceEntry`` messages, each preceded by its
byte length as a varint (protobuf's length-delimited framing). The first entry is a ``TraceHeader``
(format version, run id, writing party); then one ``TraceRecord`` per message; a ``TraceTruncated``
marker when the size cap was hit. The file is append-only and every entry reaches the kernel as it is
written (one system call, no buffer in this process), so a reader can follow it while a run is still
writing: a reader stops cleanly at a partial last entry. Threads append their entries concurrently,
each as one ``writev`` on a descriptor opened with ``O_APPEND``: the kernel writes one whole before
the next on a local file system, as it does for any two appends to one file.
A writer reopening an existing file drops such a partial tail first (a crash mid-write) and appends
a new header, so one file can hold several sessions of the same party (e.g. a resumed run).
"""

from __future__ import annotations

import errno
import functools
import io
import logging
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from vflnet.durable import WriteFailed
from vflnet.interceptors.events import WireEvent, short_name
from vflnet.v1 import trace_pb2

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SUFFIX = ".trace"
DEFAULT_MAX_BYTES = 1 << 30
MIN_MAX_BYTES = 4096
_MARKER_RESERVE = 512  # bytes kept below the cap for the TraceTruncated marker
_MAX_VARINT_BYTES = 10


def trace_path(run_dir: str | Path, party: str) -> Path:
    """Where a party's trace of a run lives: ``<run_dir>/traces/<party>.trace``."""
    return Path(run_dir) / "traces" / f"{party}{SUFFIX}"


class TraceError(ValueError):
    """The file is not a vflnet trace, is corrupt, or was written by a newer format."""


def _varint(n: int) -> bytes:
    if n < 0x80:  # up to three bytes without a loop: every record frames three lengths
        return _ONE_BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0x200000:
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _read_varint(f: BinaryIO) -> int | None:
    """The next varint, or None at end of file or inside a partial varint."""
    value = shift = 0
    for _ in range(_MAX_VARINT_BYTES):
        byte = f.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
    raise TraceError(f"{getattr(f, 'name', 'trace')}: entry length is not a valid varint")


def _open_append(path: Path) -> int:
    """A raw append-only descriptor: each entry is one write system call, with no buffer in between."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask applies, as for open()


def _tag(message: type[Message], name: str) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return _varint(message.DESCRIPTOR.fields_by_name[name].number << 3 | 2)


_RECORD_TAG = _tag(trace_pb2.TraceEntry, "record")
_MESSAGE_TAG = _tag(trace_pb2.TraceRecord, "message")
_TIME_FIELD = trace_pb2.TraceRecord.DESCRIPTOR.fields_by_name["time"]
_TIME_KEY = _varint(_TIME_FIELD.number << 3 | 1)  # wire type 1: 64 bits
_DOUBLE = struct.Struct("<d")
_NO_TIME = _DOUBLE.pack(0.0)  # proto3 leaves a double out when its bits are all zero (-0.0 is kept)
assert _TIME_FIELD.number == 1, "record_parts writes the time first: protobuf's order by field number"


@functools.lru_cache(maxsize=1024)  # one per method, direction and peer of a run: a handful
def _route_fields(party: str, side: str, direction: str, method: str, peer: str, message_type: str) -> bytes:
    """A record's fields between its time and its message, serialized: the same for every message of
    a method, direction and peer, so each record builds only its time and its lengths."""
    return trace_pb2.TraceRecord(
        party=party, side=side, direction=direction, method=method, peer=peer, message_type=message_type
    ).SerializeToString()


# a length's varint: a route's messages come back in a few lengths, step after step (their sample ids
# and tensors keep their sizes), so each record looks its three lengths up
_length = functools.lru_cache(maxsize=4096)(_varint)


def record_parts(
    direction: str,
    side: str,
    method: str,
    party: str,
    peer: str,
    message: Message,
    data: bytes | None,
    at: float,
) -> tuple[tuple[bytes, ...], int]:
    """A message (an event's fields; ``data``: its bytes on the wire, when known; ``at``: its time)
    as a framed ``TraceEntry``, in parts, and its length: the bytes of
    ``TraceEntry(record=...).SerializeToString()`` with their length prefix (protobuf writes fields in
    number order: the time, the fields that name the message's route, then ``message``). The last
    part is the message's bytes as they are: a message of tens of KB is not copied into a record and
    serialized a second time."""
    body = message.SerializeToString() if data is None else data
    time_bits = _DOUBLE.pack(at)
    # proto3 leaves a double out when its bits are all zero (-0.0 is kept)
    time_field = b"" if time_bits == _NO_TIME else _TIME_KEY + time_bits
    fields = _route_fields(party, side, direction, method, peer, message.DESCRIPTOR.full_name)
    if body:  # proto3 leaves an empty bytes field out
        fields += _MESSAGE_TAG + _length(len(body))
    record = len(time_field) + len(fields) + len(body)  # the TraceRecord's bytes
    head = _RECORD_TAG + _length(record)  # the TraceEntry's key and its record's length
    prefix = _length(len(head) + record)  # the entry's length, as the file frames it
    return (prefix, head, time_field, fields, body), len(prefix) + len(head) + record


def _scan(path: Path, offset: int = 0) -> Iterator[tuple[int, trace_pb2.TraceEntry]]:
    """(end offset, entry) for every complete entry from byte ``offset`` (an entry's start); stops at a
    partial last entry."""
    with open(path, "rb") as f:
        f.seek(offset)
        yield from _entries(f, path, first=offset == 0)


def _entries(f: BinaryIO, path: Path, first: bool) -> Iterator[tuple[int, trace_pb2.TraceEntry]]:
    """(end offset in ``f``, entry) for every complete entry of ``f`` from where it stands, read from
    ``path``; ``first``: the entry there must be the trace's header."""
    while True:
        start = f.tell()
        length = _read_varint(f)
        if length is None:
            return
        data = f.read(length)
        if len(data) < length:
            return
        entry = trace_pb2.TraceEntry()
        try:
            entry.ParseFromString(data)
        except DecodeError as exc:
            what = "not a vflnet trace (the first entry does not parse)" if first else "corrupt entry"
            raise TraceError(f"{path}: {what} at byte {start}: {exc}") from exc
        kind = entry.WhichOneof("entry")
        if first and kind != "header":
            raise TraceError(f"{path}: not a vflnet trace (no trace header at the start)")
        if kind == "header" and entry.header.format_version > FORMAT_VERSION:
            raise TraceError(
                f"{path}: trace format {entry.header.format_version} is newer than this vflnet "
                f"reads ({FORMAT_VERSION})"
            )
        if kind is None:
            raise TraceError(f"{path}: empty entry at byte {start}")
        first = False
        yield f.tell(), entry


def entries_after(path: str | Path, offset: int) -> Iterator[tuple[int, trace_pb2.TraceEntry]]:
    """(end offset, entry) of the complete entries from byte ``offset`` on: ``offset`` must be an
    entry's end, such as a checkpoint's :meth:`TraceWriter.extent`."""
    return _scan(Path(path), offset)


def iter_entries(path: str | Path) -> Iterator[trace_pb2.TraceEntry]:
    """Every complete entry (headers, records, truncation markers) in file order."""
    for _, entry in _scan(Path(path)):
        yield entry


def _message_class(full_name: str) -> type[Message]:
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    except KeyError as exc:
        raise TraceError(f"trace holds a {full_name!r} message, which this vflnet does not define") from exc
    return message_factory.GetMessageClass(descriptor)


def record_to_event(record: trace_pb2.TraceRecord) -> WireEvent:
    """Rebuild the event a tap saw, with its message decoded."""
    message = _message_class(record.message_type)()
    try:
        message.ParseFromString(record.message)
    except DecodeError as exc:
        raise TraceError(
            f"record of {record.method} at {record.time}: bad {record.message_type}: {exc}"
        ) from exc
    return WireEvent(
        direction=record.direction,  # type: ignore[arg-type]
        side=record.side,  # type: ignore[arg-type]
        method=record.method,
        party=record.party,
        peer=record.peer,
        message=message,
        time=record.time,
    )


def read_trace(path: str | Path, step_blocks_ok: bool = False) -> Iterator[WireEvent]:
    """The events of a trace file in the order they were written (safe on a file still being written).
    A trace of only some steps (a header's ``step_blocks``: `vflnet bench goals`' A/B) is refused
    unless ``step_blocks_ok``: an attack or a score on it would take half the traffic for all of it."""
    for entry in iter_entries(path):
        kind = entry.WhichOneof("entry")
        if kind == "record":
            yield record_to_event(entry.record)
        elif kind == "header" and entry.header.step_blocks and not step_blocks_ok:
            raise TraceError(
                f"{path}: recorded only the steps of even blocks of {entry.header.step_blocks} (a "
                "benchmark's A/B of the tap, VFLNET_BENCH_TAP_BLOCKS): not the run's whole traffic"
            )


@dataclass
class TraceSummary:
    """What ``vflnet trace ls`` shows about one file."""

    path: Path
    size: int
    headers: list[trace_pb2.TraceHeader] = field(default_factory=list)
    records: int = 0
    methods: Counter[str] = field(default_factory=Counter)
    truncated: bool = False
    partial_tail: bool = False  # bytes after the last complete entry (being written, or a crash)
    first_time: float | None = None
    last_time: float | None = None


def summarize(path: str | Path) -> TraceSummary:
    path = Path(path)
    summary = TraceSummary(path=path, size=path.stat().st_size)
    end = 0
    for offset, entry in _scan(path):
        end = offset
        kind = entry.WhichOneof("entry")
        if kind == "header":
            summary.headers.append(entry.header)
        elif kind == "truncated":
            summary.truncated = True
        else:
            summary.records += 1
            summary.methods[entry.record.method.rsplit("/", 1)[-1]] += 1
            if summary.first_time is None:
                summary.first_time = entry.record.time
            summary.last_time = entry.record.time
    summary.partial_tail = end < summary.size
    return summary


class TraceWriter:
    """A tap that appends every event it sees to a trace file; thread-safe.

    Threads append at once: each record is one ``writev`` outside the writer's lock, which covers
    only its counts. ``size`` and ``records`` count the complete entries; :meth:`extent`, ``close()``
    and ``cut()`` first wait for the appends under way (new ones wait for them in turn), so what they
    see is the file as it is.

    ``max_bytes`` caps the file: the record that would cross it is dropped, a ``TraceTruncated``
    marker is written after the appends under way (the file may exceed the cap by at most that
    marker), a warning is logged once, and later records are only counted (``dropped``). ``close()``
    fsyncs.
    """

    def __init__(
        self,
        path: str | Path,
        party: str,
        run_id: str = "",
        max_bytes: int = DEFAULT_MAX_BYTES,
        step_blocks: int = 0,
    ) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"max_bytes must be at least {MIN_MAX_BYTES}, got {max_bytes}")
        self.path = Path(path)
        self.party = party
        self.run_id = run_id
        self.max_bytes = max_bytes
        self.records = 0  # records in the complete entries of ``size``
        self.dropped = 0
        self.truncated = False
        self.cut_short = False  # an entry was cut short (a full disk): nothing more may follow it
        self._lock = threading.Lock()
        # notified when the appends under way are done, and when nobody waits for that any more
        self._idle = threading.Condition(self._lock)
        self._writing = 0  # appends under way, outside the lock
        self._waiting = 0  # callers waiting for those to end
        self._closed_warned = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        complete = 0
        if self.path.exists():
            complete = max((end for end, _ in _scan(self.path)), default=0)
            size = self.path.stat().st_size
            if complete == 0 and size > 0:
                raise TraceError(f"{self.path} exists and is not a vflnet trace; refusing to append to it")
            if complete < size:
                log.warning("%s: dropping a partial last entry before appending", self.path)
                os.truncate(self.path, complete)
        self._fd: int | None = _open_append(self.path)
        self.size = complete  # bytes of the complete entries
        self._end = complete  # ``size`` and the appends under way: what the cap is checked against
        self._session = complete  # where this writer's own entries begin (its header first)
        # step_blocks: the records are those of even blocks of so many steps only (Chain's step_blocks)
        header = trace_pb2.TraceHeader(
            format_version=FORMAT_VERSION,
            run_id=run_id,
            party=party,
            created=time.time(),
            step_blocks=step_blocks,
        )
        try:
            self._append(trace_pb2.TraceEntry(header=header))
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise

    def _append(self, entry: trace_pb2.TraceEntry) -> None:
        """A header or a marker, holding the lock (no append is under way: see ``_drain``)."""
        assert self._fd is not None
        data = entry.SerializeToString()
        prefix = _varint(len(data))
        framed = len(prefix) + len(data)
        try:
            written = os.writev(self._fd, [prefix, data])
        except OSError as exc:
            raise self._not_written(exc) from exc
        if written != framed:
            if written:
                self._note_cut_short()
            raise self._short_write(written, framed)
        self.size += framed
        self._end += framed

    def _not_written(self, exc: OSError) -> WriteFailed:
        """A failed ``writev`` wrote nothing (the file is as it was): its error, naming the file."""
        return WriteFailed("the trace", self.path, exc)

    def _note_cut_short(self) -> None:
        """Holding the lock, after a short write (a full disk): part of an entry is in the file.
        Finishing it with a second write could put another thread's entry in between, so the trace
        takes no more records; a reader stops at the cut entry when it is the file's last."""
        if not self.cut_short:
            self.cut_short = True
            log.error("%s: an entry was cut short; later messages are not traced", self.path)

    def _short_write(self, written: int, framed: int) -> WriteFailed:
        why = f"{os.strerror(errno.ENOSPC)} (an entry cut short: {written} of {framed} bytes written)"
        return WriteFailed("the trace", self.path, OSError(errno.ENOSPC, why))

    def _drain(self) -> None:
        """Holding the lock: return once no append is under way (new ones wait meanwhile). The fd may
        have been closed while this waited."""
        self._waiting += 1
        try:
            self._idle.wait_for(lambda: not self._writing)
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._idle.notify_all()  # the appends that waited for this

    def __call__(self, event: WireEvent) -> None:
        self.write(event)
        return None

    def write(self, event: WireEvent) -> bool:
        """Append one event; False when it was dropped (the cap reached, the writer closed, or an entry
        cut short before)."""
        return self.write_record(*event.as_record())

    def write_record(
        self,
        direction: str,
        side: str,
        method: str,
        party: str,
        peer: str,
        message: Message,
        data: bytes | None,
        at: float,
    ) -> bool:
        """``write`` of an event's fields, for a tap that builds no event (``chain.Recorder``)."""
        # a record holds a whole message (tens of KB), and every copy of it is paid on the hot path of
        # the call being traced: the message's bytes go to the kernel as they are
        parts, framed = record_parts(direction, side, method, party, peer, message, data, at)
        with self._lock:
            if self._waiting:  # extent(), cut() or close() go first
                self._idle.wait_for(lambda: not self._waiting)
            if self._fd is None or self.truncated or self.cut_short:
                return self._drop(method)
            if self._end + framed + _MARKER_RESERVE > self.max_bytes:
                return self._truncate(method)
            fd = self._fd
            self._end += framed
            self._writing += 1
        # outside the lock: the two passive parties' messages reach the active party at once, and a
        # thread waiting on the lock while another is in the system call is put to sleep and woken
        # (measured: the active party found the lock taken at one write in eight)
        written = 0
        try:
            written = os.writev(fd, parts)
        except OSError as exc:
            raise self._not_written(exc) from exc
        finally:
            with self._lock:
                self._writing -= 1
                if written == framed:
                    self.size += framed
                    self.records += 1
                else:
                    self._end -= framed
                    if written:  # at once: no later append may follow the cut entry
                        self._note_cut_short()
                if self._waiting and not self._writing:
                    self._idle.notify_all()
        if written != framed:
            raise self._short_write(written, framed)
        return True

    def _drop(self, method: str) -> bool:
        """Holding the lock: a record of ``method`` not written (closed, capped, or cut short before)."""
        self.dropped += 1
        if self._fd is None and not self._closed_warned:
            self._closed_warned = True
            log.warning("%s: trace already closed; dropping %s", self.path, short_name(method))
        return False

    def _truncate(self, method: str) -> bool:
        """Holding the lock: a record of ``method`` would cross the cap. The marker goes after the
        appends under way, so no record follows it."""
        self.truncated = True
        self.dropped += 1
        self._drain()
        if self._fd is not None and self.truncated:  # not cut back meanwhile
            marker = trace_pb2.TraceTruncated(
                time=time.time(), max_bytes=self.max_bytes, first_dropped_method=method
            )
            self._append(trace_pb2.TraceEntry(truncated=marker))
        log.warning(
            "%s reached its cap of %d bytes after %d records; later messages are not traced",
            self.path,
            self.max_bytes,
            self.records,
        )
        return False

    def extent(self, sync: bool = False) -> tuple[int, int]:
        """(bytes, records) of the complete entries this writer knows of (a reopened file's earlier
        records are not counted), once the appends under way are done: what :meth:`cut` goes back
        to (an entry boundary). ``sync``: on disk first, for a checkpoint that records it (a host
        crash must not leave the trace shorter than a checkpoint says)."""
        with self._lock:
            self._drain()
            if sync and self._fd is not None:
                os.fsync(self._fd)
            return self.size, self.records

    def cut(self, size: int, records: int) -> None:
        """Go back to an earlier length of this trace (``size`` bytes holding ``records`` records): a
        resumed run repeats the steps after its checkpoint, and each message must appear once. A cut
        back into an earlier session keeps this writer's own entries (its header, the messages of the
        party's admission before it learnt the checkpoint; not a cap's marker): they move down to
        follow ``size``."""
        with self._lock:
            self._drain()
            if self._fd is None:
                raise ValueError(f"{self.path}: trace closed; it cannot be cut back to {size} bytes")
            if size > self.size:
                raise ValueError(
                    f"{self.path}: {self.size} bytes long, shorter than the {size} to cut back to"
                )
            ours, our_records = b"", 0
            if size <= self._session:
                ours, our_records = self._own_entries()
                self._session = size
            os.ftruncate(self._fd, size)  # appends (O_APPEND) continue at the new end
            self.size, self._end, self.records = size, size, records
            self.truncated = self.cut_short = False  # the marker and any cut entry lay past ``size``
            if ours:
                written = os.write(self._fd, ours)  # no append is under way: a short write is finished
                while written < len(ours):
                    written += os.write(self._fd, ours[written:])
                self.size = self._end = size + len(ours)
                self.records += our_records

    def _own_entries(self) -> tuple[bytes, int]:
        """This writer's entries but a cap's marker, as bytes, and how many records they hold."""
        with open(self.path, "rb") as f:  # the writer's own descriptor is write-only
            f.seek(self._session)
            ours = f.read(self.size - self._session)
        kept, records, start = [], 0, 0
        for end, entry in _entries(io.BytesIO(ours), self.path, first=False):  # a partial tail ends it
            kind = entry.WhichOneof("entry")
            if kind != "truncated":
                kept.append(ours[start:end])
                records += kind == "record"
            start = end
        return b"".join(kept), records

    def close(self) -> None:
        """Fsync and close: the trace survives a crash of the host once this returns. Idempotent."""
        with self._lock:
            self._drain()  # the descriptor is not closed under an append
            if self._fd is None:
                return
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        if self.dropped:
            log.info("%s: %d records, %d dropped", self.path, self.records, self.dropped)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TraceWriter({str(self.path)!r}, party={self.party!r}, max_bytes={self.max_bytes})"
