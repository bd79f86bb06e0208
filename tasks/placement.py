"""The run's slots as one placement group, slime's pattern (`slime/ray/placement_group.py`). It is one PACK
group of one bundle per slot. Its bundles are ordered by node, so that consecutive trainer ranks share a node.
Trainer and engine actors are scheduled into their bundles with fractional requests, so a trainer and an
engine fit one slot together under --colocate.

`layout` is the pure part (from the config alone); `place` creates the group in Ray and reads back which node
holds each bundle. The actors of a run, and every replacement of one (tasks/recovery.py), go to the bundles
recorded here, so a re-created actor lands where the one it replaces was.
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from config import SLOT_RESOURCE, RunConfig
from tasks import notify

# slime's shares of a slot (0.4 for a trainer, 0.2 for an engine): a colocated pair fits one slot, and so does a
# replacement beside the actor it replaces while Ray still holds that one's share
TRAINER_SHARE = 0.4
ENGINE_SHARE = 0.2
LOCAL = "a local Ray (no --ray-address)"  # what a run without --ray-address places its actors on
WAIT_REPORT_S = 30.0  # while the group cannot be placed yet, say so this often (slime's interval)


@dataclass(frozen=True)
class Layout:
    """The bundles of the run's placement group and which role uses which."""

    bundles: tuple[dict[str, float], ...]
    trainer_bundles: tuple[int, ...]  # one per trainer rank
    engine_bundles: tuple[int, ...]  # every engine slot: --rollout-num-gpus-per-engine of them per engine
    slots_per_engine: int

    def needs(self) -> dict[str, float]:
        """The resources the whole group takes from the cluster."""
        total: dict[str, float] = {}
        for bundle in self.bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        return total


def layout(cfg: RunConfig) -> Layout:
    """One bundle per slot: the trainer ranks' slots first, then the engines' (slime's order); under --colocate
    one set of bundles that both roles use from the first on. Roles the mode leaves out (--debug-train-only,
    --debug-rollout-only) take no slots."""
    p = cfg.placement
    trainers = 0 if cfg.rollout_only else cfg.trainer_world_size
    engine_slots = 0 if cfg.train_only else cfg.rollout.rollout_slots
    per_engine = cfg.rollout.rollout_num_gpus_per_engine
    slot = {p.slot_resource: 1.0}
    if p.colocate:
        shared = {**slot, **p.rollout_resources, **p.actor_resources}
        return Layout(
            (shared,) * max(trainers, engine_slots),
            tuple(range(trainers)),
            tuple(range(engine_slots)),
            per_engine,
        )
    # a role's own resources may also add to (or resize) the slot, e.g. {"CPU": 4} beside each GPU
    bundles = (({**slot, **p.actor_resources},) * trainers) + (
        ({**slot, **p.rollout_resources},) * engine_slots
    )
    return Layout(
        bundles, tuple(range(trainers)), tuple(range(trainers, trainers + engine_slots)), per_engine
    )


def local_resources(cfg: RunConfig) -> dict[str, float]:
    """The custom resources a local Ray started for `cfg` declares: the run's slots when they are a custom
    resource (a machine's CPUs and GPUs are its own). Declaring them starts no process, unlike CPUs (Ray starts
    one idle worker per declared CPU), so the default local run costs what it did before placement existed."""
    slot = cfg.placement.slot_resource
    if slot in ("CPU", "GPU"):
        return {}
    return {slot: layout(cfg).needs().get(slot, 0.0)}


def shortfall(
    needs: dict[str, float], have: dict[str, float], where: str = "the cluster", hint: str | None = None
) -> str | None:
    """Why `where` (a cluster holding `have` in all) can never place a group that needs `needs`, with `hint` (else
    one for a cluster) on what to do; None when it can."""
    short = {
        name: (amount, have.get(name, 0.0)) for name, amount in needs.items() if have.get(name, 0.0) < amount
    }
    if not short:
        return None
    parts = [f"{need:g} {name} ({where} has {got:g})" for name, (need, got) in sorted(short.items())]
    hint = hint or (
        "declare process slots on every node, `ray start --resources '{\""
        + SLOT_RESOURCE
        + "\": N}'` (N = the "
        "processes it may host), or pass --slot-resource GPU / CPU"
        if SLOT_RESOURCE in short
        else "start nodes that declare them (`ray start --resources '{...}'`), or change --slot-resource, "
        "--actor-resources or --rollout-resources"
    )
    return f"the run's placement group needs {', '.join(parts)}: {hint}"


def local_cluster(cfg: RunConfig) -> dict[str, float]:
    """What the local Ray that `tasks.actors.ensure_ray` starts for `cfg` will hold, known before it starts.
    That is this machine's CPUs (as ensure_ray declares them), its GPUs, and the run's slots when they are a
    custom resource."""
    import os

    have = {"CPU": float(max(2, os.cpu_count() or 2)), **local_resources(cfg)}
    if "GPU" in layout(cfg).needs():  # counting them imports torch: only when the run asks for GPUs
        have["GPU"] = float(_local_gpus())
    return have


def _local_gpus() -> int:
    """GPUs this machine shows (CUDA's count, as Ray detects them; 0 without a CUDA torch)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cluster_problem(cfg: RunConfig, have: dict[str, float], nodes: int, where: str) -> str | None:
    """Why `where` (a cluster of `nodes` alive nodes holding `have` in all) can never hold the run's actors,
    naming the flags that ask for more; None when it can."""
    p = cfg.placement
    if not cfg.rollout_only and p.actor_num_nodes > nodes:
        return f"--actor-num-nodes {p.actor_num_nodes}: {where} has {nodes} node(s)"
    needs = layout(cfg).needs()
    hint = (
        "join a cluster that has them with --ray-address, or change --slot-resource, --actor-resources or "
        "--rollout-resources"
    )
    why = shortfall(needs, have, where, hint if where == LOCAL else None)
    if why is None:
        return None
    short = {n for n, amount in needs.items() if have.get(n, 0.0) < amount}
    flags = [
        flag
        for flag, names in (
            (f"--slot-resource {p.slot_resource}", {p.slot_resource}),
            ("--actor-resources", set(p.actor_resources)),
            ("--rollout-resources", set(p.rollout_resources)),
        )
        if names & short
    ]
    return f"{', '.join(flags)}: {why}"


def _ip_key(ip: str) -> tuple[int, int, str]:
    """Sort key of a node address: addresses numerically (slime's order), a hostname after them by name."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return (9, 0, ip)
    return (address.version, int(address), "")


def by_node(bundles: tuple[int, ...], nodes: dict[int, tuple[str, str]]) -> tuple[int, ...]:
    """`bundles` ordered by the node holding each ((ip, node id) in `nodes`), then by index. So ranks that
    follow each other share a node, as slime orders its bundles: a tensor-parallel group should not span
    nodes."""
    return tuple(sorted(bundles, key=lambda b: (_ip_key(nodes[b][0]), nodes[b][1], b)))


@dataclass(frozen=True)
class Placement:
    """The run's placement group in Ray, and the bundle of every trainer rank and engine."""

    group: Any  # ray.util.placement_group.PlacementGroup
    slot: str
    trainers: tuple[int, ...]  # bundle of each trainer rank, in rank order
    engines: tuple[int, ...]  # the first bundle of each engine, in engine order
    nodes: dict[int, tuple[str, str]] = field(default_factory=dict)  # bundle -> (node ip, node id)

    def trainer_options(self, rank: int) -> dict[str, Any]:
        """Ray actor options that put trainer `rank` in its bundle."""
        return self._options(self.trainers[rank], TRAINER_SHARE)

    def engine_options(self, index: int) -> dict[str, Any]:
        """Ray actor options that put engine `index` in its (first) bundle."""
        return self._options(self.engines[index], ENGINE_SHARE)

    def _options(self, bundle: int, share: float) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=bundle
        )
        if self.slot == "GPU":  # Ray then sets CUDA_VISIBLE_DEVICES to the bundle's GPU
            return {"num_gpus": share, "scheduling_strategy": strategy}
        if self.slot == "CPU":
            return {"num_cpus": share, "scheduling_strategy": strategy}
        return {"resources": {self.slot: share}, "scheduling_strategy": strategy}

    def describe(self) -> list[str]:
        """One line per actor: where it runs (as slime logs its bundles)."""

        def where(b: int) -> str:
            ip, node = self.nodes.get(b, ("?", "?"))
            return f"bundle {b} on node {ip} ({node[:8]})"

        return [f"trainer rank {r}: {where(b)}" for r, b in enumerate(self.trainers)] + [
            f"engine {i}: {where(b)}" for i, b in enumerate(self.engines)
        ]


async def place(cfg: RunConfig) -> Placement:
    """Create the run's placement group, wait until Ray has placed it, and record which node holds each bundle.
    Refused at once when the cluster could never hold it (too few slots or resources in all)."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    lay = layout(cfg)
    alive = sum(1 for n in ray.nodes() if n.get("Alive"))
    where = f"the cluster at --ray-address {cfg.ray_address}" if cfg.ray_address else LOCAL
    why = cluster_problem(cfg, ray.cluster_resources(), alive, where)
    if why:
        raise RuntimeError(why)
    group = placement_group(list(lay.bundles), strategy="PACK")
    await _ready(group, lay)
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    nodes = {
        int(b): (ips.get(node, "?"), node)
        for b, node in placement_group_table(group)["bundles_to_node_id"].items()
    }
    engine_slots = by_node(lay.engine_bundles, nodes)
    placement = Placement(
        group,
        cfg.placement.slot_resource,
        by_node(lay.trainer_bundles, nodes),
        engine_slots[:: lay.slots_per_engine],
        nodes,
    )
    tell(
        cfg,
        f"placement: {len(lay.bundles)} slot(s) of {cfg.placement.slot_resource}"
        + (" (colocated)" if cfg.placement.colocate else "")
        + "\n  "
        + "\n  ".join(placement.describe()),
    )
    return placement


async def _ready(group: Any, lay: Layout) -> None:
    """Wait, without a bound, until the group is placed (slots held by another run free up, or an autoscaler adds
    nodes), saying every WAIT_REPORT_S seconds what it waits for."""
    import ray

    ready = asyncio.ensure_future(group.ready())
    waited = 0.0
    while not (await asyncio.wait({ready}, timeout=WAIT_REPORT_S))[0]:
        waited += WAIT_REPORT_S
        free = ray.available_resources()
        wanted = ", ".join(
            f"{need:g} {name} ({free.get(name, 0.0):g} free now)"
            for name, need in sorted(lay.needs().items())
        )
        notify.notice(
            f"placement: still waiting after {waited:g} s for {len(lay.bundles)} bundle(s) needing {wanted}"
        )
    ready.result()


def remove(placement: Placement) -> None:
    """Give the group's resources back to the cluster (its actors must be gone already)."""
    from ray.util.placement_group import remove_placement_group

    remove_placement_group(placement.group)


def tell(cfg: RunConfig, text: str) -> None:
    """Where the actors went: a console line when the run joined a cluster (`--ray-address`), where it is news;
    only the run's log for a local Ray, where everything is on this machine."""
    (notify.notice if cfg.ray_address else notify.say)(text)
