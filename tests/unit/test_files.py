"""The file server of `rollflow server` (flows/files.py): it serves the regular files under its root over GET and
HEAD, and nothing else."""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.files import FileServer, parse_announcement, serve_beside_prefect, served_path

SECRET = "token-outside-the-root"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ with a run's files, dot files and symlinks, beside a secret outside it."""
    (tmp_path / "secret.txt").write_text(SECRET)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "key").write_text(SECRET)
    root = tmp_path / "root"
    (root / "runs" / "a" / "rollouts").mkdir(parents=True)
    (root / "runs" / "a" / "metrics.jsonl").write_text('{"kind": "rollout"}\n')
    (root / "runs" / "a" / "rollouts" / "rollout_000000.parquet").write_bytes(b"PAR1\x00PAR1")
    (root / ".env").write_text(SECRET)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text(SECRET)
    (root / "runs" / "a" / ".hidden").write_text(SECRET)
    (root / "escape").symlink_to(tmp_path / "secret.txt")
    (root / "escape-dir").symlink_to(tmp_path / "outside")
    (root / "to-dotfile").symlink_to(root / ".env")
    (root / "latest").symlink_to(root / "runs" / "a")  # inside the root: served
    os.mkfifo(root / "fifo")
    return root


@pytest.fixture
def server(tree: Path) -> Iterator[FileServer]:
    srv = FileServer(tree, 0)
    # shutdown() waits for serve_forever's next poll: a short one keeps each test's teardown short
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def request(
    srv: FileServer, path: str, method: str = "GET", host: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a raw request: the path is sent as given, `..` and all."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.putrequest(method, path, skip_host=True)
    conn.putheader("Host", host or f"127.0.0.1:{srv.port}")
    conn.endheaders()
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), body


def test_serves_a_file_over_get_and_head_on_loopback(server):
    assert server.server_address[0] == "127.0.0.1" and server.url == f"http://127.0.0.1:{server.port}"
    status, headers, body = request(server, "/runs/a/metrics.jsonl")
    assert (status, body) == (200, b'{"kind": "rollout"}\n')
    assert headers["Content-Type"] == "text/plain; charset=utf-8" and headers["Content-Length"] == str(
        len(body)
    )
    status, headers, body = request(server, "/runs/a/metrics.jsonl", "HEAD")
    assert (status, body, headers["Content-Length"]) == (200, b"", "20")
    status, headers, body = request(server, "/runs/a/rollouts/rollout_000000.parquet")
    assert (status, body, headers["Content-Type"]) == (200, b"PAR1\x00PAR1", "application/octet-stream")
    assert (
        request(server, "/latest/metrics.jsonl")[2] == b'{"kind": "rollout"}\n'
    )  # a symlink inside the root
    assert request(server, "/runs/a/nothing.txt")[0] == 404


@pytest.mark.parametrize(
    "path",
    ["/../secret.txt", "/runs/../../secret.txt", "/%2e%2e/secret.txt", "/runs/%2E%2E/%2e%2e/outside/key"],
)
def test_refuses_parent_directories(server, path):
    status, _, body = request(server, path)
    assert status == 403 and SECRET.encode() not in body


@pytest.mark.parametrize("path", ["/.env", "/.git/config", "/.git/", "/runs/a/.hidden", "/runs/a/%2Ehidden"])
def test_refuses_dotfiles_and_dot_dirs(server, path):
    status, _, body = request(server, path)
    assert status == 403 and SECRET.encode() not in body


@pytest.mark.parametrize("path", ["/escape", "/escape-dir/key", "/escape-dir/", "/to-dotfile"])
def test_refuses_symlinks_that_leave_the_root_or_reach_a_dotfile(server, path):
    status, _, body = request(server, path)
    assert status == 403 and SECRET.encode() not in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_refuses_methods_other_than_get_and_head(server, tree, method):
    status, headers, _ = request(server, "/runs/a/metrics.jsonl", method)
    assert (status, headers["Allow"]) == (405, "GET, HEAD")
    assert (tree / "runs" / "a" / "metrics.jsonl").read_text() == '{"kind": "rollout"}\n'


def test_refuses_other_hosts_and_non_regular_files(server):
    status, _, body = request(server, "/runs/a/metrics.jsonl", host="evil.example:80")  # a DNS-rebinding page
    assert status == 403 and b"rollout" not in body
    assert request(server, "/runs/a/metrics.jsonl", host=f"localhost:{server.port}")[0] == 200
    assert request(server, "/fifo")[0] == 403  # answered at once: the open does not wait for a writer


def test_lists_directories_under_the_root_without_dotfiles_or_escapes(server):
    status, headers, _ = request(server, "/runs/a")
    assert (status, headers["Location"]) == (301, "/runs/a/")
    status, headers, _ = request(server, "//runs")  # as a browser reads it: //runs/ is the host "runs"
    assert (status, headers["Location"]) == (301, "/runs/")
    status, headers, body = request(server, "/runs/a/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'href="metrics.jsonl"' in body and b'href="rollouts/"' in body and b"hidden" not in body
    _, _, body = request(server, "/")
    assert b'href="runs/"' in body and b'href="latest/"' in body
    assert all(name not in body for name in (b".env", b".git", b"escape", b"to-dotfile"))


def test_served_path_is_the_servers_rule(tree):
    root = tree.resolve()
    assert served_path(root, tree / "runs" / "a" / "metrics.jsonl") == "runs/a/metrics.jsonl"
    assert served_path(root, tree / "runs" / "a b#1.txt") == "runs/a%20b%231.txt"
    assert served_path(root, tree / "runs" / "not-yet.png") == "runs/not-yet.png"  # a file to come
    assert served_path(root, tree) == ""
    assert served_path(root, tree.parent / "secret.txt") is None
    assert served_path(root, tree / "escape") is None
    assert served_path(root, tree / ".git" / "config") is None


def test_announcement_and_bad_ports_are_refused_with_the_reason(tree):
    assert parse_announcement({"url": "http://127.0.0.1:4201/", "root": "/w"}) == (
        "http://127.0.0.1:4201",
        Path("/w"),
    )
    with pytest.raises(ValueError, match="expected"):
        parse_announcement("http://127.0.0.1:4201")
    with pytest.raises(ValueError, match="absolute root"):
        parse_announcement({"url": "http://127.0.0.1:4201", "root": "runs"})
    with pytest.raises(ValueError, match="not Prefect's"):
        serve_beside_prefect(4200, 4200, tree)
    with pytest.raises(NotADirectoryError, match="not a directory"):
        FileServer(tree / "runs" / "a" / "metrics.jsonl", 0)
