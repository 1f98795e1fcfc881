"""The first-use download of the Inception weights, against stand-in servers on the loopback: a right file is
kept (and later runs read the cache, no network), a wrong hash, a refused connection, a server that stalls or
trickles, a cut-off body and an HTTP error are each one line, end within the configured bounds, and leave
nothing in the cache."""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

import gan_accel.eval.inception as inception
import gan_accel.eval.weights as weights
from gan_accel.eval.inception import WEIGHTS, WEIGHTS_ENV, WEIGHTS_FILE, InceptionUnavailable
from gan_accel.eval.random_features import INCEPTION_NAME, NAME, choose_features
from gan_accel.eval.weights import WeightsFile

PAYLOAD = bytes(range(256)) * 64 + b"stand-in weights"  # 16 KiB: several reads, one hash
PREFIX = hashlib.sha256(PAYLOAD).hexdigest()[:8]
fetch_weights = WEIGHTS.fetch


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """Loopback only: a proxy from the environment must not carry the stand-in requests elsewhere."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "*")


@pytest.fixture
def serve():
    """serve(handle) -> a loopback URL whose GET requests ``handle(request_handler)`` answers; shut down after."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(handle: Callable[[http.server.BaseHTTPRequestHandler], None]) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    handle(self)
                except OSError:
                    pass  # the client gave up first: what the slow servers are for

            def log_message(self, *args) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/{WEIGHTS_FILE}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def send(body: bytes, length: int | None = None, status: int = 200, pause: float = 0.0, step: int = 0):
    """A handler sending ``body`` (announcing ``length`` bytes), ``step`` bytes at a time with ``pause`` between."""

    def handle(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(status)
        request.send_header("Content-Length", str(len(body) if length is None else length))
        request.end_headers()
        for start in range(0, len(body), step or len(body) or 1):
            request.wfile.write(body[start:start + (step or len(body))])
            request.wfile.flush()
            time.sleep(pause)

    return handle


def cache_listing(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir()) if dest.parent.exists() else []


def failed_fetch(dest: Path, url: str, **kwargs) -> tuple[str, float]:
    """The one-line message and the seconds a failing fetch took; nothing may be left beside ``dest``."""
    before = cache_listing(dest)
    started = time.monotonic()
    with pytest.raises(InceptionUnavailable) as info:
        fetch_weights(dest, url, progress=False, **kwargs)
    seconds = time.monotonic() - started
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    assert dest.name in message and str(dest.parent) in message and WEIGHTS_ENV in message
    assert not dest.exists() and cache_listing(dest) == before  # no partial or refused file kept
    return message, seconds


def test_right_file_is_kept_with_a_bar(serve, tmp_path, capsys):
    dest = tmp_path / "hub" / "checkpoints" / WEIGHTS_FILE
    url = serve(send(PAYLOAD, step=4096))
    assert fetch_weights(dest, url, sha256_prefix=PREFIX, timeout=5) == dest
    assert dest.read_bytes() == PAYLOAD and cache_listing(dest) == [WEIGHTS_FILE]
    err = capsys.readouterr().err
    assert f"downloading {WEIGHTS_FILE}" in err and str(dest.parent) in err  # the line and tqdm's bar
    assert "16.0k/16.0k" in err  # the bar reached the announced size


def test_wrong_hash_is_refused(serve, tmp_path):
    dest = tmp_path / "checkpoints" / WEIGHTS_FILE
    message, seconds = failed_fetch(dest, serve(send(PAYLOAD)), sha256_prefix="00000000", timeout=5)
    assert f"starts {PREFIX}, not 00000000" in message and seconds < 5
    # by default the hash is the one in the file's name (torch hub's convention), which these bytes lack
    message, _ = failed_fetch(dest, serve(send(PAYLOAD)), timeout=5)
    assert "not 6726825d" in message


def test_refused_connection_is_fast(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    message, seconds = failed_fetch(tmp_path / WEIGHTS_FILE, f"http://127.0.0.1:{port}/x", sha256_prefix=PREFIX,
                                    timeout=5)
    assert "refused" in message.lower() and seconds < 2


def test_offline_machine_is_named(monkeypatch, tmp_path):
    def no_dns(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)  # what a machine without a network answers
    message, seconds = failed_fetch(tmp_path / WEIGHTS_FILE, "https://weights.example/w.pth", sha256_prefix=PREFIX)
    assert "cannot look up weights.example" in message and "offline" in message and seconds < 2


def test_server_that_never_answers_ends_at_the_timeout(tmp_path):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/{WEIGHTS_FILE}"
        message, seconds = failed_fetch(tmp_path / WEIGHTS_FILE, url, sha256_prefix=PREFIX, timeout=0.5)
    assert "no answer within 0.5 s" in message and 0.4 < seconds < 3


def test_server_that_stalls_mid_file_ends_at_the_timeout(serve, tmp_path):
    url = serve(send(PAYLOAD[:1000], length=len(PAYLOAD), pause=10))  # a part, then silence
    message, seconds = failed_fetch(tmp_path / WEIGHTS_FILE, url, sha256_prefix=PREFIX, timeout=0.5)
    assert "no answer within 0.5 s" in message and 0.4 < seconds < 3


def test_server_that_trickles_ends_at_the_limit(serve, tmp_path):
    url = serve(send(PAYLOAD, step=16, pause=0.05))  # always a byte before the timeout, never done
    message, seconds = failed_fetch(tmp_path / WEIGHTS_FILE, url, sha256_prefix=PREFIX, timeout=2, limit=0.5)
    assert "took longer than 0.5 s" in message and 0.4 < seconds < 3


def test_cut_off_body_and_http_error(serve, tmp_path):
    dest = tmp_path / WEIGHTS_FILE
    # Both servers answer at once; the generous wait only keeps a busy machine from reading as a silent server.
    message, _ = failed_fetch(dest, serve(send(PAYLOAD[:500], length=1000)), sha256_prefix=PREFIX, timeout=30)
    assert "500 of 1000 bytes" in message, message
    message, _ = failed_fetch(dest, serve(send(b"gone", status=404)), sha256_prefix=PREFIX, timeout=30)
    assert "HTTP 404" in message, message


def test_what_a_killed_download_left_is_cleared(serve, tmp_path):
    dest = tmp_path / WEIGHTS_FILE
    old, fresh = tmp_path / f".{WEIGHTS_FILE}.host.1.tmp", tmp_path / f".{WEIGHTS_FILE}.host.2.tmp"
    old.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    fetch_weights(dest, serve(send(PAYLOAD)), sha256_prefix=PREFIX, timeout=5, progress=False)
    assert not old.exists() and fresh.exists()  # a fresh one may be another process's live download


class StandIn(nn.Module):
    def __init__(self, weights: str, features_list: list[str]) -> None:
        super().__init__()
        self.weights = weights

    def forward(self, x: torch.Tensor):
        pooled = x.float().mean(dim=(2, 3))
        return pooled.repeat(1, 683)[:, :2048], pooled


def test_first_use_downloads_then_later_runs_read_the_cache(serve, monkeypatch, tmp_path):
    """choose_features("auto") end to end: fetched into torch hub's cache once, then used with no network;
    offline it falls back to the random network in one line that names the file, the folder and the variable."""
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    cached = Path(torch.hub.get_dir()) / "checkpoints" / WEIGHTS_FILE
    assert str(cached).startswith(str(tmp_path))
    monkeypatch.setattr(inception, "_inception_class", lambda: StandIn)  # torch-fidelity "installed"
    monkeypatch.setattr(inception, "_torch_fidelity_backend", StandIn)
    real_fetch = WeightsFile.fetch
    calls: list[str] = []

    def fetch(self, dest, **kwargs):
        calls.append(str(dest))
        return real_fetch(self, dest, **{**kwargs, "progress": False})

    def serve_from(url: str) -> None:  # the stand-in's hash is what the cache is held to
        monkeypatch.setattr(inception, "WEIGHTS", replace(WEIGHTS, url=url, sha256=hashlib.sha256(PAYLOAD).hexdigest()))

    monkeypatch.setattr(WeightsFile, "fetch", fetch)
    monkeypatch.setattr(weights, "FETCH_TIMEOUT", 1.0)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    serve_from(f"http://127.0.0.1:{port}/{WEIGHTS_FILE}")
    logged: list[str] = []
    _, logits, space = choose_features("auto", "cpu", logged.append)
    assert space == NAME and logits is None and len(logged) == 1 and "\n" not in logged[0]
    assert WEIGHTS_FILE in logged[0] and str(cached.parent) in logged[0] and WEIGHTS_ENV in logged[0]
    with pytest.raises(InceptionUnavailable):
        choose_features("inception", "cpu", logged.append)
    assert not cached.parent.exists() or cache_listing(cached) == []

    serve_from(serve(send(PAYLOAD)))
    net, logits, space = choose_features("auto", "cpu", logged.append)
    assert space == INCEPTION_NAME and logits is not None and net.net.weights == str(cached)
    assert cached.read_bytes() == PAYLOAD and len(logged) == 1  # no line when Inception loads
    serve_from("http://127.0.0.1:9/unreachable")
    calls.clear()
    net, _, space = choose_features("auto", "cpu", logged.append)
    assert space == INCEPTION_NAME and calls == [] and net.net.weights == str(cached)  # the cache, no network
