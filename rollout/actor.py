"""The Ray actor that finishes the run's rollouts: the orchestrator's rollout side in a process of its own, as
slime's rollout manager is. It scores what the engines generated with the run's reward and writes the rollout's
Parquet file (rollout/finish.py), so the orchestrating process, which drives Prefect, does neither, and the
trainers' log-prob pass can follow on the file through Ray. Rewards run here, never in an engine."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import TYPE_CHECKING, Any

import ray

from engines.base import EngineAnswer
from faults import FaultHookRequest, FaultInjector
from procs import freeze_heap, memory_gib, preload_arrow
from rollout.data import use_tokenizer_class
from rollout.finish import Tally, check_versions, finish_rollout, in_entry_order
from rollout.requests import split_for_engines

if TYPE_CHECKING:
    from artifacts.store import ArtifactRef
    from config import RunConfig
    from rollout.requests import Entry


@ray.remote(num_cpus=0)
class RolloutActor:
    """Scores and writes rollouts (one at a time, in call order). Created per run next to the engines, on the
    orchestrator's node and in its working directory (tasks/actors.py): a `--custom-rm-path` module and the
    run's relative paths resolve as they do in `rollflow run`."""

    def __init__(
        self,
        cwd: str,
        faults: list[FaultHookRequest] | None = None,
        run_dir: str | None = None,
        epoch: float | None = None,
        tokenizer_classes: dict[str, type] | None = None,
    ) -> None:
        """`tokenizer_classes`: {checkpoint dir: the class its tokenizer loaded as} in the creating process
        (rollout.data.use_tokenizer_class)."""
        os.chdir(cwd)
        for checkpoint, cls in (tokenizer_classes or {}).items():
            use_tokenizer_class(checkpoint, cls)
        self.faults = FaultInjector(faults or [], "rollout", None, run_dir, epoch)
        self._loop = asyncio.Runner()  # one event loop for the actor's life: async rewards run on it

    def health(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "cwd": os.getcwd()}

    def memory(self) -> dict[str, float]:
        """This process's resident memory now and at its peak, GiB (procs.memory_gib)."""
        return memory_gib()

    def prepare(self, cfg: RunConfig) -> None:
        """Load what scoring `cfg`'s rollouts needs (tokenizer, stops, the reward functions: a `--custom-rm-path`
        module that does not import fails here, as the run starts), then keep it out of Python's full garbage
        collections, as the engines and trainers do with their models once set up."""
        from rollout.source import scoring_side

        scoring_side(cfg)
        preload_arrow()
        freeze_heap()

    @ray.method(num_returns=2)
    def finish_rollout(
        self,
        cfg: RunConfig,
        rollout_id: int,
        entries: list[Entry],
        weight_version: int,
        weights_sha256: str,
        path: str,
        *answers: EngineAnswer,
        eval_mode: bool = False,
        ctx: dict[str, Any] | None = None,
    ) -> tuple[ArtifactRef, Tally]:
        """Score and write rollout `rollout_id` (an eval set with `eval_mode`; rollout/finish.py) from the engines'
        `answers`: one per non-empty engine part of `entries`, in part order (object refs of their `generate`
        calls, resolved by Ray before this runs). Every output must come from the weights of `weight_version`
        (`weights_sha256`), else StaleWeights and nothing is written. Two returns, the file's ref and its tally
        (with the longest engine's generation time): a caller may pass the ref on to the trainers without waiting
        for it. `ctx`: the stage's (rollout_id, attempt, stage), for the fault hooks and the error."""
        self.faults.reach("rollout_finish_start", **(ctx or {}))
        num_engines = cfg.rollout.rollout_num_engines
        outputs = in_entry_order(entries, num_engines, [a.outputs for a in answers])
        engines = [i for i, part in enumerate(split_for_engines(entries, num_engines)) if part]
        stage = (ctx or {}).get("stage") or ("eval" if eval_mode else "generate")
        check_versions(
            dict(zip(engines, (a.outputs for a in answers), strict=True)), weight_version, rollout_id, stage
        )
        finished = finish_rollout(
            cfg, rollout_id, entries, outputs, weights_sha256, path, eval_mode=eval_mode
        )
        ref, tally = self._loop.run(finished)
        return ref, dataclasses.replace(tally, generation=max((a.seconds for a in answers), default=0.0))

    @ray.method(num_returns=2)
    def generate_with_plugins(
        self,
        cfg: RunConfig,
        rollout_id: int,
        entries: list[Entry],
        engines: list[Any],
        weight_version: int,
        weights_sha256: str,
        path: str,
        *,
        eval_mode: bool = False,
        ctx: dict[str, Any] | None = None,
    ) -> tuple[ArtifactRef, Tally]:
        """Generate rollout `rollout_id` with the run's --custom-generate-function-path or --rollout-function-path
        (rollout/plugins.py), calling `engines` (the run's engine actors) on `weight_version`, then score and
        write it as `finish_rollout` does; the same two returns."""
        from rollout.plugins import plugged_rollout

        self.faults.reach("rollout_finish_start", **(ctx or {}))
        done = plugged_rollout(
            cfg,
            rollout_id,
            entries,
            engines,
            weight_version,
            weights_sha256,
            path,
            eval_mode=eval_mode,
            ctx=ctx,
        )
        return self._loop.run(done)

    @ray.method(num_returns=2)
    def generate_dynamic(
        self,
        cfg: RunConfig,
        rollout_id: int,
        engines: list[Any],
        weight_version: int,
        weights_sha256: str,
        path: str,
        ctx: dict[str, Any] | None = None,
    ) -> tuple[ArtifactRef, Tally]:
        """Generate rollout `rollout_id` with slime's dynamic sampling (rollout/dynamic.py): draws of prompt groups
        on `engines` (the run's engine actors, all on `weight_version`) until the filter keeps a batch, then score
        and write it as `finish_rollout` does; the same two returns."""
        from rollout.dynamic import dynamic_rollout

        self.faults.reach("rollout_finish_start", **(ctx or {}))
        return self._loop.run(
            dynamic_rollout(cfg, rollout_id, engines, weight_version, weights_sha256, path, ctx)
        )
