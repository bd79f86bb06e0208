"""What the run flow needs besides the algorithm:
- owning the run dir: lock, identity, resume point, records a resume must not duplicate, a deployment run's
  own dir, a retry's own run;
- the run's log file;
- the Prefect/SQLite accommodations (`settle`, `Publisher`) and the per-rollout metrics table;
- marking a dead run's flow run Crashed;
- the watchdog that ends a run whose Prefect API stopped answering."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from artifacts import rundir
from artifacts.atomic import atomic_write_text
from artifacts.checkpoints import damage, latest_checkpoint, remove_unfinished_saves
from artifacts.store import RunPaths, read_metrics
from config import RunConfig, dump_yaml
from flows.resolve import resolve
from tasks.metrics import log_metrics, set_run_id
from tasks.notify import notice
from tasks.stages import artifact_slug


@dataclass
class OwnedRun:
    """A resolved config with its run dir held by this process, and where the run starts."""

    cfg: RunConfig
    info: rundir.RunInfo
    lock: IO[str]
    start: int = 0  # first rollout to run
    resumed: bool = False  # the same run continues (--resume, or --load of its own checkpoint)
    trainer_state: Path | None = None  # what the trainers load before `start` (a checkpoint or snapshot)
    previous_flow_run: str | None = None  # the parent flow run of the run's previous process, if any
    # a damaged state of rollout `start - 1` that the resume did not restore, and why
    passed_over: str | None = None

    def release(self) -> None:
        self.lock.close()


def choose_run_dir(cfg: RunConfig) -> RunConfig:
    """With no --name and no --run-dir, a default run dir that holds another run's records is left alone: the
    run goes to the next free `<name>-2`, `<name>-3`, ... (so the README's main command can be run twice)."""
    if "name" in cfg.model_fields_set or cfg.run_dir is not None or cfg.checkpoint.load:
        return cfg
    name, n = cfg.name, 1
    while rundir.has_records(Path(f"runs/{name}")):
        n += 1
        name = f"{cfg.name}-{n}"
    return cfg.model_copy(update={"name": name}) if n > 1 else cfg


def deployment_run_dir(cfg: RunConfig, flow_run_id: str, *, resume: bool) -> RunConfig:
    """A deployment's run (scheduled, or started from the UI or the API) writes to a run dir of its own:
    `runs/<name>-<last 8 hex of its flow run id>`. So the next run of the same deployment does not meet its
    records, and its retries (the same flow run) find it again. Unchanged when the config names a run dir,
    when the run resumes (the deployment continues one run: `resume` with the config's run dir, `runs/<name>`
    by default), and outside a deployment (`rollflow run` picks its own, `choose_run_dir`)."""
    from prefect.runtime import deployment

    if deployment.id is None or cfg.run_dir is not None or resume:
        return cfg
    # the last digits: Prefect's ids are UUIDv7, whose first ones are the creation time that the runs a schedule
    # creates at once share; the last ones are random
    return cfg.model_copy(update={"run_dir": f"runs/{cfg.name}-{flow_run_id.replace('-', '')[-8:]}"})


# run dir -> its lock, taken by `check_ownership` before Prefect and Ray start. Held until this process's run
# flow takes it over (`own`): the CLI runs that flow in its own process.
_HELD: dict[Path, IO[str]] = {}


def check_ownership(cfg: RunConfig, *, resume: bool, overwrite: bool) -> None:
    """The ownership rules of `own`, checked by the CLI before Prefect and Ray start. The run dir's lock is
    taken and kept for the run flow this process runs next, which takes it over (`own`). A second run into the
    same dir is refused at once, in one line naming the dir and the process that holds it
    (`rundir.RunDirBusy`). Creates the run dir and its lock file, nothing else."""
    run_dir = cfg.resolved_run_dir
    if resume and not run_dir.exists():
        raise ValueError(f"--resume {run_dir}: no such run dir")
    lock = rundir.acquire(run_dir)
    try:
        if not overwrite:
            _start_point(cfg, lock, resume=resume, overwrite=False)
    except BaseException:
        lock.close()
        raise
    _HELD[run_dir] = lock


def own(
    cfg: RunConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    retry_of: str | None = None,
    flow_run_id: str | None = None,
) -> OwnedRun:
    """Resolve `cfg`, lock its run dir and decide where the run starts; nothing is written before the config
    resolved. A run dir that holds another run's records is refused unless the run resumes it (`resume`, or
    `--load` of that run's own checkpoint) or `overwrite` clears it.

    `retry_of`: this process is a Prefect retry of that parent flow run (the UI's Retry, `prefect flow-run
    retry`). It resumes the run dir only if that flow run recorded it, and starts afresh where nothing was
    recorded yet. It refuses the records of any other flow run. `flow_run_id`: the parent flow run. A
    deployment's run gets a run dir of its own (`deployment_run_dir`), decided on the resolved config: a
    deployment's served `cfg` may name one. The lock `check_ownership` took for the same dir in this process
    is taken over, not taken again."""
    cfg, _ = resolve(cfg)
    if flow_run_id is not None:
        cfg = deployment_run_dir(cfg, flow_run_id, resume=resume)
    cfg = cfg.model_copy(update={"run_dir": str(cfg.resolved_run_dir)})
    run_dir = cfg.resolved_run_dir
    # the lock the CLI took before Prefect and Ray started (`check_ownership`); a deployment's run takes its own
    lock = _HELD.pop(run_dir, None) or rundir.acquire(run_dir)
    try:
        if retry_of is not None and _retry_resumes(run_dir, retry_of, overwrite):
            # its first attempt already owned (and, with overwrite, cleared) it
            resume, overwrite = True, False
        owned = _start_point(cfg, lock, resume=resume, overwrite=overwrite)
    except BaseException:
        lock.close()
        raise
    _remove_unfinished_saves(cfg)
    paths = RunPaths(run_dir)
    paths.rollout(0).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", dump_yaml(cfg))
    rundir.write_info(run_dir, owned.info)
    set_run_id(cfg, owned.info.run_id)
    if owned.resumed:
        dropped = rundir.truncate_records(paths.metrics, owned.start)
        notice(
            f"resuming run {owned.info.run_id} in {run_dir} at rollout {owned.start}"
            + (f" (dropped {dropped} record(s) of the rollout that was cut)" if dropped else "")
        )
        if owned.passed_over:
            notice(
                f"{owned.passed_over}: the trainers restore {owned.trainer_state} instead", logging.WARNING
            )
    return owned


def _retry_resumes(run_dir: Path, flow_run_id: str, overwrite: bool) -> bool:
    """Whether a retry of the parent flow run `flow_run_id` resumes `run_dir`. Yes when that flow run recorded
    it. No when nothing is recorded there yet (its first attempt failed before), or when the run replaces
    another run's records (`overwrite`). ValueError for another run's records otherwise."""
    previous = rundir.read_info(run_dir)
    if previous is None or not rundir.has_records(run_dir):
        return False
    if previous.flow_run_id == flow_run_id:
        return True
    if overwrite:
        return False
    raise ValueError(
        f"run dir {run_dir} holds the records of run {previous.run_id} (flow run {previous.flow_run_id}), not "
        f"of flow run {flow_run_id}: a retry resumes only its own run; start a new run with another --name or "
        "--run-dir, or replace those records with --overwrite"
    )


def _start_point(cfg: RunConfig, lock: IO[str], *, resume: bool, overwrite: bool) -> OwnedRun:
    run_dir = cfg.resolved_run_dir
    previous = rundir.read_info(run_dir)
    used = rundir.has_records(run_dir)
    load = latest_checkpoint(cfg.checkpoint.load) if cfg.checkpoint.load else None
    own_checkpoint = load is not None and previous is not None and _checkpoint_run_id(load) == previous.run_id
    if overwrite:
        rundir.clear(run_dir)
        return OwnedRun(
            cfg, rundir.new_info(cfg.name), lock, 0, False, load, previous.flow_run_id if previous else None
        )
    if resume:
        if previous is None:
            raise ValueError(f"--resume {run_dir}: no run to resume there (no {rundir.INFO})")
        start = rundir.completed_rollouts(read_metrics(RunPaths(run_dir).metrics)) if used else 0
        state, passed_over = _state_before(cfg, start)
        return OwnedRun(cfg, previous, lock, start, True, state, previous.flow_run_id, passed_over)
    if used and not own_checkpoint:
        owner = f"run {previous.run_id}" if previous else "another run"
        raise ValueError(
            f"run dir {run_dir} holds the records of {owner}: continue it with "
            f"`rollflow run --resume {run_dir}`, start a new run beside it with --name NEW_NAME, or replace "
            "them with --overwrite"
        )
    if (
        own_checkpoint and previous is not None and load is not None
    ):  # slime's relaunch with --load of this run's checkpoint
        start = 1 + _checkpoint_rollout(load)
        return OwnedRun(cfg, previous, lock, start, True, load, previous.flow_run_id)
    start = 1 + _checkpoint_rollout(load) if load is not None else 0
    return OwnedRun(
        cfg, rundir.new_info(cfg.name), lock, start, False, load, previous.flow_run_id if previous else None
    )


def _remove_unfinished_saves(cfg: RunConfig) -> None:
    """Remove, and log, the iter_N.tmp-* dirs that a process that died mid-save left in this run's snapshot
    dir and --save dir. The run owns both now, so no save of its own is under way there."""
    from trainers.actor import snapshot_dir

    dirs = [snapshot_dir(cfg.resolved_run_dir)] + ([Path(cfg.checkpoint.save)] if cfg.checkpoint.save else [])
    for d in dirs:
        for p in remove_unfinished_saves(d):
            notice(f"removed {p}: a save that never finished (its process died)", logging.WARNING)


def _state_before(cfg: RunConfig, start: int) -> tuple[Path | None, str | None]:
    """The trainer state after rollout `start - 1`, and the damage of a state passed over, if any. None for
    start 0 (the run's starting weights). The step-boundary snapshot of that rollout comes first, else a
    --save checkpoint of it, each only if nothing in it is damaged (`damage`). When every state of that
    rollout is damaged, the error names the latest whole state before it and the command that continues the
    run there."""
    if start == 0:
        return None, None
    from trainers.actor import snapshot_dir

    dirs = [snapshot_dir(cfg.resolved_run_dir)] + ([Path(cfg.checkpoint.save)] if cfg.checkpoint.save else [])
    candidates = [d / f"iter_{start - 1:07d}" for d in dirs]
    damaged: list[str] = []
    for path in candidates:
        if not (path / "meta.json").is_file():
            continue
        problem = damage(path)
        if problem is None:
            return path, damaged[0] if damaged else None
        damaged.append(f"{path} is damaged ({problem})")
    if not damaged:
        raise ValueError(
            f"cannot resume at rollout {start}: no snapshot or checkpoint of rollout {start - 1} "
            f"(looked in {', '.join(str(p) for p in candidates)})"
        )
    earlier = _latest_whole_before(dirs, start - 1)
    raise ValueError(
        f"cannot resume at rollout {start}: {'; '.join(damaged)}, as a machine crash leaves files that had not "
        "reached the disk. "
        + (
            # --run-dir: the config.yaml of a moved or copied run still names the dir it was made in
            "Continue the run from an earlier state of it (the rollouts after it run again): `rollflow run "
            f"--config {cfg.resolved_run_dir / 'config.yaml'} --run-dir {cfg.resolved_run_dir} --load {earlier}`"
            if earlier is not None
            else "No earlier state of the run is intact: start it over with --overwrite"
        )
    )


def _latest_whole_before(dirs: list[Path], rollout_id: int) -> Path | None:
    """The latest snapshot or checkpoint in `dirs` (an iter_NNNNNNN dir) of a rollout before `rollout_id` with
    nothing damaged. The newest are checked first, a snapshot before a checkpoint of the same rollout."""
    limit = f"iter_{rollout_id:07d}"
    older = [p for d in dirs for p in d.glob("iter_" + "[0-9]" * 7) if p.name < limit]
    return next((p for p in sorted(older, key=lambda p: p.name, reverse=True) if damage(p) is None), None)


def _checkpoint_meta(path: Path) -> dict[str, Any]:
    import json

    return json.loads((path / "meta.json").read_text())


def _checkpoint_run_id(path: Path) -> str | None:
    return _checkpoint_meta(path).get("run_id")


def _checkpoint_rollout(path: Path) -> int:
    return int(_checkpoint_meta(path)["rollout_id"])


def record_flow_run(owned: OwnedRun, flow_run_id: str) -> None:
    """Remember the parent flow run in run.json (the next start marks it Crashed if this process dies)."""
    owned.info = replace(owned.info, flow_run_id=flow_run_id)
    rundir.write_info(owned.cfg.resolved_run_dir, owned.info)


async def crash_stale_flow_run(flow_run_id: str | None, current: str | None = None) -> None:
    """Mark the previous process's parent flow run, and its rollout flow runs, Crashed if the server still shows
    them running (the lock proves that process is gone). When that parent is `current` (a Prefect retry of the same
    flow run, now running again), only its rollout flow runs left running are marked."""
    if not flow_run_id:
        return
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.states import Crashed

    async with get_client() as client:
        try:
            parent = await client.read_flow_run(uuid.UUID(flow_run_id))
        except Exception:  # the server does not know it (another Prefect home): nothing to mark
            return
        children = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent.id]))
        )
        for run in [parent, *children] if flow_run_id != current else children:
            if run.state is not None and not run.state.is_final():
                await client.set_flow_run_state(
                    run.id,
                    Crashed(
                        message="the process running it stopped (killed, or its Prefect API went away); marked when "
                        "the run dir was next used"
                    ),
                    force=True,
                )
                notice(f"marked stale flow run {run.name} ({run.id}) Crashed")


def yield_to_actors(cfg: RunConfig) -> None:
    """Once the run's actors are up, lower this process (the run's orchestrator) and the temporary Prefect
    server it started by --orchestrator-niceness, below the actors. Threads it starts later inherit that.
    Ray's processes keep the priority they started with: Ray was started before (`tasks.actors.ensure_ray`),
    and Ray's raylet, not this process, starts a replaced actor. Nothing with the default of 0."""
    from flows.prefect_private import temporary_server_pids
    from procs import lower_priority

    lower_priority([os.getpid(), *temporary_server_pids()], cfg.placement.orchestrator_niceness)


def start_prefect_beside_ray(cfg: RunConfig) -> None:
    """Start Prefect's temporary server (in a thread) while this thread starts Ray (`tasks.actors.ensure_ray`);
    return once both are up, or raise the first error. Each takes seconds of process start-up, mostly in
    processes of their own. Left to the flow, they would start one after the other: Prefect's server at the
    flow's first request, Ray once the flow runs. With PREFECT_API_URL set (a `rollflow server`) only Ray
    starts. Ray stays in the calling thread: `ray.init` sets its SIGTERM handler only from the main thread."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    from tasks import actors

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        actors.ensure_ray(cfg)
        return
    from concurrent.futures import ThreadPoolExecutor

    from flows.prefect_private import start_temporary_server

    with ThreadPoolExecutor(1, thread_name_prefix="prefect-server-start") as pool:
        server = pool.submit(start_temporary_server)
        actors.ensure_ray(cfg)
        server.result()


def start_api_watchdog(
    api_url: str,
    timeout: float,
    run_dir: Path,
    *,
    flow_run_id: str | None = None,
    on_cancel: Callable[[], None] | None = None,
) -> threading.Event:
    """A thread that ends this process, with a message, once the Prefect API has not answered for `timeout`
    seconds. Prefect's client would retry for minutes, and the run cannot record anything meanwhile. The
    thread reads the flow run `flow_run_id` (`/health` without one) about once a second. It calls `on_cancel`
    once when that flow run is Cancelling (the UI's Cancel, `prefect flow-run cancel`), for a run no runner
    watches. Set the returned event to stop it. The reaper (flows/reaper.py) then stops the run's other
    processes."""
    import httpx

    stop = threading.Event()
    base = api_url.rstrip("/")
    url = f"{base}/flow_runs/{flow_run_id}" if flow_run_id else f"{base}/health"
    every = min(1.0, timeout / 4)

    def cancelling(response: httpx.Response) -> bool:
        if flow_run_id is None or response.status_code != 200:
            return False
        state = response.json().get("state") or {}
        return state.get("type") == "CANCELLING"

    def watch() -> None:
        last_ok, told = time.monotonic(), False
        with httpx.Client(timeout=min(5.0, timeout / 4), headers=_api_headers()) as client:
            while not stop.wait(every):
                try:
                    response = client.get(url)
                except httpx.HTTPError:  # refused, reset, timed out: counts as not answering
                    response = None
                if response is not None and response.status_code < 500:
                    last_ok = time.monotonic()
                    if on_cancel is not None and not told and cancelling(response):
                        told = True
                        on_cancel()
                elif time.monotonic() - last_ok > timeout:
                    print(
                        f"rollflow: error: the Prefect API at {api_url} has not answered for {timeout:g} s "
                        f"(--prefect-timeout); stopping the run. Continue it with "
                        f"`rollflow run --resume {run_dir}`",
                        file=sys.stderr,
                        flush=True,
                    )
                    os._exit(75)

    threading.Thread(target=watch, name="prefect-api-watchdog", daemon=True).start()
    return stop


def _api_headers() -> dict[str, str]:
    """The Authorization header Prefect's own client sends (PREFECT_API_AUTH_STRING, else PREFECT_API_KEY)."""
    import base64

    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_KEY

    if PREFECT_API_AUTH_STRING.value():
        token = base64.b64encode(str(PREFECT_API_AUTH_STRING.value()).encode()).decode()
        return {"Authorization": f"Basic {token}"}
    return {"Authorization": f"Bearer {PREFECT_API_KEY.value()}"} if PREFECT_API_KEY.value() else {}


@contextlib.contextmanager
def api_watchdog(
    cfg: RunConfig, flow_run_id: str | None = None, on_cancel: Callable[[], None] | None = None
) -> Iterator[None]:
    """`start_api_watchdog` on the API this flow run talks to (the ephemeral server or PREFECT_API_URL), with
    --prefect-timeout, for as long as the block runs."""
    from prefect.client.orchestration import get_client

    # the client knows the ephemeral server's URL; Prefect's settings say None for it
    with get_client(sync_client=True) as client:
        url = str(client.api_url)
    stop = start_api_watchdog(
        url, cfg.faults.prefect_timeout, cfg.resolved_run_dir, flow_run_id=flow_run_id, on_cancel=on_cancel
    )
    try:
        yield
    finally:
        stop.set()


async def settle(
    task_runs: int,
    *,
    flow_run_id: uuid.UUID | None = None,
    task_run_id: uuid.UUID | None = None,
    timeout: float = 5.0,
) -> bool:
    """Wait until the server has recorded `task_runs` task runs of the given flow run (or the one task
    run `task_run_id`), each in a final state; False if that took longer than `timeout` seconds.

    Task runs reach the server as events. Its task-run recorder writes them to SQLite once a second
    (`flows.cli.PREFECT_ENV_DEFAULTS`), in the order they happened. The parent waits here once, for its last
    rollout, so that a run's task runs are all recorded when its flow run ends. It polls every 20 ms.
    """
    import anyio
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterId

    query = (
        {"task_run_filter": TaskRunFilter(id=TaskRunFilterId(any_=[task_run_id]))}
        if task_run_id is not None
        else {"flow_run_filter": FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))}
    )
    with anyio.move_on_after(timeout):
        async with get_client() as client:
            while True:
                runs = await client.read_task_runs(**query)
                if len(runs) >= task_runs and all(r.state is not None and r.state.is_final() for r in runs):
                    return True
                await anyio.sleep(0.02)
    return False


class Publisher:
    """The Prefect artifacts of each finished rollout: its metrics table on its `rollout-<id>` flow run
    (`publish_metrics_table`) and the run page's update (`flows.run_page`). A background task posts them, one
    rollout after the other, `POST_DELAY` seconds after the rollout ended. They are requests to the Prefect
    server (no actor work). Made at once, they would meet the next rollout's flow run creation in the server's
    SQLite, which the loop waits for. A failure to post is raised at the next rollout's end (`rollout_done`)
    or by `drain`, which posts what is due without waiting."""

    POST_DELAY = 0.2  # seconds: the next rollout's flow run is created and running by then

    def __init__(self, cfg: RunConfig, records: list[dict[str, Any]], page: Any) -> None:
        self.cfg, self.records, self.page = cfg, records, page
        self._posting: asyncio.Task[None] | None = None
        self._now = asyncio.Event()  # set by drain: post without waiting

    def rollout_done(self, rollout_id: int, flow_run_id: uuid.UUID | None) -> None:
        """Rollout `rollout_id` (flow run `flow_run_id`) has ended: post its artifacts after those before."""
        previous = self._posting
        if previous is not None and previous.done():
            previous.result()  # raises a failure to post
        self._posting = asyncio.get_running_loop().create_task(self._post(previous, rollout_id, flow_run_id))

    async def drain(self, *, raise_errors: bool = True) -> None:
        """Post what is due now and wait for it. Raises a failure to post unless `raise_errors` is False (the run
        already failed: that failure is the one to report)."""
        self._now.set()
        posting, self._posting = self._posting, None
        if posting is None:
            return
        try:
            await posting
        except Exception:
            if raise_errors:
                raise

    async def _post(self, previous: asyncio.Task[None] | None, rollout_id: int, flow_run_id: Any) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._now.wait(), self.POST_DELAY)
        if previous is not None:
            await previous
        await publish_metrics_table(self.cfg, rollout_id, flow_run_id, self.records)
        if self.page is not None:
            await self.page.rollout_done(rollout_id)


async def publish_metrics_table(
    cfg: RunConfig, rollout_id: int, flow_run_id: uuid.UUID | None, records: list[dict[str, Any]]
) -> None:
    """One Prefect table artifact per rollout, on its `rollout-<id>` flow run, with every metric that flow run
    logged (of the run's `records`): rollout, step, perf and check records, and the evals it ran. Eval E runs
    after rollout E - 1, so its row is in that rollout's table, at slime's `eval/step` (the rollout id). The
    parent's `Publisher` posts it in the background."""
    from prefect.artifacts import TableArtifact

    rows = [
        {"kind": r["kind"], "step": r.get("step", ""), "metric": k, "value": v}
        for r in records
        if rundir.logged_by(r) == rollout_id
        for k, v in r["metrics"].items()
    ]
    key = f"{artifact_slug(cfg.name)}-rollout-{rollout_id}-metrics"
    await TableArtifact(
        key=key,
        description=f"metrics of rollout {rollout_id} of run {cfg.name}",
        table=rows,
        flow_run_id=flow_run_id,
    ).acreate()


@contextlib.contextmanager
def run_log(run_dir: Path) -> Iterator[Path]:
    """While inside, every log line of this process that reaches the root logger is appended to
    `<run dir>/logs/run.log`, in Prefect's console format, whatever the console shows. That covers Prefect's
    flow and task run lines, the `rollout N: {...}` records, tracebacks and warnings."""
    from prefect.logging.handlers import PrefectConsoleHandler

    path = run_dir / "logs" / "run.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    console = next((h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)), None)
    handler.setFormatter(
        console.formatter
        if console is not None and console.formatter is not None
        else logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s")
    )
    logging.getLogger().addHandler(handler)
    try:
        yield path
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def log_step_time(cfg: RunConfig, rollout_id: int, seconds: float) -> None:
    """The parent's record that rollout `rollout_id` completed (also the resume point's marker)."""
    log_metrics(cfg, "perf", rollout_id, {"perf/step_time": seconds}, sync=True)
