"""The file server of `rollflow server`: the files under the directory it was started in, read-only over HTTP on
127.0.0.1, so the links of a run's page in the Prefect UI open (a page served over http may not open file://).

What is served: GET and HEAD of regular files and directory listings under the root, nothing whose path has a
component starting with "." (.venv, .git, .env), nothing a symlink leads to outside the root or into a dot
component. Other methods get 405, requests whose Host header is not this server's address 403 (a DNS-rebinding
page cannot read the files).

`rollflow server` calls `serve_beside_prefect` and then execs `prefect server start`, so the process stays
Prefect's own (its output, its prompts, its signals and exit code). The file server runs in a forked process
that ends when that process ends. Once Prefect's API answers, it records itself in the Prefect Variable
`VARIABLE` ({"url": ..., "root": ...}), where a run's page finds it (`flows.run_page.find_file_server`).
"""

from __future__ import annotations

import html
import mimetypes
import os
import select
import shutil
import signal
import stat
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

VARIABLE = "rollflow-files"
HOST = "127.0.0.1"
# shown in the browser rather than downloaded
_TEXT = {".jsonl", ".log", ".yaml", ".yml", ".txt", ".md", ".py", ".toml", ".cfg", ".csv"}


class Refused(Exception):
    """A request the server does not answer with a file: the HTTP status and the reason it says."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def hidden(part: str) -> bool:
    """Whether a path component is never served: a dotfile or dot-dir (and "." / "..")."""
    return part.startswith(".")


def served_path(root: Path, path: Path) -> str | None:
    """The URL path ("a/b.txt", quoted) under which the server started at `root` serves `path`, or None when it
    would refuse it (outside the root once symlinks are resolved, or through a dot component). `root` is
    resolved."""
    try:
        rel = path.resolve().relative_to(root)
    except ValueError:
        return None
    if any(hidden(p) for p in rel.parts):
        return None
    return urllib.parse.quote("/".join(rel.parts))  # "" for the root itself


def resolve(root: Path, url_path: str) -> Path:
    """The real file or directory under `root` (resolved) that a request's path names; raises `Refused`."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url_path).path)
    if "\0" in path:
        raise Refused(HTTPStatus.BAD_REQUEST, "a NUL byte in the path")
    parts = [p for p in path.split("/") if p]
    if any(hidden(p) for p in parts):
        raise Refused(HTTPStatus.FORBIDDEN, "paths with a component starting with '.' are not served")
    try:
        real = root.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, or a symlink loop
        raise Refused(HTTPStatus.NOT_FOUND, "no such file") from None
    if served_path(root, real) is None:
        raise Refused(
            HTTPStatus.FORBIDDEN, "a symlink that leads outside the served directory or to a dotfile"
        )
    return real


class _Handler(BaseHTTPRequestHandler):
    server: FileServer
    server_version = "rollflow-files"

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _not_allowed(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the console of `rollflow server` is Prefect's."""

    def _answer(self, body: bool) -> None:
        try:
            if self.headers.get("Host") not in self.server.hosts:
                raise Refused(HTTPStatus.FORBIDDEN, f"Host must be one of {', '.join(self.server.hosts)}")
            real = resolve(self.server.root, self.path)
            if real.is_dir():
                self._listing(real, body)
            else:
                self._file(real, body)
        except Refused as e:
            self._refuse(e, body)

    def _refuse(self, e: Refused, body: bool) -> None:
        data = f"{e.status.value} {e.status.phrase}: {e}\n".encode()
        self._headers(e.status, "text/plain; charset=utf-8", len(data))
        if body:
            self.wfile.write(data)

    def _headers(self, status: HTTPStatus, content_type: str, length: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.send_header("Cache-Control", "no-cache")  # a run's files grow while it runs
        self.send_header("X-Content-Type-Options", "nosniff")
        # a served .html page (a `rollflow plot -o x.html`) runs in an opaque origin: it cannot read other files
        self.send_header("Content-Security-Policy", "sandbox allow-scripts")
        self.end_headers()

    def _file(self, real: Path, body: bool) -> None:
        try:
            # O_NOFOLLOW: a file swapped for a symlink since `resolve` is refused, not followed; O_NONBLOCK: opening
            # a FIFO does not wait for a writer (fstat then refuses it)
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            raise Refused(HTTPStatus.FORBIDDEN, "not readable") from None
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise Refused(HTTPStatus.FORBIDDEN, "not a regular file")
            self._headers(HTTPStatus.OK, _content_type(real), info.st_size)
            if body:
                shutil.copyfileobj(f, self.wfile)

    def _listing(self, real: Path, body: bool) -> None:
        if not urllib.parse.urlsplit(self.path).path.endswith("/"):  # relative links need the slash
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            # built from the resolved path, not the request's: "//host/dir" must not redirect to another host
            self.send_header("Location", f"/{served_path(self.server.root, real)}/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        try:
            entries = sorted(real.iterdir())
        except OSError:
            raise Refused(HTTPStatus.FORBIDDEN, "not readable") from None
        names = [
            entry.name + ("/" if entry.is_dir() else "")
            for entry in entries
            if served_path(self.server.root, entry) is not None
        ]
        rel = real.relative_to(self.server.root)
        title = html.escape("/" if rel == Path(".") else f"/{rel.as_posix()}/")
        items = "".join(f'<li><a href="{urllib.parse.quote(n)}">{html.escape(n)}</a></li>' for n in names)
        data = f"<!doctype html><title>{title}</title><h1>{title}</h1><ul>{items}</ul>\n".encode()
        self._headers(HTTPStatus.OK, "text/html; charset=utf-8", len(data))
        if body:
            self.wfile.write(data)


def _content_type(path: Path) -> str:
    if path.suffix in _TEXT:
        return "text/plain; charset=utf-8"
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"


class FileServer(ThreadingHTTPServer):
    """Serves the files under `root` (see the module docstring) on 127.0.0.1:`port` (0: a free port). Raises
    OSError when the port cannot be bound."""

    daemon_threads = True

    def __init__(self, root: str | Path, port: int) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise NotADirectoryError(f"the directory to serve is not a directory: {root}")
        super().__init__((HOST, port), _Handler)
        self.port = self.server_address[1]
        self.url = f"http://{HOST}:{self.port}"
        self.hosts = (f"{HOST}:{self.port}", f"localhost:{self.port}")

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Silent (socketserver prints a traceback): a browser that goes away mid-file is no error, and the
        console of `rollflow server` is Prefect's."""


def announcement(url: str, root: Path) -> dict[str, str]:
    """The value of the Variable `VARIABLE`: where the file server answers and which directory it serves."""
    return {"url": url, "root": str(root)}


def parse_announcement(value: Any) -> tuple[str, Path]:
    """(url, root) of a `VARIABLE` value; raises ValueError naming what is wrong with it."""
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("url"), str)
        or not isinstance(value.get("root"), str)
    ):
        raise ValueError(f'expected {{"url": "http://...", "root": "/abs/dir"}}, got {value!r}')
    url, root = value["url"].rstrip("/"), Path(value["root"])
    if urllib.parse.urlsplit(url).scheme not in ("http", "https") or not root.is_absolute():
        raise ValueError(f"expected an http(s) url and an absolute root, got {value!r}")
    return url, root


def serve_beside_prefect(api_port: int, files_port: int, root: str | Path) -> None:
    """For `rollflow server`, just before it execs Prefect's server on `api_port`: bind the file server of
    `root` on `files_port` (OSError when it cannot) and fork the process that runs it. That process starts
    serving once this one has exec'd: a pipe that the exec closes tells it. An exec that never happens, as in
    a test that fakes it, leaves it idle. It records the server in `VARIABLE` once the API answers. It ends
    when Prefect's server ends: this process keeps a pipe's write end open across the exec."""
    if files_port == api_port:
        raise ValueError(f"the file server needs a port of its own, not Prefect's ({api_port})")
    server = FileServer(root, files_port)
    prefect_gone, alive = os.pipe()
    execed, not_execed = os.pipe()  # both non-inheritable: `not_execed` closes with the exec
    if os.fork() == 0:
        os.close(alive)
        os.close(not_execed)
        code = 0
        try:
            _run_beside(server, api_port, execed, prefect_gone)
        except BaseException as e:
            print(f"rollflow: the file server stopped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            code = 1
        finally:
            os._exit(code)
    os.close(prefect_gone)
    os.close(execed)
    os.set_inheritable(alive, True)
    server.server_close()  # the child serves; this process's copy of the socket would outlive it in Prefect's


def _run_beside(server: FileServer, api_port: int, execed: int, prefect_gone: int) -> None:
    """The forked process: once the parent has exec'd Prefect's server, serve and announce once the API answers;
    return when Prefect's server has ended (each fd reads EOF at its event)."""
    # Ctrl-C reaches the whole process group: this process ends with Prefect's server, not before it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    select.select([execed], [], [])
    if select.select([prefect_gone], [], [], 0)[0]:  # the parent died instead of exec'ing
        return
    threading.Thread(target=server.serve_forever, daemon=True).start()
    announced = False
    while not select.select([prefect_gone], [], [], 0.5)[0]:
        if not announced and answers(f"http://{HOST}:{api_port}/api/health"):
            _announce(server, api_port)
            announced = True
    server.server_close()


def answers(url: str) -> bool:
    """Whether a GET of `url` gets a 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def _announce(server: FileServer, api_port: int) -> None:
    """Record the server in `VARIABLE` on the Prefect server at `api_port`, and say so (one line)."""
    os.environ["PREFECT_API_URL"] = f"http://{HOST}:{api_port}/api"  # this server, whatever the profile says
    try:
        from prefect.variables import Variable

        Variable.set(VARIABLE, announcement(server.url, server.root), overwrite=True)
    except Exception as e:
        print(
            f"rollflow: could not set the Prefect Variable {VARIABLE!r} ({type(e).__name__}: {e}); run pages "
            "will show file paths instead of links",
            file=sys.stderr,
            flush=True,
        )
        return
    print(
        f"rollflow: the files under {server.root} are served read-only at {server.url}/ "
        f"(the links of the run pages; Variable {VARIABLE!r})",
        flush=True,
    )
