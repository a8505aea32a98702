"""The daemon's and the emulator's listening sockets: bound before anything starts, and a
socket that cannot be bound is told in words (``thoughtgate.listening``, ADR 0121)."""

from __future__ import annotations

import socket

import pytest

from thoughtgate.listening import ListenError, host_port, listen


def test_port_zero_binds_one_free_port_not_yet_listening() -> None:
    sockets = listen("127.0.0.1", 0)
    try:
        ((host, port),) = [s.getsockname()[:2] for s in sockets]
        assert host == "127.0.0.1" and port > 0
        with socket.socket() as probe:  # bound, not listening: a connection is refused
            assert probe.connect_ex((host, port)) != 0
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("192.0.2.1", "this machine has no such address"),  # TEST-NET-1: nobody's
        ("no-such-host.invalid", "'no-such-host.invalid' is not an address"),
    ],
)
def test_an_address_that_cannot_be_bound_is_named_with_why(host: str, says: str) -> None:
    with pytest.raises(ListenError) as caught:
        listen(host, 8765)
    assert str(caught.value).startswith(f"cannot listen on {host}:8765: {says}")


def test_a_port_in_use_is_named() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=r"the port is already in use"):
            listen("127.0.0.1", port)


def test_an_ipv6_address_is_written_in_brackets() -> None:
    assert host_port("::1", 8765) == "[::1]:8765"
    assert host_port("127.0.0.1", 8765) == "127.0.0.1:8765"
