"""`rollflow server --database-url`: which URLs it takes, that it hands them to Prefect's server, and that a
password never comes back in its output."""

from __future__ import annotations

import pytest

import flows.cli
from flows.cli import main, masked_url


@pytest.fixture
def execs(monkeypatch) -> list[list[str]]:
    """The argv `rollflow server` execs (nothing is exec'd; the tests start no file server beside it)."""
    seen: list[list[str]] = []

    def fake_execv(path, argv):  # exec never returns
        seen.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(flows.cli.os, "execv", fake_execv)
    for name in ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_UI_API_URL"):
        monkeypatch.setenv(name, "")  # restored after the test, which `main` sets them in
        monkeypatch.delenv(name)
    return seen


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:hunter2@db:5432/prefect",  # a driver Prefect's server cannot run on
        "postgres+asyncpg://bob:hunter2@db/prefect",
        "mysql+aiomysql://bob:hunter2@db/prefect",
        "bob:hunter2@db/prefect",
    ],
)
def test_a_url_prefect_cannot_use_is_refused_in_one_line_without_its_password(url, execs, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["server", "--files-port", "0", "--database-url", url])
    assert stopped.value.code == 2 and not execs
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if "--database-url" in x and "error" in x]
    assert "postgresql+asyncpg://" in line and "is not a database" in line
    assert "hunter2" not in err


def test_the_flag_sets_prefects_setting_and_prints_the_url_masked(execs, capsys, monkeypatch):
    url = "postgresql+asyncpg://bob:p@ss:w0rd@127.0.0.1:5432/prefect"
    with pytest.raises(SystemExit):
        main(["server", "--port", "4321", "--files-port", "0", "--database-url", url])
    assert len(execs) == 1
    assert flows.cli.os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == url
    err = capsys.readouterr().err
    assert "rollflow server: database postgresql+asyncpg://bob:***@127.0.0.1:5432/prefect" in err
    assert "w0rd" not in err and "p@ss" not in err


def test_prefects_own_setting_alone_still_chooses_the_database(execs, capsys, monkeypatch):
    url = "postgresql+asyncpg://bob:hunter2@db/prefect"
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", url)
    with pytest.raises(SystemExit):
        main(["server", "--files-port", "0"])
    assert len(execs) == 1 and flows.cli.os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == url
    assert "database postgresql+asyncpg://bob:***@db/prefect" in capsys.readouterr().err


def test_masked_url_keeps_everything_but_the_password():
    assert masked_url("sqlite+aiosqlite:////tmp/prefect.db") == "sqlite+aiosqlite:////tmp/prefect.db"
    assert masked_url("postgresql+asyncpg://bob@db/prefect") == "postgresql+asyncpg://bob@db/prefect"
    assert (
        masked_url("postgresql+asyncpg://bob:x@y@db:1/p?ssl=true")
        == "postgresql+asyncpg://bob:***@db:1/p?ssl=true"
    )
