"""ChunkSizes: the sizes a chunked body's size lines announce, read in whatever pieces the
body arrives, so the reader can refuse an over-large chunk when its size line arrives."""

from __future__ import annotations

import pytest

from serval.server.http.chunks import ChunkSizes

pytestmark = pytest.mark.unit

BODY = b"5\r\nhello\r\n1a;ext=1\r\n" + b"x" * 26 + b"\r\n0\r\ntrailer: t\r\n\r\n"


def _fed(pieces: list[bytes]) -> tuple[list[int], bool]:
    sizes = ChunkSizes()
    sizes.start()
    return [sizes.feed(piece) for piece in pieces], sizes.active


def test_sizes_add_up_as_their_lines_arrive() -> None:
    assert _fed([BODY]) == ([5 + 26], False)  # the last chunk stops it


@pytest.mark.parametrize("step", [1, 2, 3, 7, 11])
def test_any_split_of_the_body_reads_the_same_sizes(step: int) -> None:
    announced, active = _fed([BODY[i:i + step] for i in range(0, len(BODY), step)])
    assert announced[-1] == 31 and not active
    assert announced[BODY.index(b"1a;") // step] == 5  # the second size not yet read


def test_a_huge_size_is_known_before_any_of_its_data() -> None:
    announced, active = _fed([b"ffffffffff\r\n"])
    assert announced == [0xFFFFFFFFFF] and active


def test_a_line_that_is_no_size_stops_it_for_the_parser_to_refuse() -> None:
    assert _fed([b"zz\r\n" + b"ff" * 10]) == ([0], False)
    assert _fed([b"5" + b";" * 2000]) == ([0], False)  # no line end within its bound
