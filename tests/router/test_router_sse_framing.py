"""The SSE framer relays a stream in whole events whatever the TCP fragmentation (property tests)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.router.relay import SseFramer

events = st.lists(
    st.binary(max_size=40).map(lambda b: b"data: " + b.replace(b"\n", b" ") + b"\n\n"), min_size=1, max_size=12
)


def fragments(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@given(events, st.lists(st.integers(min_value=0), max_size=20))
def test_output_is_the_input_and_every_forwarded_piece_ends_on_an_event_boundary(evs, cuts):
    stream = b"".join(evs)
    framer = SseFramer(max_hold=1 << 20)
    pieces = [framer.feed(f) for f in fragments(stream, cuts)]
    assert b"".join(pieces) + framer.flush() == stream
    assert all(p.endswith(b"\n\n") for p in pieces if p)


@given(events, st.lists(st.integers(min_value=0), max_size=20), st.integers(min_value=0))
def test_a_stream_cut_anywhere_forwards_only_complete_events(evs, cuts, cut_at):
    stream = b"".join(evs)
    broken = stream[: cut_at % (len(stream) + 1)]
    framer = SseFramer(max_hold=1 << 20)
    sent = b"".join(framer.feed(f) for f in fragments(broken, cuts))
    assert sent == b"" or sent.endswith(b"\n\n")
    assert stream.startswith(sent) and len(broken) - len(sent) < max(len(e) for e in evs)


def test_a_body_without_event_boundaries_is_not_held_back_past_the_bound():
    framer = SseFramer(max_hold=100)
    assert framer.feed(b"x" * 60) == b""
    assert framer.feed(b"y" * 60) == b"x" * 60 + b"y" * 60
