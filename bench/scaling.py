"""How the cost grows with model size and response length: rollflow against TRL's GRPOTrainer and HF `generate`.

For each size (`--sizes`: 3.2M = the long-arith recipe, 50M = long-arith-50m, 0.5B = long-arith-0.5b, or any
recipe name) and response length (`--lengths`), one cell, its sides one after the other (a 0.5B model's sides
side by side would not fit in memory), on the same checkpoint, the same prompts (rollout i's prompts of the
recipe's data), P prompts x G samples (`--prompts`, `--group`), at most L new tokens, temperature 1.0, and the
same precision (`--precision`, resolved once as `rollflow run` resolves it):
  rollflow  a real run (`flows.run.run_flow` over Ray actors with a temporary Prefect server, as
            bench/overhead.py runs it; eval off, `--run-flags` added to its flags) of `--steps` rollouts, one
            optimizer step each. Per rollout: the generation (perf/rollout_time) and the engine's tokens/s
            (perf/tokens_per_sec), the log-prob pass (perf/log_probs_time; as a run does by default, it also
            runs the step's first micro-batch's forward and backward, fused), the train step
            (perf/actor_train_time: the other micro-batches and the optimizer's update), the weight sync (the `sync` task run's span, as Prefect recorded it), the
            rollout's wall time (perf/step_time). Peak resident memory (VmHWM) of every process of the run, and
            the run's memory at once: this bench reads /proc for the run's whole process tree (driver, Ray's
            processes and actors, the Prefect server) every half second and sums the processes' proportional
            set sizes (Pss: a page that several processes map, such as Ray's shared-memory object store,
            counts once, split between them; summed VmRSS would count it in every process).
  TRL       `GRPOTrainer` for `--steps` steps, as bench/vs_trl.py runs it (a child under `--trl-python` when this
            interpreter cannot import trl; `bf16=True`, CPU autocast, when the precision is bf16), its step's
            seconds and its memory at once, polled as the run's is (its process's VmHWM is given too).
  HF        `model.generate` (the checkpoint loaded in the engine's dtype: bfloat16 for bf16, float32 for fp32)
            and rollflow's TorchEngine alone on the same P x G rows (rollout 1's prompts, each G times),
            bench/generate.py's calls: tokens/s of each. One short warm-up call each, then
            `--generate-repeats` timed pairs (an engine call and an HF call one after the other, which goes first
            alternating from pair to pair). engine/HF is the median of the pairs' ratios: on a shared machine
            the ratio moves from pair to pair, and the two calls of a pair see about the same load.
Every side's processes start with the same GLIBC_TUNABLES and oneDNN / ideep kernel cache sizes: the settings a
run gives its local Ray (procs.with_malloc_tunables, procs.cap_kernel_caches), which TRL and HF get too (the
conditions line names them).
The length: every side stops a row at the model's EOS, as a run does; the random-weight models (50M, 0.5B: one
EOS among 151,936 ids) practically never sample it, so their rows run to L; the warm-started 3.2M model ends
its answers (64-256 tokens), so its rows can be shorter than L. The table gives the mean response length each
run produced and the fits use it. A length the model's positions cannot hold is refused by the run (the cell
says so).
Step 0 (rollout 0) of each side is a warm-up, left out of every mean. Cells of models of 20M parameters or more
hold an exclusive lock on `--lock` (fcntl.flock) while they run, so that one such job runs at a time on a
shared machine.

Then the fitted growth: the least-squares slope of log(seconds) against log(mean response tokens) per size, and
against log(parameters) per length, for each stage, with the cells each slope used (1.0 = linear).

    python bench/scaling.py [--sizes 3.2M,50M,0.5B] [--lengths 64,256,1024] [--steps 2] [--generate-repeats 3]
                            [--prompts 2] [--group 4] [--precision auto] [--trl-python PATH]
                            [--save bench/results/scaling.md]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import importlib.util
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artifacts.lint import checkpoint_numel  # noqa: E402
from bench._memory import PeakMemory  # noqa: E402
from bench._table import mean, table  # noqa: E402
from procs import KERNEL_CACHES, cap_kernel_caches, with_malloc_tunables  # noqa: E402

SIZES = {"3.2M": "long-arith", "50M": "long-arith-50m", "0.5B": "long-arith-0.5b"}
SMALL_RECIPES = {"tiny-arith", "long-arith"}  # below the size that takes the lock
LOCK = "/tmp/rollflow-big.lock"
# the stages whose growth is fitted: the rollout's stages, a TRL step and an HF generate call (seconds)
STAGES = ("generate", "log-prob", "train", "sync", "rollout", "TRL step", "HF generate")


# -- fitting ---------------------------------------------------------------------------------------------------


def loglog_slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x) over `points` (x, y > 0); None with fewer than two distinct x."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx, my = mean([x for x, _ in pts]), mean([y for _, y in pts])
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def growth(cells: list[Cell], along: str) -> list[tuple[str, str, dict[str, tuple[float | None, list[str]]]]]:
    """Per group of cells that differ only in `along` ("length": one group per size, x = the mean response
    tokens; "size": one group per length, x = the parameter count): (group, x name, {stage: (slope, the cells
    used)}); a stage is fitted over the cells that measured it."""
    out = []
    keys = sorted({(c.size if along == "length" else str(c.length)) for c in cells}, key=_order(cells, along))
    for key in keys:
        group = [c for c in cells if (c.size if along == "length" else str(c.length)) == key]
        fits: dict[str, tuple[float | None, list[str]]] = {}
        for stage in STAGES:
            used = [c for c in group if c.stage(stage) is not None and c.x(along) is not None]
            points = [(c.x(along), c.stage(stage)) for c in used]
            fits[stage] = (loglog_slope(points), [c.name for c in used])  # type: ignore[arg-type]
        out.append((key, "mean response tokens" if along == "length" else "parameters", fits))
    return out


def _order(cells: list[Cell], along: str) -> Any:
    sizes = [c.size for c in cells]
    return (lambda k: sizes.index(k)) if along == "length" else int


# -- one cell --------------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """What one size x length cell measured (means over the steps after the first; None = not measured)."""

    size: str
    recipe: str
    length: int
    params: int | None = None
    rollflow: dict[str, Any] = field(default_factory=dict)  # the --side rollflow child's JSON
    hf: dict[str, Any] = field(default_factory=dict)  # the --side hf child's JSON
    trl: list[float] = field(default_factory=list)  # seconds per TRL step, step 0 included
    trl_peak_gib: float | None = None  # TRL's memory at once, as mem_concurrent_gib
    trl_proc_gib: float | None = None  # TRL's process's VmHWM
    trl_seconds: float | None = None  # the TRL side's wall time, set-up included
    mem: dict[str, float] = field(default_factory=dict)  # the run's processes: label -> peak GiB
    mem_concurrent_gib: float | None = None  # the highest sum of the run's processes' Pss at one poll
    mem_at_peak: dict[str, float] = field(default_factory=dict)  # label -> its Pss at that poll, GiB
    notes: list[str] = field(default_factory=list)  # why a side did not measure
    seconds: float = 0.0  # the cell's wall time, all sides

    @property
    def name(self) -> str:
        return f"{self.size}x{self.length}"

    def engine_over_hf(self) -> float | None:
        """The engine's tokens/s over HF generate's alone: the median of the timed pairs' ratios."""
        ratios = self.hf.get("pair_ratios")
        return statistics.median(ratios) if ratios else None

    def perf(self, key: str) -> float | None:
        xs = self.rollflow.get("perf", {}).get(key, [])
        return mean(xs) if xs else None

    def stage(self, stage: str) -> float | None:
        """Mean seconds of `stage` (a STAGES name)."""
        if stage == "sync":
            xs = self.rollflow.get("sync", [])
            return mean(xs) if xs else None
        if stage == "TRL step":
            return mean(self.trl[1:]) if len(self.trl) > 1 else None
        if stage == "HF generate":
            return self.hf.get("hf_seconds")
        key = {
            "generate": "perf/rollout_time",
            "log-prob": "perf/log_probs_time",
            "train": "perf/actor_train_time",
            "rollout": "perf/step_time",
        }[stage]
        return self.perf(key)

    def response_tokens(self) -> float | None:
        """Mean tokens per response of the run (its engine's tokens over its samples)."""
        rate, seconds, n = (
            self.perf("perf/tokens_per_sec"),
            self.perf("perf/rollout_time"),
            self.rollflow.get("n"),
        )
        return rate * seconds / n if rate and seconds and n else None

    def x(self, along: str) -> float | None:
        return self.response_tokens() if along == "length" else self.params


@contextlib.contextmanager
def big_lock(path: str, held: bool) -> Iterator[None]:
    """An exclusive flock on `path` for the block when `held` (waits for whoever holds it)."""
    if not held:
        yield
        return
    with open(path, "a") as f:
        print(f"waiting for the lock {path} ...", flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_child(
    args: argparse.Namespace, side: str, recipe: str, length: int, out: Path
) -> tuple[dict[str, Any], dict[str, float], PeakMemory]:
    """Run `--side side` of one cell in a child process: its JSON (or {"error": ...}), the peak resident memory
    of each process of its tree (PeakMemory.stop) and the poller (its highest sum at one poll, and what made it)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--sizes", recipe]
    cmd += ["--lengths", str(length), "--steps", str(args.steps), "--prompts", str(args.prompts)]
    cmd += ["--group", str(args.group), "--precision", args.precision, "--threads", str(args.threads)]
    cmd += ["--generate-repeats", str(args.generate_repeats)]
    cmd += ["--run-flags", args.run_flags, "--out", str(out)]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd)
    memory = PeakMemory(proc.pid)
    memory.start()
    rc = proc.wait()
    peaks = memory.stop()
    result = json.loads(out.read_text()) if out.is_file() else {}
    if rc and "error" not in result:
        result["error"] = f"the {side} side exited with status {rc} (its output is above)"
    result["seconds"] = time.perf_counter() - began
    return result, peaks, memory


def trl_side(args: argparse.Namespace, cell: Cell, precision: str) -> None:
    """TRL's GRPOTrainer for --steps steps in a child (bench/vs_trl.py's); fills cell.trl and cell.trl_peak_gib."""
    from bench.vs_trl import TrlInLockstep

    ns = argparse.Namespace(
        recipe=cell.recipe,
        prompts=args.prompts,
        generations=args.group,
        completion_len=cell.length,
        steps=args.steps,
        threads=args.threads,
        trl_python=args.trl_python,
        precision=precision,
    )
    began = time.perf_counter()
    try:
        trl = TrlInLockstep(ns)
    except SystemExit as e:
        cell.notes.append(f"TRL: {e}")
        return
    memory = PeakMemory(trl.proc.pid)
    memory.start()
    try:
        for _ in range(args.steps):
            cell.trl.append(trl.step())
        trl.close()
    except SystemExit as e:
        cell.notes.append(f"TRL: {e}")
    finally:
        if trl.proc.poll() is None:
            trl.proc.kill()
            trl.proc.wait()
        peaks = memory.stop()
        cell.trl_seconds = time.perf_counter() - began
    cell.trl_peak_gib = memory.concurrent if peaks else None
    cell.trl_proc_gib = max(peaks.values()) if peaks else None


def trl_missing(args: argparse.Namespace) -> str | None:
    """Why the TRL side cannot run here, or None."""
    if args.no_trl:
        return "--no-trl"
    if importlib.util.find_spec("trl") is None and args.trl_python is None:
        return (
            "trl is not importable by this interpreter and no --trl-python was given "
            "(`ROLLFLOW_EXTRAS=dev,bench scripts/setup` installs it into .venv)"
        )
    return None


def resolved_precision(requested: str) -> tuple[str, str]:
    """(bf16 | fp32, why) as `rollflow run` resolves `--precision requested` on this machine."""
    from config.precision import read_cpu_flags, resolve_precision

    return resolve_precision(requested, read_cpu_flags())


def measure_cell(args: argparse.Namespace, size: str, recipe: str, length: int, work: Path) -> Cell:
    cell, began = Cell(size, recipe, length), time.perf_counter()
    print(f"\n=== {cell.name} ({recipe}) ===", flush=True)
    precision, _ = resolved_precision(args.precision)
    with big_lock(args.lock, recipe not in SMALL_RECIPES):
        run, cell.mem, memory = run_child(
            args, "rollflow", recipe, length, work / f"{cell.name}-rollflow.json"
        )
        cell.mem_concurrent_gib, cell.mem_at_peak = memory.concurrent, memory.at_peak
        cell.rollflow = run
        # the run's figures as soon as it ends: the other sides of a big cell take many minutes more
        print(
            f"{cell.name} rollflow: "
            + ", ".join(f"{h} {v}" for h, v in zip(HEADER, row(cell), strict=True) if v != "-")
        )
        if "error" in run:
            cell.notes.append(f"rollflow: {run['error']}")
        if run.get("checkpoint"):
            cell.params = checkpoint_numel(Path(run["checkpoint"]))
        if "error" not in run:  # a length the model cannot hold is refused the same way by every side
            why = trl_missing(args)
            if why:
                cell.notes.append(f"TRL skipped: {why}")
            else:
                trl_side(args, cell, precision)
            if not args.no_hf:
                hf, hf_mem, _ = run_child(args, "hf", recipe, length, work / f"{cell.name}-hf.json")
                cell.hf = {**hf, "peak_gib": max(hf_mem.values(), default=None)}
                if "error" in hf:
                    cell.notes.append(f"HF: {hf['error']}")
    cell.seconds = time.perf_counter() - began
    print(f"=== {cell.name}: {cell.seconds:.0f} s ===", flush=True)
    return cell


# -- the children ----------------------------------------------------------------------------------------------


def run_flags(args: argparse.Namespace, recipe: str, length: int, run_dir: Path, precision: str) -> list[str]:
    """The `rollflow run` flags of one cell's run (eval is turned off after parsing)."""
    n = args.prompts * args.group
    flags = ["run", "--recipe", recipe, "--run-dir", str(run_dir), "--name", f"scaling-{recipe}-{length}"]
    flags += ["--num-rollout", str(args.steps), "--rollout-batch-size", str(args.prompts)]
    flags += ["--n-samples-per-prompt", str(args.group), "--rollout-max-response-len", str(length)]
    flags += ["--global-batch-size", str(n), "--num-threads", str(args.threads), "--precision", precision]
    return flags + shlex.split(args.run_flags)


def cell_config(args: argparse.Namespace, recipe: str, length: int, run_dir: Path, precision: str) -> Any:
    """The cell's RunConfig, parsed from its flags as `rollflow run` parses them; eval off."""
    from flows.cli import build_config, parse_args

    cfg = build_config(parse_args(run_flags(args, recipe, length, run_dir, precision)))
    return cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"eval_interval": None})})


def rollflow_child(args: argparse.Namespace, out: Path) -> None:
    """--side rollflow: one real run of the cell; writes its per-rollout figures (rollout 0 left out) to `out`."""
    from bench._flow_run import Timeline, flow_perf, flow_rollouts  # sets Prefect's and Ray's env first
    from flows.resolve import resolve

    recipe, length = args.sizes, int(args.lengths)
    precision, why = resolved_precision(args.precision)
    # removed once measured: a large model's step-boundary snapshots and checkpoint take many GB
    with tempfile.TemporaryDirectory(prefix="rf-bench-scaling-") as tmp:
        run_dir = Path(tmp) / "run"
        try:
            cfg = cell_config(args, recipe, length, run_dir, precision)
            # builds the recipe's checkpoint; a length the model cannot hold is named here
            resolved, _ = resolve(cfg)
        except ValueError as e:
            out.write_text(json.dumps({"error": str(e)}))
            return
        timeline = Timeline()
        durations, _, _, _, wall = flow_rollouts(cfg, timeline)
        perf = flow_perf(cfg.resolved_run_dir, timeline.evaluating)
    result = {
        "checkpoint": resolved.hf_checkpoint,
        "precision": precision,
        "precision_why": why,
        "n": args.prompts * args.group,
        "perf": perf,
        "sync": [end - start for start, end in timeline.tasks.get("sync", [])],
        "flow_run": durations[1:],
        "run_wall": wall,
    }
    out.write_text(json.dumps(result))


def hf_child(args: argparse.Namespace, out: Path) -> None:
    """--side hf: HF generate and the TorchEngine alone, alternated on rollout 1's P x G rows; writes tokens/s."""
    import torch
    from transformers import AutoModelForCausalLM

    from bench._flops import decode_products_seconds
    from bench.generate import engine_call, hf_call
    from engines.torch_engine.engine import TorchEngine
    from flows.resolve import resolve
    from rollout.data import prompts_for_rollout

    recipe, length = args.sizes, int(args.lengths)
    precision, _ = resolved_precision(args.precision)
    with tempfile.TemporaryDirectory(prefix="rf-bench-scaling-") as tmp:  # the run dir is never written
        cfg, src = resolve(cell_config(args, recipe, length, Path(tmp) / "run", precision))
    assert src.train is not None and cfg.hf_checkpoint is not None
    prompts = prompts_for_rollout(
        src.train.prompts, args.prompts, 1, cfg.rollout.rollout_seed, cfg.data.rollout_shuffle
    )
    rows = [list(p.tokens) for p in prompts for _ in range(args.group)]
    tok = src.tokenizer
    eos, pad = (
        int(tok.eos_token_id),
        int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id),
    )
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.set_num_threads(args.threads)
    engine = TorchEngine(
        cfg.hf_checkpoint, num_threads=args.threads, max_batch_size=len(rows), precision=precision
    )
    model = AutoModelForCausalLM.from_pretrained(cfg.hf_checkpoint, dtype=dtype).eval()
    stops = tuple(src.stops.ids)
    engine_call(engine, rows, min(length, 8), stops, seed=10_000)  # warm-up
    hf_call(model, rows, min(length, 8), eos, pad, False, seed=10_000)
    calls = {
        "engine": lambda seed: engine_call(engine, rows, length, stops, seed=seed),
        "hf": lambda seed: hf_call(model, rows, length, eos, pad, False, seed=seed),
    }
    totals = {"engine": [0, 0.0], "hf": [0, 0.0]}
    ratios = []  # each pair's engine tokens/s over HF's
    repeats = args.generate_repeats
    for r in range(repeats):
        pair = {side: calls[side](r) for side in (("engine", "hf") if r % 2 == 0 else ("hf", "engine"))}
        for side, (n, s) in pair.items():
            totals[side][0] += n
            totals[side][1] += s
        (n_e, s_e), (n_h, s_h) = pair["engine"], pair["hf"]
        ratios.append((n_e / s_e) / (n_h / s_h))
    assert engine._fast is not None  # built by the calls above
    result = {
        "dtype": str(dtype).removeprefix("torch."),
        "rows": len(rows),
        "products_s": decode_products_seconds(engine._fast, len(rows)),
        "engine_tps": totals["engine"][0] / totals["engine"][1],
        "hf_tps": totals["hf"][0] / totals["hf"][1],
        "pair_ratios": ratios,
        "hf_seconds": totals["hf"][1] / repeats,
        "engine_tokens_per_row": totals["engine"][0] / repeats / len(rows),
        "hf_tokens_per_row": totals["hf"][0] / repeats / len(rows),
    }
    out.write_text(json.dumps(result))


# -- the report ------------------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


HEADER = [
    "cell",
    "params",
    "resp tok",
    "generate s",
    "log-prob pass s",
    "train step s",
    "sync s",
    "rollout s",
    "engine tok/s (run)",
    "engine tok/s (alone)",
    "HF tok/s",
    "engine/HF",
    "TRL step s",
    "rollflow/TRL",
    "sync % of step",
    "rollflow peak GiB (at once / sum / max proc)",
    "TRL peak GiB",
]


def row(c: Cell) -> list[str]:
    step, trl = c.stage("rollout"), c.stage("TRL step")
    sync = c.stage("sync")
    e_alone, hf = c.hf.get("engine_tps"), c.hf.get("hf_tps")
    mem = (
        f"{c.mem_concurrent_gib:.2f} / {sum(c.mem.values()):.2f} / {max(c.mem.values()):.2f}"
        if c.mem and c.mem_concurrent_gib is not None and "error" not in c.rollflow
        else "-"
    )
    return [
        c.name,
        _f(c.params / 1e6, "{:.1f}M") if c.params else "-",
        _f(c.response_tokens(), "{:.0f}"),
        _f(c.stage("generate")),
        _f(c.stage("log-prob")),
        _f(c.stage("train")),
        _f(sync),
        _f(step),
        _f(c.perf("perf/tokens_per_sec"), "{:,.0f}"),
        _f(e_alone, "{:,.0f}"),
        _f(hf, "{:,.0f}"),
        _f(c.engine_over_hf(), "{:.2f}x"),
        _f(trl),
        _f(step / trl if step and trl else None, "{:.2f}x"),
        _f(100 * sync / step if sync and step else None, "{:.1f} %"),
        mem,
        _f(c.trl_peak_gib),
    ]


def fit_lines(cells: list[Cell]) -> list[str]:
    """The fitted growth, one line per group and stage that has a slope."""
    lines = []
    for along in ("length", "size"):
        for key, xname, fits in growth(cells, along):
            group = f"size {key}" if along == "length" else f"length {key}"
            for stage, (slope, used) in fits.items():
                if slope is not None:
                    lines.append(f"{group}: {stage} time ~ ({xname})^{slope:.2f}  (cells {', '.join(used)})")
    return lines


def targets(cells: list[Cell]) -> list[str]:
    """The issue's targets at 0.5B and 256 tokens, met or not (or not measured)."""
    cell = next((c for c in cells if c.size == "0.5B" and c.length == 256), None)
    if cell is None:
        return ["targets (0.5B x 256): not measured in this invocation"]
    step, trl, sync = cell.stage("rollout"), cell.stage("TRL step"), cell.stage("sync")
    peak = cell.mem_concurrent_gib

    def verdict(value: float | None, bound: float, text: str, fmt: str, lower_is_better: bool = True) -> str:
        if value is None:
            return f"{text}: not measured"
        ok = value <= bound if lower_is_better else value >= bound
        return f"{text}: {fmt.format(value)} -> {'met' if ok else 'NOT met'}"

    return [
        "targets (0.5B x 256):",
        "  " + verdict(step / trl if step and trl else None, 0.5, "RL step / TRL's <= 0.5x", "{:.2f}x"),
        "  "
        + verdict(cell.engine_over_hf(), 2.0, "engine / HF generate >= 2x (median pair)", "{:.2f}x", False),
        "  " + verdict(sync / step if sync and step else None, 0.10, "sync <= 10 % of the step", "{:.1%}"),
        "  "
        + verdict(
            peak / cell.trl_peak_gib if peak and cell.trl_peak_gib else None,
            1.0,
            "peak memory (the run's processes at once) <= TRL's",
            "{:.2f}x TRL's",
        ),
    ]


def machine(threads: int) -> str:
    """The CPU's model name, its cores and bf16 flags, and the torch threads each side used."""
    from config.precision import BF16_CPU_FLAGS, read_cpu_flags

    name = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    bf16 = [f for f in BF16_CPU_FLAGS if f in read_cpu_flags()]
    return f"{name} ({', '.join(bf16) or 'no bf16 flags'}), {os.cpu_count()} cores, {threads} torch thread(s) a side"


def conditions(args: argparse.Namespace, cells: list[Cell]) -> str:
    """One paragraph: the work of every cell, the precision and the run's flags."""
    precisions = {c.rollflow.get("precision") for c in cells} - {None}
    why = {c.rollflow.get("precision_why") for c in cells} - {None}
    dtypes = {c.hf.get("dtype") for c in cells} - {None}
    return (
        f"{args.prompts} prompts x {args.group} samples a step, {args.steps} steps a side (step 0 left out), "
        f"the sides one after the other; precision {', '.join(sorted(precisions)) or args.precision} "
        f"({'; '.join(sorted(why)) or '-'}), the HF model in {', '.join(sorted(dtypes)) or '-'}; extra run flags: "
        f"{args.run_flags or '(none)'}. Memory at once: the Pss of every process of a side summed, its highest "
        "at one poll (every half second; shared pages such as Ray's object store count once). Every side's "
        f"processes start with GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')} and "
        + ", ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in KERNEL_CACHES)
        + "."
        + (f" {args.note}" if args.note else "")
    )


def took(c: Cell) -> str:
    """How long the cell and each of its sides took (set-up included)."""
    sides = [
        (name, x)
        for name, x in (
            ("rollflow run", c.rollflow.get("seconds")),
            ("TRL", c.trl_seconds),
            ("HF and engine alone", c.hf.get("seconds")),
        )
        if x is not None
    ]
    return f"{c.seconds:.0f} s in all (" + ", ".join(f"{n} {x:.0f} s" for n, x in sides) + ")"


def report(args: argparse.Namespace, cells: list[Cell]) -> str:
    """The table, its conditions, each cell's notes and memory by process, the fits and the targets."""
    lines = [
        f"{machine(args.threads)}; {conditions(args, cells)}",
        "",
        table(HEADER, [row(c) for c in cells]),
        "",
    ]
    lines += [line for c in cells for line in cell_lines(c)]
    lines += ["", "Fitted growth (log-log least-squares slope; 1.0 = linear):", *fit_lines(cells), ""]
    return "\n".join(lines + targets(cells))


def cell_lines(c: Cell) -> list[str]:
    """How long the cell took, why a side did not measure, and the peak memory of each process of its run."""
    lines = [f"{c.name}: {took(c)}" + "".join(f"; {n}" for n in c.notes)]
    if c.mem:
        procs = ", ".join(f"{k} {v:.2f}" for k, v in c.mem.items())
        lines.append(
            f"  peak GiB by process: {procs}; the run's memory at its highest (Pss summed, polled every half "
            f"second): {c.mem_concurrent_gib:.2f}"
            + (f"; TRL's process peaked at {c.trl_proc_gib:.2f}" if c.trl_proc_gib else "")
        )
    if (median := c.engine_over_hf()) is not None:
        lines.append(
            f"  engine/HF tokens/s by timed pair (the engine's call first in pairs 1, 3, ...): "
            f"{', '.join(f'{r:.2f}x' for r in c.hf['pair_ratios'])}; median {median:.2f}x"
        )
    products, hf = c.hf.get("products_s"), c.hf.get("hf_tps")
    if products and hf:  # each decode step gives every row a token
        ceiling = c.hf["rows"] / products
        lines.append(
            f"  the engine's weight products alone, one decode step of {c.hf['rows']} rows: {products * 1e3:.1f} ms, "
            f"a ceiling of {ceiling:,.0f} tok/s = {ceiling / hf:.2f}x HF generate"
        )
    if c.mem_at_peak:
        at_peak = sorted(c.mem_at_peak.items(), key=lambda kv: -kv[1])
        lines.append(
            "  at the run's highest, Pss GiB by process: " + ", ".join(f"{k} {v:.2f}" for k, v in at_peak)
        )
    return lines


def markdown(args: argparse.Namespace, cells: list[Cell]) -> str:
    """The report as a bench/results file: the header block bench/results/README.md describes, then the table,
    each cell's lines, the fits and the targets."""
    command = " ".join(["python bench/scaling.py", *(shlex.quote(a) for a in sys.argv[1:])])
    out = [
        "---",
        "title: How the cost grows with model size and response length",
        f"command: {command}",
        f"measured: {datetime.datetime.now(datetime.UTC):%Y-%m-%d}",
        f"machine: {machine(args.threads)}",
        "---",
        conditions(args, cells),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *["| " + " | ".join(row(c)) + " |" for c in cells],
        "",
        *[f"- {line.strip()}" for c in cells for line in cell_lines(c)],
        "",
        "Fitted growth (log-log least-squares slope; 1.0 = linear):",
        "",
        *[f"- {line}" for line in fit_lines(cells)],
        "",
        *[f"- {line.strip()}" if line.startswith("  ") else line for line in targets(cells)],
        "",
    ]
    return "\n".join(out)


def cell_plan(sizes: str, lengths: str, cells: str | None, recipes: list[str]) -> list[tuple[str, int]]:
    """The (size, length) cells to measure, in order: `cells` ("0.5Bx256,3.2Mx64", in that order) when given,
    else every size of `sizes` with every length of `lengths`; ValueError naming a size that is no size or recipe,
    or a length that is not a positive count."""

    def size_of(s: str) -> str:
        if SIZES.get(s, s) not in recipes:
            raise ValueError(f"unknown size or recipe {s!r}; sizes {sorted(SIZES)}, recipes {recipes}")
        return s

    def length_of(x: str) -> int:
        if not x.isdigit() or int(x) < 1:
            raise ValueError(f"length {x!r}: expected a positive token count")
        return int(x)

    if cells:
        plan = []
        for cell in cells.split(","):
            size, sep, length = cell.rpartition("x")
            if not sep:
                raise ValueError(f"--cells {cell!r}: expected SIZExLENGTH, e.g. 0.5Bx256")
            plan.append((size_of(size), length_of(length)))
        return plan
    return [(size_of(s), length_of(x)) for s in sizes.split(",") if s for x in lengths.split(",") if x]


def _grid(plan: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """`plan`'s cells ordered by size (SIZES' order, then other recipes as first named), then length: the table's
    order."""
    sizes = [s for s in SIZES if any(s == c[0] for c in plan)] + list(
        dict.fromkeys(s for s, _ in plan if s not in SIZES)
    )
    return sorted(plan, key=lambda c: (sizes.index(c[0]), c[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes",
        default="3.2M,50M,0.5B",
        help=f"comma-separated sizes ({', '.join(f'{k} = {v}' for k, v in SIZES.items())}) or recipe names",
    )
    p.add_argument(
        "--lengths", default="64,256,1024", help="comma-separated response lengths (max new tokens)"
    )
    p.add_argument(
        "--cells",
        default=None,
        help="SIZExLENGTH cells in the order to measure them (e.g. 0.5Bx256,3.2Mx64); overrides --sizes/--lengths",
    )
    p.add_argument("--steps", type=int, default=2, help="steps (rollouts) per side; step 0 is the warm-up")
    p.add_argument(
        "--generate-repeats",
        type=int,
        default=3,
        help="timed pairs of HF generate and the engine alone (engine/HF is their median ratio)",
    )
    p.add_argument("--prompts", type=int, default=2, help="P, prompts per step")
    p.add_argument("--group", type=int, default=4, help="G, samples per prompt (the GRPO group)")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto", help="as rollflow run's")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every side")
    p.add_argument(
        "--run-flags", default="", help="more `rollflow run` flags for the rollflow side, one string"
    )
    p.add_argument("--trl-python", default=None, help="interpreter for TRL when this one cannot import trl")
    p.add_argument("--no-trl", action="store_true", help="leave the TRL side out")
    p.add_argument("--no-hf", action="store_true", help="leave the HF generate side out")
    p.add_argument("--lock", default=LOCK, help="the lock file cells of 20M+ parameters hold while they run")
    p.add_argument(
        "--save",
        default=None,
        help="also write the report to this bench/results file (its header block first)",
    )
    p.add_argument(
        "--note", default="", help="a sentence added to the conditions (e.g. what else loaded the CPU)"
    )
    p.add_argument("--side", choices=["rollflow", "hf"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be >= 2 (step 0 is the warm-up)")
    if args.generate_repeats < 1:
        p.error("--generate-repeats must be >= 1")
    if args.side == "rollflow":
        rollflow_child(args, Path(args.out))
        return
    if args.side == "hf":
        hf_child(args, Path(args.out))
        return

    from recipes.registry import RECIPES

    try:
        plan = cell_plan(args.sizes, args.lengths, args.cells, sorted(RECIPES))
    except ValueError as e:
        p.error(str(e))
    # TRL and HF allocate and cache kernels as the run's Ray processes do, whatever this process imported
    os.environ["GLIBC_TUNABLES"] = with_malloc_tunables(os.environ.get("GLIBC_TUNABLES"))
    cap_kernel_caches(os.environ)
    why = trl_missing(args)
    if why:
        print(f"TRL side skipped: {why}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="rf-bench-scaling-"))  # the sides' JSON answers, a few KB a cell
    cells: list[Cell] = []
    for size, length in plan:
        cells.append(measure_cell(args, size, SIZES.get(size, size), length, work))
        cells.sort(key=lambda c: _grid(plan).index((c.size, c.length)))
        # after every cell: a long invocation stopped early keeps what it measured
        print("\n" + report(args, cells), flush=True)
        if args.save:
            Path(args.save).parent.mkdir(parents=True, exist_ok=True)
            Path(args.save).write_text(markdown(args, cells))
            print(f"\nwrote {args.save} ({len(cells)} cell(s))", flush=True)


if __name__ == "__main__":
    main()
