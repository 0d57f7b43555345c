"""Tests and benchmarks reach loopback only (127.0.0.0/8, ::1): never another address, not even an
"unroutable" one as a bad input. A source scan finds any other IPv4 literal, or a host other than
loopback handed to a connection; conftest.py's guard refuses and reports such a connection at run
time in the test process."""
import ipaddress
import re
import socket
from pathlib import Path

import pytest

from conftest import is_loopback_address, loopback_only

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "benchmarks", "scripts", "examples", "notebooks", ".ci")
SUFFIXES = {".py", ".sh", ".ipynb", ".yml", ".toml", ""}
IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w.])")
# a host literal handed to a connection: connect(("host", ...)), create_connection(("host", ...)),
# tcp://host:port, MASTER_ADDR=host / --master-addr host
CONNECTION_HOST = re.compile(
    r"""(?:connect(?:_ex)?|create_connection)\(\(\s*["']([^"']+)["']"""
    r"""|tcp://([^:/"'\s{}]+)"""
    r"""|MASTER_ADDR["']?\s*[:=]\s*["']?([^"'\s,}]+)"""
    r"""|--master-addr["']?,?\s*["']([^"']+)["']""")


def _dotted(*parts: int) -> str:
    """An IPv4 address other than loopback, built here rather than written out: the scan's own test
    input and the guard's refused address, which nothing connects to (the guard refuses it, the
    socket's connect is replaced), stay out of the sources the scans read."""
    return ".".join(map(str, parts))


PRIVATE, DOCUMENTATION, OTHER_PRIVATE = _dotted(10, 255, 255, 1), _dotted(192, 0, 2, 1), _dotted(10, 0, 0, 2)


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _sources():
    """Every source file of the scanned folders but this one, whose examples of what the scan finds
    are strings that nothing connects to."""
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*")):
            if (path.is_file() and path.suffix in SUFFIXES and "results" not in path.parts
                    and path != Path(__file__).resolve()):
                yield path


def _offending(text: str) -> list[str]:
    found = [m.group(1) for m in IPV4.finditer(text)
             if all(0 <= int(part) <= 255 for part in m.group(1).split(".")) and not _is_loopback(m.group(1))]
    for match in CONNECTION_HOST.finditer(text):
        host = next(group for group in match.groups() if group is not None)
        if not host.startswith(("$", "{")) and not _is_loopback(host):
            found.append(host)
    return found


def test_no_test_or_benchmark_source_names_an_address_other_than_loopback():
    offending = {str(path.relative_to(REPO)): hosts for path in _sources()
                 if (hosts := _offending(path.read_text(errors="replace")))}
    assert not offending, f"addresses other than loopback: {offending}"


@pytest.mark.parametrize("text", [
    f'socket.create_connection(("{PRIVATE}", 6379))', f'address = "{_dotted(192, 168, 0, 7)}:6379"',
    "init_method='tcp://example.org:29500'", '--master-addr", "node1"', f'env["MASTER_ADDR"] = "{OTHER_PRIVATE}"'])
def test_the_scan_finds_an_address_other_than_loopback(text):
    assert _offending(text)


@pytest.mark.parametrize("text", [
    'socket.create_connection(("127.0.0.1", port))', "init_method=f'tcp://127.0.0.1:{port}'",
    '"MASTER_ADDR": "127.0.0.1"', 'torch==2.14.1', 'version 1.2.3', '"--master-addr", "127.0.0.2"'])
def test_the_scan_passes_loopback_and_version_numbers(text):
    assert not _offending(text)


def test_the_guard_refuses_a_connection_other_than_loopback_before_the_socket_sees_it(monkeypatch):
    reached = []
    monkeypatch.setattr(socket.socket, "connect", lambda sock, address: reached.append(address))
    monkeypatch.setattr(socket.socket, "connect_ex", lambda sock, address: reached.append(address) or 0)
    with loopback_only() as refused, socket.socket() as sock:
        with pytest.raises(ConnectionRefusedError, match="loopback only"):
            sock.connect((DOCUMENTATION, 9))
        assert sock.connect_ex(("example.org", 80)) != 0
        sock.connect(("127.0.0.5", 9))
    assert refused == [(DOCUMENTATION, 9), ("example.org", 80)] and reached == [("127.0.0.5", 9)]


@pytest.mark.parametrize("address, loopback", [
    (("127.0.0.1", 1), True), (("127.255.0.3", 1), True), (("::1", 1, 0, 0), True), (("::ffff:127.0.0.1", 1), True),
    (("localhost", 1), True), ("/tmp/a.sock", True), ((PRIVATE, 1), False), ((f"::ffff:{DOCUMENTATION}", 1), False),
    (("huggingface.co", 443), False)])
def test_loopback_is_told_from_every_other_address(address, loopback):
    assert is_loopback_address(address) is loopback


def test_the_guard_lets_loopback_through():
    with loopback_only() as refused, socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
    assert refused == []
