"""HTTP/1.1 and the body: authorization and the receive budget are settled before a byte of
it is read, and `100 Continue` is sent only once they pass."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import RunningServer
from tests.security.conftest import closed_within, connect, watch
from tests.security.http1_helpers import (
    BODY,
    Factory,
    create_token,
    read_until,
    send_until_refused,
    short_server,
    statuses,
)

pytestmark = pytest.mark.integration
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def secured(server_factory: Factory,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[RunningServer, str]:
    """Auth on; bodies up to 256 MiB each but 100 MiB held at once."""
    root = tmp_path_factory.mktemp("http1-auth")
    tokens = root.parent / f"{root.name}-tokens.yaml"
    token = create_token(tokens, "infer:linear")
    server = short_server(server_factory, root, "--auth-tokens", str(tokens),
                          "--max-request-mb", "256", "--receive-budget-mb", "100")
    return server, token


def _head(length: int, token: str = "", expect: bool = False) -> bytes:
    return (b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
            % length + (b"Authorization: Bearer %s\r\n" % token.encode() if token else b"")
            + (b"Expect: 100-continue\r\n" if expect else b"") + b"\r\n")


def test_tokenless_199_mib_bodies_get_401_before_they_are_read(
        secured: tuple[RunningServer, str]) -> None:
    server, token = secured
    answers: list[bytes] = []

    sent: list[int] = []

    def attack() -> None:  # push the whole body; the answer arrives meanwhile
        with connect(server.port) as sock:
            sender = threading.Thread(target=lambda: sent.append(send_until_refused(
                sock, _head(199 * MIB), b"0", 199 * MIB)))
            sender.start()
            answers.append(closed_within(sock, 10.0))
            sender.join(timeout=15)

    with watch(server, token=token) as result:
        started = time.monotonic()
        attackers = [threading.Thread(target=attack) for _ in range(4)]
        for thread in attackers:
            thread.start()
        for thread in attackers:
            thread.join(timeout=20)
        attack_s = time.monotonic() - started
    assert len(answers) == 4 and all(statuses(answer) == [401] for answer in answers)
    result.assert_held(max_growth_mib=50)
    print(f"tokenless 4 x 199 MiB: {sum(sent) / MIB:.0f} MiB sent, RSS "
          f"+{result.growth_mib:.0f} MiB in {attack_s:.2f} s, good clients "
          f"{[round(c.worst_s, 3) for c in result.clients]} s")


def test_100_continue_only_after_authorization(secured: tuple[RunningServer, str]) -> None:
    server, token = secured
    with connect(server.port) as sock:  # no token: 401, never 100
        sock.sendall(_head(len(BODY), expect=True))
        answer = closed_within(sock, 5.0)
    assert statuses(answer) == [401] and b"www-authenticate: Bearer" in answer
    with connect(server.port) as sock:  # a token: 100, then the answer
        sock.sendall(_head(len(BODY), token, expect=True))
        assert statuses(read_until(sock, lambda got: b"\r\n\r\n" in got)) == [100]
        sock.sendall(BODY)
        assert statuses(read_until(sock, lambda got: b'"outputs"' in got)) == [200]


def test_a_body_beyond_the_receive_budget_gets_429_before_it_is_read(
        secured: tuple[RunningServer, str]) -> None:
    server, token = secured
    with connect(server.port) as sock:
        sock.sendall(_head(150 * MIB, token, expect=True))
        answer = closed_within(sock, 5.0)
    assert statuses(answer) == [429]
    assert b"retry-after: 1" in answer and b"--receive-budget-mb" in answer
    with connect(server.port) as sock:  # the refused request left nothing reserved
        sock.sendall(_head(len(BODY), token) + BODY)
        assert statuses(read_until(sock, lambda got: b'"outputs"' in got)) == [200]


def test_a_bodiless_request_without_a_token_keeps_its_connection(
        secured: tuple[RunningServer, str]) -> None:
    server, _ = secured
    with connect(server.port) as sock:
        for _ in range(2):
            sock.sendall(b"GET /v2/models/linear HTTP/1.1\r\nHost: t\r\n\r\n")
            answer = read_until(sock, lambda got: got.endswith(b"}"))
            assert statuses(answer) == [401] and b"connection: close" not in answer
