"""An engine left on the previous version's weights (a weight transfer that does not apply) is named stale, with
a confirmation that fails for it."""

from __future__ import annotations

import pytest

from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e


def test_an_engine_whose_transfer_does_not_apply_is_named_stale(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    from tests.e2e.test_ci_checks import _run

    # planted without --ci-test: every tensor of every sync is dropped, so the engine keeps version 0's weights
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        ci={"ci_fault_drop_weight": "*"},
    )
    with pytest.raises(Exception) as info:
        _run(cfg)
    message = str(info.value)
    assert (
        "rollout 0: engines [0] do not hold the trainer's weights after the sync: engine 0: stale: holds the "
        "weights of version 0 (a transfer that did not apply; it reports version 1); confirm: rollflow replay "
        f"{cfg.resolved_run_dir} --rollout-id 0 --task sync pushes this rollout's weights again and compares the "
        "engine's with them, the checkpoints of --save-interval 1 given" in message
    )
    assert "hash to" not in message


def test_replay_of_the_sync_fails_for_a_transfer_that_does_not_apply(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    import asyncio

    from flows.replay import replay_flow
    from tests.e2e.test_ci_checks import _run

    cfg = small_config(tmp_path, base_checkpoint, rollout={"num_rollout": 1}, eval={"eval_interval": None})
    _run(cfg)
    run_dir = str(cfg.resolved_run_dir)
    assert asyncio.run(replay_flow(run_dir, 0, "sync"))["identical"]
    # the planted fault, in the replay only: the engine drops every tensor of the transfer
    dropped = asyncio.run(replay_flow(run_dir, 0, "sync", {"ci.ci_fault_drop_weight": "*"}))
    assert dropped["difference"].startswith("engine 0 after sync: sha ")
    assert dropped["difference"].endswith(
        "(stale: it still holds the weights it started from, a transfer that did not apply)"
    )
