"""slime's dynamic sampling (DAPO): --over-sampling-batch-size and --dynamic-sampling-filter-path, for rollflow's own
generation (with or without --custom-generate-function-path), in the run's rollout actor. A --rollout-function-path
replaces slime's whole rollout, this included, as in slime.

Prompt groups are drawn --over-sampling-batch-size at a time, generated and scored. The filter keeps or drops
each group; it is called as slime calls it, ``filter(args, samples) -> DynamicFilterOutput`` (or a bool), on
each group of slime's samples. With no filter every group is kept. Groups are drawn again until
--rollout-batch-size groups are kept.

As in slime: a draw is made while fewer than --rollout-batch-size groups are kept or waiting to be judged.
Kept groups beyond the batch are discarded. A group rejected with ``keep_when_insufficient`` is kept when
dropping it would leave too few. Unlike slime, each draw is generated whole and judged in draw order (slime
judges groups as they finish). So which groups are kept depends only on the seeds, the rollout id and the
weights, and a replay or resume keeps the same ones.

Which prompts: draw ``k`` of rollout ``r`` takes the ``O`` prompts (``O`` = --over-sampling-batch-size) at
positions ``S_r + k*O ...`` of the data's visiting order. That order is the file's, or --rollout-shuffle's
per-epoch permutation. ``S_r = r * ceil(B/O) * O`` (``B`` = --rollout-batch-size). So the draws a rollout
always makes do not overlap the next rollout's. A draw beyond those takes the next rollout's prompts again
(with other seeds). Candidate group ``c`` of a rollout samples with the seeds of sample indices ``c*n ... c*n
+ n-1`` (``n`` = --n-samples-per-prompt). So with ``O = B`` and a filter that keeps everything, the rollout is
the plain one. The kept groups are renumbered 0..B-1 in draw order. Each sample's metadata records its draw
and candidate group. The file's metadata holds the counts that save-rollout logs
(``rollout/dynamic_sampling/*``, slime's ``rollout/dynamic_filter/drop_<reason>``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from artifacts.schema import Sample as Row
from rollout.extensions import load_function
from rollout.sample import from_row

if TYPE_CHECKING:
    from artifacts.store import ArtifactRef
    from config import RunConfig
    from rollout.finish import Tally
    from rollout.requests import Entry

METADATA_KEY = "dynamic_sampling"  # the rollout file's metadata entry, and each sample's


@dataclass
class DynamicFilterOutput:
    """What a dynamic sampling filter returns for one group (slime's type of the same name)."""

    keep: bool
    reason: str | None = None  # why it was dropped: counted as rollout/dynamic_filter/drop_<reason>
    # keep a rejected group when dropping it would leave too few groups to fill the batch (no extra draw)
    keep_when_insufficient: bool = False


def check_reward_nonzero_std(args: Any, samples: list[Any], **kwargs: Any) -> DynamicFilterOutput:
    """DAPO's filter: keep a group whose rewards are not all equal (standard deviation above 1e-6)."""
    rewards = [s.get_reward_value(args) for s in samples]
    mean = sum(rewards) / len(rewards)
    # slime takes torch's std (n - 1): zero exactly when the rewards are, and NaN for one sample, which drops it
    var = sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1) if len(rewards) > 1 else math.nan
    keep = math.sqrt(var) > 1e-6 if not math.isnan(var) else False
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


def check_reward_nonzero_std_with_fallback(
    args: Any, samples: list[Any], **kwargs: Any
) -> DynamicFilterOutput:
    """check_reward_nonzero_std, but a rejected group is kept rather than drawing again to fill the batch."""
    out = check_reward_nonzero_std(args, samples, **kwargs)
    out.keep_when_insufficient = True
    return out


# slime's own filters, named as a slime launch script names them
_SLIME_FILTERS = {
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std": check_reward_nonzero_std,
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback": (
        check_reward_nonzero_std_with_fallback
    ),
}


class FilterOutputError(TypeError):
    """A dynamic sampling filter returned something that is not a verdict; the message names it and the group."""


def load_filter(path: str) -> Callable[..., Any]:
    """The filter named by --dynamic-sampling-filter-path (slime's built-in paths name the ones above)."""
    return _SLIME_FILTERS.get(path) or load_function(path, "--dynamic-sampling-filter-path")


def judge(fn: Callable[..., Any], args: Any, group: list[Any], name: str) -> DynamicFilterOutput:
    """`fn(args, group)` as a DynamicFilterOutput: a bool is `keep` (slime's older filters), an object with a
    boolean `keep` is read as one; anything else is refused naming `name` and the group."""
    out = fn(args, group)
    verdict = hasattr(out, "keep")
    keep: Any = out.keep if verdict else out
    if hasattr(keep, "item"):  # a numpy bool, or a 0-dim tensor as slime's own filter computes it
        keep = keep.item()
    if not isinstance(keep, bool):
        raise FilterOutputError(
            f"--dynamic-sampling-filter-path {name} returned {type(out).__name__} for the group of sample "
            f"{getattr(group[0], 'index', '?')}: expected a bool or DynamicFilterOutput(keep=..., reason=...)"
        )
    if not verdict:  # a plain bool (slime's older filters)
        return DynamicFilterOutput(keep)
    reason = getattr(out, "reason", None)
    return DynamicFilterOutput(
        keep, None if reason is None else str(reason), bool(getattr(out, "keep_when_insufficient", False))
    )


@dataclass
class Selection:
    """The groups a rollout keeps (candidate index, rows) and what it took to find them."""

    kept: list[tuple[int, list[Row]]]
    draws: int  # draws of --over-sampling-batch-size groups
    drawn: int  # groups generated
    dropped: Counter[str]  # dropped groups by reason ("" when the filter gave none)

    def metrics(self) -> dict[str, float]:
        """The rollout's counts as logged (slime's drop_<reason> keys for the reasons the filter named)."""
        out: dict[str, float] = {
            "rollout/dynamic_sampling/draws": float(self.draws),
            "rollout/dynamic_sampling/drawn_groups": float(self.drawn),
            "rollout/dynamic_sampling/dropped_groups": float(sum(self.dropped.values())),
            "rollout/dynamic_sampling/kept_groups": float(len(self.kept)),
        }
        out.update({f"rollout/dynamic_filter/drop_{r}": float(n) for r, n in self.dropped.items() if r})
        return out


async def select_groups(
    target: int,
    over: int,
    keep: Callable[[list[Row]], DynamicFilterOutput],
    generate: Callable[[int, int], Awaitable[list[list[Row]]]],
    max_drawn: int,
) -> Selection:
    """slime's dynamic sampling loop (module docstring): `generate(first, count)` gives candidate groups
    first..first+count-1, generated and scored; `keep` judges one. More than `max_drawn` groups drawn without
    filling `target` is an error."""
    kept: list[tuple[int, list[Row]]] = []
    dropped: Counter[str] = Counter()
    drawn = draws = remaining = 0
    while len(kept) < target:
        first = drawn
        while remaining < target:  # as slime: draw while the kept and the undecided cannot fill the batch
            if drawn >= max_drawn:
                raise RuntimeError(
                    f"dynamic sampling drew {drawn} prompt groups and kept {len(kept)} of --rollout-batch-size "
                    f"{target} (dropped: {dict(dropped) or 0}); the filter rejects too much: use a filter that keeps "
                    "some groups anyway (e.g. check_reward_nonzero_std_with_fallback) or more prompt data"
                )
            drawn, remaining, draws = drawn + over, remaining + over, draws + 1
        for c, group in enumerate(await generate(first, drawn - first), start=first):
            out = keep(group)
            if not out.keep and not (out.keep_when_insufficient and remaining <= target):
                dropped[out.reason or ""] += 1
                remaining -= 1
            elif len(kept) < target:
                kept.append((c, group))
    return Selection(kept, draws, drawn, dropped)


def logged_metrics(rollout: ArtifactRef) -> dict[str, float]:
    """The dynamic sampling counts a rollout file records (none for a rollout drawn the plain way)."""
    from artifacts.store import read_metadata

    return dict(read_metadata(rollout).get(METADATA_KEY) or {})


def first_position(rollout_id: int, batch_size: int, over: int) -> int:
    """Where rollout `rollout_id`'s first draw starts in the visiting order (module docstring)."""
    return rollout_id * math.ceil(batch_size / over) * over


def renumbered(selection: Selection, n: int) -> list[Row]:
    """The kept groups as the rollout's rows: group i, sample indices i*n..., each recording its candidate group."""
    rows = []
    for g, (c, group) in enumerate(selection.kept):
        for j, row in enumerate(group):
            meta = {
                **row.metadata,
                METADATA_KEY: {"candidate_group": c, "candidate_sample_index": row.sample_index},
            }
            rows.append(dataclasses.replace(row, group_index=g, sample_index=g * n + j, metadata=meta))
    return rows


def candidate_entries(cfg: RunConfig, rollout_id: int, count: int) -> list[Entry]:
    """The entries of rollout `rollout_id`'s first `count` candidate groups (module docstring)."""
    from rollout.data import prompts_for_rollout
    from rollout.requests import build_requests
    from rollout.source import rollout_source, train_params

    src, r = rollout_source(cfg), cfg.rollout
    assert src.train is not None
    over = over_sampling(cfg)
    start = first_position(rollout_id, r.rollout_batch_size, over)
    # prompts_for_rollout with batch size 1 is the visiting order's one prompt at that position
    prompts = [
        prompts_for_rollout(src.train.prompts, 1, pos, r.rollout_seed, cfg.data.rollout_shuffle)[0]
        for pos in range(start, start + count)
    ]
    return build_requests(
        prompts, r.rollout_seed, rollout_id, r.n_samples_per_prompt, train_params(cfg, src.stops)
    )


def over_sampling(cfg: RunConfig) -> int:
    """Groups per draw: --over-sampling-batch-size, slime's default --rollout-batch-size."""
    return cfg.sampling.over_sampling_batch_size or cfg.rollout.rollout_batch_size


def dynamic_sampling(cfg: RunConfig) -> bool:
    """Whether the run's generation draws groups this way: a filter is set, or draws of another size. Not with a
    --rollout-function-path, which replaces the whole of slime's rollout, its dynamic sampling included (the flags
    are in its `args`)."""
    from rollout.plugins import rollout_function_path

    s = cfg.sampling
    drawn = s.dynamic_sampling_filter_path is not None or (
        s.over_sampling_batch_size not in (None, cfg.rollout.rollout_batch_size)
    )
    return drawn and rollout_function_path(cfg) is None


def check_sampling(cfg: RunConfig) -> None:
    """The sampling section's plug-ins, before anything starts: their paths import (ExtensionError), and a buffer
    filter has a rollout function to serve (ValueError)."""
    from rollout.plugins import rollout_function_path

    s = cfg.sampling
    if s.dynamic_sampling_filter_path:
        load_filter(s.dynamic_sampling_filter_path)
    if s.buffer_filter_path:
        if rollout_function_path(cfg) is None:
            raise ValueError(
                "--buffer-filter-path needs --rollout-function-path: groups enter slime's buffer only when a rollout "
                "function gives them back (data_source.add_samples) or --partial-rollout aborts them (not offered)"
            )
        load_function(s.buffer_filter_path, "--buffer-filter-path")


def _keep_all(args: Any, samples: list[Any], **kwargs: Any) -> DynamicFilterOutput:
    return DynamicFilterOutput(keep=True)


async def dynamic_rollout(
    cfg: RunConfig,
    rollout_id: int,
    engines: list[Any],
    weight_version: int,
    weights_sha256: str,
    path: str,
    ctx: dict[str, Any] | None = None,
) -> tuple[ArtifactRef, Tally]:
    """Generate rollout `rollout_id` on `engines` (all on `weight_version`) with dynamic sampling, score it, keep
    --rollout-batch-size groups and write them to `path` as rollout/finish.py writes a rollout (plus the counts)."""
    from rollout.finish import check_versions, in_entry_order, write_finished
    from rollout.requests import split_for_engines, to_samples
    from rollout.slime_args import slime_args
    from rollout.source import rollout_source, scoring_side

    tokenizer, stops, scorer, _ = scoring_side(cfg)
    r, path_name = cfg.rollout, cfg.sampling.dynamic_sampling_filter_path or ""
    fn = load_filter(path_name) if path_name else _keep_all
    args, n = slime_args(cfg), r.n_samples_per_prompt
    seconds = 0.0
    began = time.perf_counter()

    async def generate(first: int, count: int) -> list[list[Row]]:
        entries = candidate_entries(cfg, rollout_id, first + count)[first * n :]
        rows = await (plugged(entries) if cfg.rollout.custom_generate_function_path else plain(entries))
        return [rows[i : i + n] for i in range(0, len(rows), n)]

    async def plugged(entries: list[Entry]) -> list[Row]:
        """A draw generated by --custom-generate-function-path (rollout/plugins.py)."""
        nonlocal seconds
        from rollout.engine_client import EngineClient
        from rollout.plugins import context_length, generation_seconds, plugged_samples
        from rollout.requests import scored_rows

        t0 = time.perf_counter()
        client = EngineClient(
            engines, weight_version, ctx or {}, tokenizer, stops, max_len=context_length(cfg)
        )
        with client:
            samples = await plugged_samples(cfg, rollout_id, entries, client, scorer)
        seconds += generation_seconds(client, t0)
        return await scored_rows(
            entries, samples, scorer, rollout_id, group_rm=cfg.reward.group_rm, weight_version=weight_version
        )

    async def plain(entries: list[Entry]) -> list[Row]:
        """A draw generated by rollflow's own generation: one engine call per engine, as the plain rollout's."""
        nonlocal seconds
        parts = {i: p for i, p in enumerate(split_for_engines(entries, len(engines))) if p}
        answers = await asyncio.gather(
            *(
                engines[i].generate.remote([e.request for e in p], weight_version, ctx)
                for i, p in parts.items()
            )
        )
        seconds += max((a.seconds for a in answers), default=0.0)
        check_versions(
            dict(zip(parts, (a.outputs for a in answers), strict=True)),
            weight_version,
            rollout_id,
            "generate",
        )
        outputs = in_entry_order(entries, len(engines), [a.outputs for a in answers])
        return await to_samples(
            entries, outputs, tokenizer, stops, scorer, rollout_id, group_rm=cfg.reward.group_rm
        )

    src = rollout_source(cfg)
    assert src.train is not None
    over = over_sampling(cfg)
    selection = await select_groups(
        r.rollout_batch_size,
        over,
        lambda group: judge(fn, args, [from_row(row) for row in group], path_name),
        generate,
        # every prompt of the data drawn once more than the draws a rollout always makes
        max_drawn=len(src.train.prompts) + first_position(1, r.rollout_batch_size, over),
    )
    ref, tally = write_finished(
        cfg,
        rollout_id,
        renumbered(selection, n),
        weights_sha256,
        path,
        eval_mode=False,
        began=began,
        metadata={METADATA_KEY: selection.metrics()},
    )
    return ref, dataclasses.replace(tally, seconds=max(tally.seconds - seconds, 0.0), generation=seconds)
