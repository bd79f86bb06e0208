"""Where the actors run on a Ray cluster (slime's flags and meanings).

A *slot* is what slime calls a GPU: one trainer rank, or one engine's share of an engine. On a GPU cluster a slot
is a GPU; on CPU it is a process slot, the custom resource `rollflow_slot` that every node declares as many of as
processes it may host (a local Ray that rollflow starts declares the run's own). The trainer ranks take
`--actor-num-nodes` x `--actor-num-gpus-per-node` slots, the engines `--rollout-num-gpus` slots
(`--rollout-num-gpus-per-engine` each); with `--colocate` the engines share the trainers' slots. Every slot is a
bundle of one placement group, and `--actor-resources` / `--rollout-resources` add the custom resources that pick
which nodes a role's bundles may go to.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from config.base import Section

SLOT_RESOURCE = "rollflow_slot"  # the CPU process slot: the default --slot-resource


class PlacementConfig(Section):
    """Trainer ranks over nodes, engines over slots, colocated or not, and the resources that pick the nodes."""

    actor_num_nodes: int = Field(1, ge=1, le=4096, description="Nodes the trainer ranks span (slime's flag).")
    actor_num_gpus_per_node: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Trainer ranks per node: GPUs on a GPU cluster, processes on CPU. As in slime, --actor-num-nodes "
        "x this is the trainer world size and gives --data-parallel-size (world / --tensor-model-parallel-size) "
        "when that is not given; None (slime's default is 8) = the world size "
        "--tensor-model-parallel-size x --data-parallel-size over --actor-num-nodes.",
    )
    colocate: bool = Field(
        False,
        description="Engines share the trainers' slots (fractional requests, slime's --colocate) instead of "
        "slots of their own; as in slime, --rollout-num-gpus is then the trainers' slot count unless given (so "
        "--rollout-num-gpus-per-engine gives the engine count). Unlike slime's, it does not turn on "
        "--offload-rollout (rollflow has no --no-offload-* flags to turn it off again): give it.",
    )
    offload_rollout: bool = Field(
        False,
        description="slime's --offload-rollout: the engines drop their weights (and their fused decoder copies; "
        "the KV cache lives only while they generate) from the log-prob stage on, while the trainers work, and "
        "take them back at the weight sync, which sends every weight. An engine asked to generate while released "
        "refuses, naming the flag.",
    )
    slot_resource: str = Field(
        SLOT_RESOURCE,
        min_length=1,
        description="What one slot (slime's GPU: a trainer rank, or an engine's share) asks Ray for: GPU, CPU, or a "
        "custom resource the nodes declare. The default, rollflow_slot, is a CPU process slot: a local "
        "Ray that rollflow starts declares the run's; each node of a cluster declares its own with "
        "`ray start --resources '{\"rollflow_slot\": N}'`. GPU runs pass GPU.",
    )
    actor_resources: dict[str, float] = Field(
        default_factory=dict,
        description="JSON object of Ray resources each trainer slot asks for besides the slot, e.g. "
        "'{\"trainer_node\": 0.001}' keeps the trainers on the nodes started with that custom resource.",
    )
    rollout_resources: dict[str, float] = Field(
        default_factory=dict,
        description="JSON object of Ray resources each engine slot asks for besides the slot, e.g. "
        "'{\"rollout_node\": 0.001}'.",
    )

    orchestrator_niceness: int = Field(
        0,
        ge=0,
        le=19,
        description="Once the actors are up, the run's orchestrating process and the temporary Prefect server it "
        "started run this much lower in CPU priority (a nice increment) than the actors, which Ray starts at "
        "the priority it had before. Off by default: every stage's task waits for its own actor calls, so the "
        "orchestrator is on the rollout's path. 0 = the same priority.",
    )

    @property
    def offloads_rollout(self) -> bool:
        """--offload-rollout."""
        return self.offload_rollout

    @field_validator("actor_resources", "rollout_resources")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if v <= 0 or not k}
        if bad:
            raise ValueError(f"resource amounts must be positive and names non-empty: {bad}")
        return value


def check_placement(
    p: PlacementConfig,
    *,
    world_size: int,
    tp: int,
    dp: int,
    rollout_num_engines: int,
    rollout_num_gpus: int | None,
    rollout_num_gpus_per_engine: int,
) -> None:
    """Refuse placements that cannot hold the run, naming the flags: the trainer slots must be the trainer world
    size, the engine slots a whole number of engines agreeing with --rollout-num-engines, and colocated roles must
    fit the same nodes."""
    ranks = f"--tensor-model-parallel-size {tp} x --data-parallel-size {dp} = {world_size} trainer rank(s)"
    if p.actor_num_gpus_per_node is None:
        if world_size % p.actor_num_nodes:
            raise ValueError(f"--actor-num-nodes {p.actor_num_nodes} does not divide {ranks}")
    elif p.actor_num_nodes * p.actor_num_gpus_per_node != world_size:
        raise ValueError(
            f"--actor-num-nodes {p.actor_num_nodes} x --actor-num-gpus-per-node "
            f"{p.actor_num_gpus_per_node} = {p.actor_num_nodes * p.actor_num_gpus_per_node} slots, but "
            f"{ranks}: the two must be equal"
        )
    if rollout_num_gpus is not None:
        if rollout_num_gpus % rollout_num_gpus_per_engine:
            raise ValueError(
                f"--rollout-num-gpus {rollout_num_gpus} is not a multiple of "
                f"--rollout-num-gpus-per-engine {rollout_num_gpus_per_engine}"
            )
        engines = rollout_num_gpus // rollout_num_gpus_per_engine
        if engines != rollout_num_engines:
            raise ValueError(
                f"--rollout-num-engines {rollout_num_engines} contradicts --rollout-num-gpus "
                f"{rollout_num_gpus} / --rollout-num-gpus-per-engine {rollout_num_gpus_per_engine} = "
                f"{engines} engine(s): give one of them"
            )
    if p.colocate and p.actor_resources and p.rollout_resources and p.actor_resources != p.rollout_resources:
        raise ValueError(
            "--colocate puts the engines in the trainers' slots, so --actor-resources and "
            "--rollout-resources would have to hold on the same nodes: give --actor-resources only"
        )


def _given(section: Any, name: str) -> tuple[bool, Any]:
    """(given, value) of a field of a RunConfig input section: a mapping's key, or a model's set field."""
    if isinstance(section, dict):
        return name in section, section.get(name)
    if section is not None and hasattr(section, "model_fields_set"):
        return name in section.model_fields_set, getattr(section, name)
    return False, None


def _with(section: Any, **values: Any) -> dict[str, Any]:
    held = section if isinstance(section, dict) else {}
    if section is not None and hasattr(section, "model_fields_set"):
        held = section.model_dump(include=section.model_fields_set)
    return {**held, **values}


def derive_slots(data: dict[str, Any]) -> dict[str, Any]:
    """slime's GPU-count flags in a RunConfig input mapping, derived as slime derives them: --actor-num-nodes x
    --actor-num-gpus-per-node trainer slots give --data-parallel-size (over --tensor-model-parallel-size) when
    that is not given, and --colocate makes --rollout-num-gpus those slots when neither it nor
    --rollout-num-engines is given. A contradiction is left to `check_placement`, which names both flags."""
    placement, train, rollout = data.get("placement"), data.get("train"), data.get("rollout")
    out = dict(data)
    has_gpn, gpn = _given(placement, "actor_num_gpus_per_node")
    nodes = _given(placement, "actor_num_nodes")[1] or 1
    has_dp, dp = _given(train, "data_parallel_size")
    tp = _given(train, "tensor_model_parallel_size")[1] or 1
    world = None
    if has_gpn and isinstance(gpn, int) and isinstance(nodes, int) and isinstance(tp, int) and tp > 0:
        world = nodes * gpn
        if not has_dp:
            if world % tp:
                raise ValueError(
                    f"--actor-num-nodes {nodes} x --actor-num-gpus-per-node {gpn} = {world} trainer slots is not a "
                    f"multiple of --tensor-model-parallel-size {tp}"
                )
            out["train"] = _with(train, data_parallel_size=world // tp)
    elif isinstance(dp, int) and isinstance(tp, int):
        world = dp * tp
    elif not has_dp and isinstance(tp, int):
        world = tp  # data_parallel_size's default 1
    if _given(placement, "colocate")[1] and world is not None:
        if not _given(rollout, "rollout_num_gpus")[0] and not _given(rollout, "rollout_num_engines")[0]:
            per_engine = _given(rollout, "rollout_num_gpus_per_engine")[1] or 1
            if isinstance(per_engine, int) and per_engine > 0 and world % per_engine:
                raise ValueError(
                    f"--colocate gives the engines the {world} trainer slots, not a multiple of "
                    f"--rollout-num-gpus-per-engine {per_engine}: give --rollout-num-gpus"
                )
            out["rollout"] = _with(rollout, rollout_num_gpus=world)
    return out
