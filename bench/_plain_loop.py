"""The rollflow RL loop without Prefect or Ray: one TorchEngine and one TorchTrainer in this process.

Per rollout it does the same engine + trainer work as a `rollout-<id>` flow run:
generate -> write_rollout -> compute_log_probs -> train_step -> update_weights(export_weights), and, when the
config evaluates (--eval-interval with eval data, as the default recipe does), the evals on the flow's schedule
(eval 0 before rollout 0, eval N + 1 after rollout N when due: generate -> write_rollout of the eval samples),
each counted in the rollout whose flow run does it. Shared by bench/overhead.py and bench/vs_trl.py.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from artifacts.store import RunPaths, write_rollout
from config import RunConfig
from engines.torch_engine.engine import TorchEngine
from flows.resolve import resolve
from procs import freeze_heap, preload_arrow
from rollout.data import prompts_for_rollout
from rollout.requests import build_requests, sampling_metadata, to_samples
from rollout.source import eval_params, train_params
from tasks.metrics import eval_stats
from trainers.settings import trainer_settings
from trainers.torch_trainer.trainer import TorchTrainer

# what `plain_steps` times in each rollout, in order (the stages of a rollout flow run that do that work)
PHASES = ("generate", "score and write", "log-prob pass", "train step", "weight sync")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plain_rollouts(cfg: RunConfig, n: int, phases: dict[str, list[float]] | None = None) -> list[float]:
    """Run rollouts 0..n-1 in process and return each one's wall seconds (index 0 is the warm-up); `phases` as
    for `plain_steps`."""
    return list(plain_steps(cfg, n, phases))


def plain_steps(cfg: RunConfig, n: int, phases: dict[str, list[float]] | None = None) -> Iterator[float]:
    """Run rollouts 0..n-1 in process, yielding each one's wall seconds as it ends (the first is the warm-up),
    so that a caller can run other work between them (bench/vs_trl.py alternates with TRL's steps).

    `cfg.run_dir` receives the rollout / log-prob Parquet files; the config is resolved as `rollflow run`
    resolves it (the recipe fills in model, data and reward). Uses `cfg.num_threads` torch threads (world
    size 1, gloo group). Loading the model and trainer happens before the first rollout's clock starts.
    `phases`, if given, receives each rollout's seconds per phase under the names `PHASES` lists (evals not
    included), then the trainer's own timers (`perf/log_probs_time`, `perf/actor_train_time`, ...).
    """
    cfg, src = resolve(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"num_rollout": n})}))
    assert src.train is not None and cfg.hf_checkpoint is not None
    torch.set_num_threads(cfg.num_threads)
    paths, r = RunPaths(cfg.resolved_run_dir), cfg.rollout
    params = train_params(cfg, src.stops)
    engine = TorchEngine(cfg.hf_checkpoint, num_threads=cfg.num_threads, precision=cfg.train.precision)
    trainer = TorchTrainer(trainer_settings(cfg), cfg.hf_checkpoint, rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    # as every rollflow process does once set up: what pyarrow imports lazily (pandas, its compute module) is
    # imported now, then the model, torch and the imports leave the full collections (without the freeze, five of
    # them cost this loop ~1.4 s over 30 default-recipe rollouts, ~270 ms each; without the preload, the modules
    # imported by the first write stayed in them: ~30 ms each, against ~5 ms)
    preload_arrow()
    freeze_heap()
    evaluates = bool(cfg.eval.eval_interval and src.evals)

    def evaluate(eval_id: int) -> None:  # tasks.stages.evaluate's work
        prompts = [p for _, s in src.evals for p in s.prompts]
        names = [name for name, s in src.evals for _ in s.prompts]
        entries = build_requests(
            prompts,
            r.rollout_seed,
            eval_id,
            cfg.eval.n_samples_per_eval_prompt,
            eval_params(cfg, src.stops),
            eval_mode=True,
            datasets=names,
        )
        outputs = engine.generate([e.request for e in entries])
        samples = loop.run(to_samples(entries, outputs, src.tokenizer, src.stops, src.eval_scorer, eval_id))
        write_rollout(paths.eval_rollout(eval_id), samples, metadata={}, kind="eval")
        eval_stats(samples, [name for name, _ in src.evals])

    loop = asyncio.Runner()  # one event loop for the run, as the flow has (not one per rollout: ~2 ms each)
    try:
        for rollout_id in range(n):
            start = time.perf_counter()
            if evaluates and rollout_id == 0:
                evaluate(0)
            prompts = prompts_for_rollout(
                src.train.prompts, r.rollout_batch_size, rollout_id, r.rollout_seed, cfg.data.rollout_shuffle
            )
            entries = build_requests(prompts, r.rollout_seed, rollout_id, r.n_samples_per_prompt, params)
            times = [time.perf_counter()]
            outputs = engine.generate([e.request for e in entries])
            times.append(time.perf_counter())
            samples = loop.run(to_samples(entries, outputs, src.tokenizer, src.stops, src.scorer, rollout_id))
            rollout = write_rollout(
                paths.rollout(rollout_id), samples, metadata=sampling_metadata(params, r.rollout_seed)
            )
            times.append(time.perf_counter())
            logprobs = trainer.compute_log_probs(rollout, str(paths.logprobs(rollout_id)))
            assert logprobs is not None  # rank 0 always writes
            times.append(time.perf_counter())
            trainer.train_step(rollout, logprobs)
            times.append(time.perf_counter())
            engine.update_weights(trainer.export_weights(), rollout_id + 1)
            times.append(time.perf_counter())
            if phases is not None:
                for name, began, ended in zip(PHASES, times[:-1], times[1:], strict=True):
                    phases.setdefault(name, []).append(ended - began)
                for name, seconds in trainer.perf().items():
                    phases.setdefault(name, []).append(seconds)
            every = cfg.eval.eval_interval
            if evaluates and every and ((rollout_id + 1) % every == 0 or rollout_id + 1 == n):
                evaluate(rollout_id + 1)
            yield time.perf_counter() - start
    finally:
        loop.close()
        if dist.is_initialized():
            dist.destroy_process_group()
