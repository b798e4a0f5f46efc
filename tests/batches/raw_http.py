"""A raw HTTP/1.1 client for hostile-input tests: a head, then a body sent piece by piece
until the gateway answers or stops reading (what a client library would never send)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

from tests.gateway.gateway_harness import Reply


def send_until_answered(
    port: int, head: bytes, chunks: Iterator[bytes], *, wait_s: float = 30.0
) -> tuple[Reply, int]:
    """Send ``head`` then ``chunks`` until the server answers or stops reading; the answer
    and how many body bytes were sent. A reader thread collects the answer meanwhile."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    received = bytearray()
    answered = threading.Event()

    def read() -> None:
        try:
            while data := sock.recv(65536):
                received.extend(data)
                if b"\r\n\r\n" in received:
                    answered.set()
        except OSError:
            pass
        answered.set()

    reader = threading.Thread(target=read, daemon=True)
    sent = 0
    try:
        sock.sendall(head)
        reader.start()
        sock.settimeout(5)
        for chunk in chunks:
            if answered.is_set():
                break
            try:
                sock.sendall(chunk)
            except OSError:
                break
            sent += len(chunk)
        assert answered.wait(wait_s), "no answer"
        time.sleep(0.2)
        sock.shutdown(socket.SHUT_WR)
        reader.join(10)
    finally:
        sock.close()
    head_bytes, _, body = bytes(received).partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        size, _, rest = body.partition(b"\r\n")
        body = rest[: int(size, 16)]
    return Reply(status, headers, body), sent
