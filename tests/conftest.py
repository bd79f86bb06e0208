"""Session fixtures: one Ray session and one Prefect test server for the whole test run.

PREFECT_HOME lives in a temp dir (tests never touch ~/.prefect), analytics are off, the ephemeral
server gets a generous start-up timeout (20 s is too short on 2 busy cores), Ray's token auth is
on with a token of the session's own, and its temp dir is a short path of our own.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_TMP = Path(tempfile.mkdtemp(prefix="rf-test-"))
os.environ["PREFECT_HOME"] = str(_TMP / "prefect")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
# Ray's workers report their timeline events every this many ms (default 1000): a run kills its actors soon after
# their last calls, which reach the timeline (tests/e2e/test_spans.py) only if reported before that
os.environ.setdefault("RAY_task_events_report_interval_ms", "100")

from flows.cli import configure_prefect_env, configure_ray_env  # noqa: E402

configure_prefect_env()  # analytics off, batched event writes: as `rollflow run`
# the session's test server is shared with the runs the tests start (PREFECT_API_URL), as a `rollflow server` is:
# no API auth string, which `configure_prefect_env` gives only a run's own temporary server
for _name in ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING"):
    os.environ.pop(_name, None)
configure_ray_env()  # before anything imports ray: token auth on with this session's own token, gloo on loopback


@pytest.fixture(autouse=True)
def _no_api_auth_string_left():
    """A test that runs `rollflow run` in this process (flows.cli.main) gets the API auth string its temporary
    server would ask for set in os.environ: gone after it, or every server a later test starts would inherit it."""
    yield
    for name in ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING"):
        os.environ.pop(name, None)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray_tmp = tempfile.mkdtemp(prefix="rf-ray-", dir="/tmp")
    from config import SLOT_RESOURCE

    # process slots for every run of the session (a run's placement group takes its own and gives them back); a
    # custom resource, unlike CPUs, starts no idle worker per unit
    ray.init(
        num_cpus=2,
        resources={SLOT_RESOURCE: 64},
        include_dashboard=False,
        _temp_dir=ray_tmp,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    yield ray
    ray.shutdown()
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        _keep_migrated_database()
        yield


_MIGRATED_DB = _TMP / "prefect-migrated.db"


def _keep_migrated_database() -> None:
    """Copy the test server's database as it started (migrated, no runs yet) for `prefect_home`."""
    import sqlite3

    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    source = sqlite3.connect(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])
    target = sqlite3.connect(_MIGRATED_DB)
    try:
        source.backup(target)  # consistent while the server runs (its database is in WAL mode)
    finally:
        target.close()
        source.close()


@pytest.fixture
def prefect_home(tmp_path, prefect_server) -> Path:
    """`tmp_path/prefect`, a Prefect home for `rollflow run` subprocesses whose database is already migrated (a
    copy of the test server's as it started): their temporary servers skip Prefect's migrations, ~10 s on two
    busy cores. (A run on a new home, as a user's first, is test_safety's.)"""
    return migrated_home(tmp_path / "prefect")


def migrated_home(home: Path) -> Path:
    """`home` made a Prefect home holding a copy of the test server's migrated database."""
    home.mkdir()
    shutil.copyfile(_MIGRATED_DB, home / "prefect.db")
    return home


@pytest.fixture(scope="session")
def base_checkpoint() -> str:
    """The tiny-arith bootstrapped model (built once into the user's cache, then reused)."""
    from recipes.tiny_arith.bootstrap import ensure_checkpoint

    return str(ensure_checkpoint())


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_TMP, ignore_errors=True)
