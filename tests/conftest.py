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

from flows.cli import configure_prefect_env, configure_ray_env  # noqa: E402

configure_prefect_env()  # analytics off, batched event writes: as `rollflow run`
configure_ray_env()  # before anything imports ray: token auth on with this session's own token, gloo on loopback


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
        yield


@pytest.fixture(scope="session")
def base_checkpoint() -> str:
    """The tiny-arith bootstrapped model (built once into the user's cache, then reused)."""
    from recipes.tiny_arith.bootstrap import ensure_checkpoint

    return str(ensure_checkpoint())


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_TMP, ignore_errors=True)
