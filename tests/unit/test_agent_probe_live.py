"""The pieces of a live connection's trace that read and write bytes: the TCP segment written
on the raw socket and the parser of ICMP errors, which sees every ICMP message the host gets."""
from __future__ import annotations

import socket
import struct

from hypothesis import given
from hypothesis import strategies as st

from c4.agent.probe import _checksum, parse_icmp_quote, tcp_segment


def _router_answer(packet: bytes, icmp_type: int, family: int) -> bytes:
    """What a router sends back, as a raw ICMP socket reads it: IPv4 with the outer IP header,
    the ICMP header (type, code, checksum, 4 unused bytes), the offending packet quoted."""
    icmp = struct.pack("!BBHI", icmp_type, 0, 0, 0) + packet[:68]
    if family == socket.AF_INET6:
        return icmp
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), 0, 0, 64, 1, 0,
                       socket.inet_aton("10.0.0.254"), socket.inet_aton("10.0.0.1")) + icmp


def test_segment_is_a_valid_tcp_ack_with_the_tuple_and_ttl() -> None:
    pkt = tcp_segment("10.0.0.1", "10.0.5.2", 41000, 29000, 0xDEADBEEF, 2)
    assert pkt[0] == 0x45 and pkt[8] == 2 and pkt[9] == socket.IPPROTO_TCP
    assert struct.unpack("!H", pkt[2:4])[0] == len(pkt) == 40
    tcp = pkt[20:]
    assert struct.unpack("!HHI", tcp[:8]) == (41000, 29000, 0xDEADBEEF)
    assert tcp[13] == 0x10  # ACK alone: no SYN that could open a connection
    pseudo = pkt[12:20] + struct.pack("!xBH", socket.IPPROTO_TCP, len(tcp))
    assert _checksum(pseudo + tcp) == 0  # a correct checksum sums to 0xffff
    pkt6 = tcp_segment("fd00::1", "fd00::5:2", 41000, 29000, 7, 3)
    assert pkt6[0] >> 4 == 6 and pkt6[6] == socket.IPPROTO_TCP and pkt6[7] == 3
    pseudo6 = pkt6[8:40] + struct.pack("!I3xB", 20, socket.IPPROTO_TCP)
    assert _checksum(pseudo6 + pkt6[40:]) == 0


def test_parser_returns_the_quoted_tuple_and_the_kind() -> None:
    for family, src, dst in ((socket.AF_INET, "10.0.0.1", "10.0.5.2"),
                             (socket.AF_INET6, "fd00::1", "fd00::5:2")):
        pkt = tcp_segment(src, dst, 41000, 29000, 123456, 2)
        exceeded = 11 if family == socket.AF_INET else 3
        got = parse_icmp_quote(family, _router_answer(pkt, exceeded, family), "r1")
        assert got is not None
        answer, quoted = got
        assert (answer.kind, answer.addr) == ("router", "r1")
        assert quoted == (src, dst, 41000, 29000, 123456)
        unreach = 3 if family == socket.AF_INET else 1
        got = parse_icmp_quote(family, _router_answer(pkt, unreach, family), "r1")
        assert got is not None and got[0].kind == "unreach"
        # an echo reply, or an error quoting UDP, is someone else's
        assert parse_icmp_quote(family, _router_answer(pkt, 0, family), "r1") is None
        udp = bytearray(pkt)
        udp[9 if family == socket.AF_INET else 6] = socket.IPPROTO_UDP
        assert parse_icmp_quote(family, _router_answer(bytes(udp), exceeded, family),
                                "r1") is None


@given(st.binary(max_size=120), st.sampled_from([socket.AF_INET, socket.AF_INET6]))
def test_parser_never_raises_on_any_bytes(data: bytes, family: int) -> None:
    got = parse_icmp_quote(family, data, "x")
    assert got is None or got[0].kind in ("router", "unreach")


def test_parser_rejects_truncated_quotes() -> None:
    pkt = tcp_segment("10.0.0.1", "10.0.5.2", 41000, 29000, 1, 2)
    whole = _router_answer(pkt, 11, socket.AF_INET)
    for cut in range(20 + 8 + 20 + 8):  # short of the quoted ports and sequence number
        assert parse_icmp_quote(socket.AF_INET, whole[:cut], "r1") is None
