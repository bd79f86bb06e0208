"""Task-level replay: re-run one stage of one past rollout as a new Prefect flow run, from the
artifacts it read the first time, and report the first difference from what it produced then.

Inputs of rollout N: its config (config.yaml), its rollout and log-prob Parquet, the weights
before it (checkpoint iter_{N-1}, or the base model for N = 0) and, to compare weights after
training, iter_N. So a run is replayable at every rollout when it saved a checkpoint after each
one (`--save DIR --save-interval 1`).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from prefect import flow
from pydantic import ValidationError

from artifacts.compare import first_layer_difference, first_metric_difference, first_table_difference
from artifacts.hashing import as_dtype, layer_hashes, weights_sha256
from artifacts.store import (
    ArtifactError,
    ArtifactRef,
    ReadLimits,
    RunPaths,
    read_metrics,
    read_rollout,
    read_table,
)
from artifacts.wire import from_wire
from config import LoggingConfig, RunConfig, load_yaml
from config.location import relocate
from config.stages import REPLAYABLE
from flows.stages import Stages, opaque_config
from tasks import actors
from tasks.recordings import read_limits
from tasks.refs import WeightsRef
from tasks.transfer import trainer_weights

ReplayTask = Literal["generate", "log-prob", "train-step", "sync", "check"]  # a dropdown in the UI's Run form
assert get_args(ReplayTask) == REPLAYABLE, "the Run form's choices are config.stages.REPLAYABLE"


def load_run_config(run_dir: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The resolved config of the past run in `run_dir` (wherever config.yaml says it ran: a moved or copied run
    is read where it is now, `config.location.relocate`), with dotted-key overrides (e.g. {"train.lr": 1e-3})."""
    data = relocate(load_yaml(Path(run_dir) / "config.yaml"), run_dir)
    for key, value in (overrides or {}).items():
        *sections, name = key.split(".")
        target = data
        for s in sections:
            target = target.setdefault(s, {})
        target[name] = value
    return RunConfig.model_validate(data)


def check_replay(run_dir: str, rollout_id: int, task: str, overrides: dict[str, Any] | None = None) -> None:
    """Everything a replay reads, checked before Prefect or Ray start: the run's config, the rollout's recording
    and the checkpoints the stage needs; ValueError / FileNotFoundError naming the file."""
    if task not in REPLAYABLE:
        raise ValueError(f"--task {task!r}: replayable stages are {REPLAYABLE}")
    if not (Path(run_dir) / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir}: not a run directory (no config.yaml)")
    try:
        original = load_run_config(run_dir, overrides)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(
            f"{Path(run_dir) / 'config.yaml'}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
        ) from None
    paths = RunPaths(original.resolved_run_dir)
    limits = replay_limits(original)
    for path in [paths.rollout(rollout_id)] + ([paths.logprobs(rollout_id)] if task == "train-step" else []):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: rollout {rollout_id} was not recorded by this run")
        try:  # a damaged or tampered artifact is named here, not as a traceback from a Prefect task
            if path == paths.rollout(rollout_id):
                read_rollout(path, limits=limits)  # its columns and types too
            else:
                read_table(path, limits=limits)
        except ArtifactError as e:
            raise ValueError(" ".join(str(e).split())) from None
    if task in ("train-step", "check"):
        read_metrics(paths.metrics, strict=True)  # the recorded metrics it compares with: each record whole
    if task in ("log-prob", "train-step", "generate"):
        checkpoint_before(original, rollout_id)
    if task in ("sync", "check"):
        _iter_dir(original, rollout_id)


def replay_limits(cfg: RunConfig) -> ReadLimits:
    """What the run's own artifacts may hold: its model's positions, and its rollout size unless its rollouts
    were recordings (another run's, of any size)."""
    d = cfg.debug
    recorded = d.load_debug_rollout_data or d.load_forge_rollout_data or d.ci_inject_rollout_data_path
    return read_limits(cfg, rows=None if recorded else cfg.samples_per_rollout)


def checkpoint_before(cfg: RunConfig, rollout_id: int) -> Path | None:
    """The weights the rollout started from: iter_{N-1} under --save, None (= base model) for N = 0."""
    if rollout_id == 0:
        return None
    return _iter_dir(cfg, rollout_id - 1)


def _iter_dir(cfg: RunConfig, iteration: int) -> Path:
    if not cfg.checkpoint.save:
        raise FileNotFoundError(
            "the run saved no checkpoints; re-run it with --save DIR --save-interval 1 "
            "to make every rollout replayable"
        )
    path = Path(cfg.checkpoint.save) / f"iter_{iteration:07d}"
    if not (path / "meta.json").is_file():
        raise FileNotFoundError(
            f"checkpoint {path} is missing; re-run with --save-interval 1 to make every rollout replayable"
        )
    return path


def _ref(path: Path, kind: str, limits: ReadLimits) -> ArtifactRef:
    from artifacts.atomic import sha256_file

    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: nothing to replay from")
    return ArtifactRef(
        path=str(path),
        sha256=sha256_file(path),
        rows=read_table(path, limits=limits).num_rows,
        schema_version=1,
        kind=kind,
    )


def _checkpoint_hashes(path: Path) -> dict[str, str]:
    from safetensors.torch import load_file

    return layer_hashes(load_file(str(path / "model.safetensors")))


@flow(name="replay", flow_run_name="replay-{task}-{rollout_id}", log_prints=True)
async def replay_flow(
    run_dir: str, rollout_id: int, task: ReplayTask, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Re-run `task` of rollout `rollout_id` of the run in `run_dir`; returns {"identical", "difference"}."""
    if task not in REPLAYABLE:
        raise ValueError(f"--task {task!r}: replayable stages are {REPLAYABLE}")
    original = load_run_config(run_dir, overrides)
    paths = RunPaths(original.resolved_run_dir)
    out_dir = Path(run_dir) / "replays" / f"{task}_{rollout_id:06d}_{uuid.uuid4().hex[:8]}"
    # no experiment trackers and no recordings: a replay's records belong to the replay dir, not to the run's
    # W&B / TensorBoard or its --save-debug-rollout-data, --dump-details and --ci-save-grad-norm files
    quiet = {"save_debug_rollout_data": None, "dump_details": None, "save_debug_train_data": None}
    cfg = original.model_copy(
        update={
            "name": f"{original.name}-replay-{uuid.uuid4().hex[:6]}",
            "run_dir": str(out_dir),
            "logging": LoggingConfig(),
            "debug": original.debug.model_copy(update=quiet),
            "ci": original.ci.model_copy(update={"ci_save_grad_norm": None}),
        }
    )
    (out_dir / "rollouts").mkdir(parents=True, exist_ok=True)
    before = checkpoint_before(original, rollout_id)
    base = str(cfg.hf_checkpoint)
    actors.ensure_ray(cfg)
    try:
        difference = await _replay(cfg, original, paths, rollout_id, task, before, base)
    finally:
        actors.stop_actors(cfg)
    verdict = "identical" if difference is None else f"first difference: {difference}"
    print(f"replay of {task} for rollout {rollout_id}: {verdict}")
    return {"identical": difference is None, "difference": difference, "replay_dir": str(out_dir)}


async def _replay(
    cfg: RunConfig,
    original: RunConfig,
    paths: RunPaths,
    rollout_id: int,
    task: str,
    before: Path | None,
    base: str,
) -> str | None:
    limits = replay_limits(original)
    rollout = _ref(paths.rollout(rollout_id), "rollout", limits)
    if task in ("log-prob", "train-step"):  # no engines in these replays
        cfg = cfg.model_copy(update={"debug": cfg.debug.model_copy(update={"debug_train_only": True})})
    # the run's stage tasks under the run's retry policy, the replayed one from its inputs, not from the cache
    s, q = Stages(cfg, [task], rollout_id), opaque_config(cfg)
    if task == "generate":
        engines = await actors.start_engines(cfg, str(before or base))
        for e in engines:  # the engines held weight version N when rollout N was generated
            await e.update_weights.remote([e.get_weights.remote()], rollout_id)
        weights = WeightsRef(version=rollout_id, sha256=await engines[0].weights_sha256.remote())
        fresh = await s.generate(q, rollout_id, weights)
        return first_table_difference(read_table(rollout), read_table(fresh))
    trainers = await actors.start_trainers(cfg, base)
    if before is not None:  # all ranks at once: a backend's load may be collective
        await asyncio.gather(*[t.load.remote(str(before)) for t in trainers])
    if task == "log-prob":
        weights = WeightsRef(version=rollout_id, sha256=(await trainer_weights(cfg)).sha256)
        replayed = await s.log_prob(q, rollout_id, rollout, weights)
        first = read_table(replayed.table)
        diff = first_table_difference(read_table(paths.logprobs(rollout_id)), first)
        if diff is not None:
            return diff
        # a fresh process re-seeds as the run did, so a seeded dropout replays identically: a second pass in this
        # process, its RNG moved on, shows a forward that depends on the RNG
        await asyncio.gather(*[t.advance_rng.remote() for t in trainers])
        again = await Stages(cfg, ["log-prob"], rollout_id).log_prob(q, rollout_id, rollout, weights)
        second = first_table_difference(first, read_table(again.table))
        return None if second is None else f"a second pass in the same process, RNG advanced: {second}"
    logprobs = _ref(paths.logprobs(rollout_id), "logprobs", limits)
    recorded = [
        r["metrics"]
        for r in read_metrics(paths.metrics)
        if r["kind"] == "step" and r["rollout_id"] == rollout_id
    ]
    if task == "train-step":
        steps = await s.train_step(q, rollout_id, rollout, logprobs, uuid.uuid4().hex)
        diff = first_metric_difference(recorded, steps)
        if diff is None and original.checkpoint.save:
            after = Path(original.checkpoint.save) / f"iter_{rollout_id:07d}"
            if (after / "model.safetensors").is_file():
                # both sides by HF name, so any backend compares (a Megatron rank's own hashes are of its shard)
                # the float32 master weights, as the checkpoint holds them (collective)
                exported = await asyncio.gather(
                    *[t.export_weights.remote(None, None, False) for t in trainers]
                )
                trained = layer_hashes(from_wire(exported[0]))
                diff = first_layer_difference(_checkpoint_hashes(after), trained)
        return diff
    # sync / check: the trainer holds the weights after rollout N; engines receive them
    after = _iter_dir(original, rollout_id)
    await asyncio.gather(*[t.load.remote(str(after)) for t in trainers])
    engines = await actors.start_engines(cfg, str(before or base))
    started = await engines[0].weights_sha256.remote()
    weights = await s.sync(q, rollout_id)
    # the checkpoint's float32 weights as the engines hold them (bfloat16 in a bf16 run)
    held_as = torch.bfloat16 if cfg.train.precision == "bf16" else None
    expected = weights_sha256(as_dtype(_load_weights(after), held_as))
    if weights.sha256 != expected:
        return f"engine weights after sync: sha {weights.sha256[:12]} vs checkpoint iter_{rollout_id:07d} {expected[:12]}"
    # the pushed hash is the trainer's: the engine's own tells a transfer that did not apply
    held = await engines[0].weights_sha256.remote()
    if held != expected:
        what = (
            "stale: it still holds the weights it started from, a transfer that did not apply"
            if held == started
            else "a transfer that applied in part or wrongly"
        )
        return f"engine 0 after sync: sha {held[:12]} vs checkpoint iter_{rollout_id:07d} {expected[:12]} ({what})"
    if task == "check":  # the recorded run's log-prob statistics, as its check stage had them
        stats = {
            k: v
            for r in read_metrics(paths.metrics)
            if r["kind"] == "rollout" and r["rollout_id"] == rollout_id
            for k, v in r["metrics"].items()
        }
        await s.check(q, rollout_id, recorded, weights, stats)
    return None


def _load_weights(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))
