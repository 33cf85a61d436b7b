"""kafka-python's TCP connections reading larger pieces of their sockets (runtime/fetch.py ``larger_socket_reads``)."""

from __future__ import annotations

import socket

import kafka.errors as Errors
from kafka.net.transport import KafkaTCPTransport

from streamdedup.runtime.fetch import SOCKET_READ_BYTES, _sock_recv, larger_socket_reads


class _Held:
    """What ``_sock_recv`` needs of a transport: its socket."""

    def __init__(self, sock):
        self._sock = sock


def _pair():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.settimeout(5)  # a send the pair's buffers cannot hold fails instead of waiting for good
    return ours, theirs


def test_a_read_takes_everything_the_socket_holds_in_few_calls_and_the_same_bytes():
    ours, theirs = _pair()
    sent = bytes(range(256)) * 400  # 102,400 bytes, within the pair's buffers: 25 reads of 4 KB, one or two of ours
    theirs.sendall(sent)
    calls = []

    class Counted:
        def recv(self, size):
            calls.append(size)
            return ours.recv(size)

    got = b""
    for _ in range(10):
        data, err = _sock_recv(_Held(Counted()))
        assert err is None
        got += data
        if len(got) == len(sent):
            break
    assert got == sent
    assert set(calls) == {SOCKET_READ_BYTES}
    assert len(calls) < len(sent) // 4096
    ours.close(), theirs.close()


def test_a_closed_peer_is_a_connection_error_after_the_bytes_it_sent():
    ours, theirs = _pair()
    theirs.sendall(b"last words")
    theirs.close()
    data, err = _sock_recv(_Held(ours))
    assert data == b"last words"
    assert isinstance(err, Errors.KafkaConnectionError)
    ours.close()


def test_nothing_to_read_is_no_bytes_and_no_error():
    ours, theirs = _pair()
    assert _sock_recv(_Held(ours)) == (b"", None)
    ours.close(), theirs.close()


def test_the_tcp_transport_reads_so_once_installed():
    assert larger_socket_reads()
    assert KafkaTCPTransport._sock_recv is _sock_recv


def _their_read(self, nbytes=None):
    """kafka-python 3.0.12's ``KafkaBytes.read``, as it is written there."""
    if nbytes is None:
        nbytes = len(self) - self._idx
    start = self._idx
    self._idx += nbytes
    if self._idx > len(self):
        self._idx = len(self)
    return bytes(self[start:self._idx])


def test_a_frame_reads_as_kafka_pythons_own_in_one_copy():
    """``KafkaBytes.read`` through a memoryview: the same bytes and position as kafka-python's, for every way it
    is read (a count, past the end, the rest), and bytes, not a view, so the frame can be let go."""
    from kafka.protocol.frame import KafkaBytes

    from streamdedup.runtime.fetch import _frame_read, frames_read_in_one_copy

    frame = bytes(range(256)) * 3
    for steps in ([4, 0, 100, None], [700, 200, 5], [None, 3], [768, None]):
        ours, theirs = KafkaBytes(len(frame)), KafkaBytes(len(frame))
        ours.write(frame), theirs.write(frame)
        ours.seek(0), theirs.seek(0)
        for n in steps:
            got = _frame_read(ours, n)
            assert type(got) is bytes
            assert got == _their_read(theirs, n)
            assert ours.tell() == theirs.tell()
    assert _frame_read(KafkaBytes(0)) == b""
    assert frames_read_in_one_copy()
    assert KafkaBytes.read is _frame_read
