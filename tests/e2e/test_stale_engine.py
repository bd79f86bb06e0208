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
