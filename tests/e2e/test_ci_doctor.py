"""`--ci-test` ends with the doctor, and by default (`--ci-doctor gate`) an ERROR finding fails the run: the flow
run ends Failed with the finding as its message, the console's last line names it, and outcome.json records it
(`--ci-doctor advisory`, which lets the run pass, is tested on a synthetic run in tests/unit/test_doctor_run_end.py).
The planted bug: a reward that ignores the response (every sample scores 1.0), which no in-process checker catches
but the doctor names."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from artifacts.rundir import read_outcome
from tests.e2e.test_ci_checks import ci_flags
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e

TITLE = (
    "every sample gets reward 1.0: the reward function ignores the response (--rm-type / --custom-rm-path / "
    "--reward-key, or labels that never match: --label-key)"
)


async def constant_reward(args: Any, sample: Any) -> float:
    """The planted bug: the same reward whatever the response."""
    return 1.0


def _config(tmp_path, base_checkpoint):
    return small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        checkpoint={"save": None, "save_interval": None},
        reward={"custom_rm_path": "tests.e2e.test_ci_doctor.constant_reward"},
        ci=ci_flags(base_checkpoint),  # --ci-doctor gate by default
    )


def test_a_doctor_error_fails_a_ci_test_run(tmp_path, ray_session, prefect_server, base_checkpoint):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import FailedRun

    from flows.failure import failure_line
    from flows.run import run_flow

    gated = _config(tmp_path, base_checkpoint)
    state = asyncio.run(run_flow(gated, return_state=True))
    assert state.is_failed()
    assert state.message.startswith(f"the doctor found an ERROR [constant-reward] {TITLE} (evidence: ")
    assert state.message.endswith(" (--ci-doctor advisory reports without failing)")
    with pytest.raises(FailedRun) as failed:
        asyncio.run(state.result())  # how the CLI gets it: its last line is the finding
    assert failure_line(failed.value) == f"rollflow: run failed: {state.message}"

    async def recorded() -> str | None:
        async with get_client() as client:
            return (await client.read_flow_run(state.state_details.flow_run_id)).state.message

    assert asyncio.run(recorded()) == state.message
    outcome = read_outcome(gated.resolved_run_dir)
    assert outcome is not None and (outcome.status, outcome.error, outcome.gate) == (
        "failed",
        state.message,
        "ci-doctor",
    )
