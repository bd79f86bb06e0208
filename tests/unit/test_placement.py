"""Placement (slime's flags): the slots and bundles a config asks for, the combinations refused at config time,
bundle order by node, actor options per slot kind, and where the trainers meet."""

from __future__ import annotations

import asyncio
import os

import pytest
import yaml

from config import SLOT_RESOURCE, RunConfig, dump_yaml
from flows.cli import build_config, make_parser
from tasks import actors, placement
from tasks.actors import start_run_actors
from tasks.placement import (
    ENGINE_SHARE,
    LOCAL,
    TRAINER_SHARE,
    Placement,
    by_node,
    cluster_problem,
    layout,
    local_cluster,
    local_resources,
    shortfall,
)
from trainers.collectives import LOOPBACK, gloo_interface, rendezvous_host, use_interface_for


def parse(*argv: str) -> RunConfig:
    return build_config(
        make_parser().parse_args(["run", "--global-batch-size", "16", "--rollout-batch-size", "16", *argv])
    )


def test_default_is_one_trainer_slot_and_one_engine_slot_of_the_process_slot():
    lay = layout(RunConfig())
    assert lay.bundles == ({SLOT_RESOURCE: 1.0}, {SLOT_RESOURCE: 1.0})
    assert lay.trainer_bundles == (0,) and lay.engine_bundles == (1,)
    assert local_resources(RunConfig()) == {SLOT_RESOURCE: 2.0}


def test_slime_flags_give_trainer_slots_engine_count_and_node_resources():
    cfg = parse(
        "--data-parallel-size",
        "4",
        "--actor-num-nodes",
        "2",
        "--actor-num-gpus-per-node",
        "2",
        "--rollout-num-gpus",
        "4",
        "--rollout-num-gpus-per-engine",
        "2",
        "--actor-resources",
        '{"trainer_node": 0.001}',
        "--rollout-resources",
        '{"rollout_node": 0.001}',
    )
    assert (
        cfg.rollout.rollout_num_engines == 2
    )  # 4 engine slots, 2 per engine: slime's launch line carries over
    lay = layout(cfg)
    assert lay.bundles[:4] == ({SLOT_RESOURCE: 1.0, "trainer_node": 0.001},) * 4
    assert lay.bundles[4:] == ({SLOT_RESOURCE: 1.0, "rollout_node": 0.001},) * 4
    assert (
        lay.trainer_bundles == (0, 1, 2, 3)
        and lay.engine_bundles == (4, 5, 6, 7)
        and lay.slots_per_engine == 2
    )
    assert lay.needs() == {SLOT_RESOURCE: 8.0, "trainer_node": 0.004, "rollout_node": 0.004}
    again = RunConfig.model_validate(yaml.safe_load(dump_yaml(cfg)))  # the resolved config reloads
    assert again == cfg


def test_colocate_shares_the_trainers_bundles_and_modes_drop_a_role():
    cfg = parse(
        "--data-parallel-size", "2", "--colocate", "--rollout-num-engines", "3", "--slot-resource", "GPU"
    )
    lay = layout(cfg)
    assert lay.bundles == ({"GPU": 1.0},) * 3  # max(2 trainer slots, 3 engine slots)
    assert lay.trainer_bundles == (0, 1) and lay.engine_bundles == (0, 1, 2)
    assert local_resources(cfg) == {}  # a machine's GPUs are its own
    assert layout(parse("--debug-train-only")).engine_bundles == ()
    assert layout(parse("--debug-rollout-only")).trainer_bundles == ()
    assert layout(parse("--debug-rollout-only")).bundles == ({SLOT_RESOURCE: 1.0},)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "2", "--data-parallel-size", "1"],
            "--actor-num-nodes 2 x --actor-num-gpus-per-node 2 = 4 slots, but --tensor-model-parallel-size 1 x "
            "--data-parallel-size 1 = 1 trainer rank(s)",
        ),
        (["--actor-num-nodes", "2"], "--actor-num-nodes 2 does not divide"),
        (
            ["--rollout-num-engines", "2", "--rollout-num-gpus", "4"],
            "--rollout-num-engines 2 contradicts --rollout-num-gpus 4 / --rollout-num-gpus-per-engine 1 = 4 engine(s)",
        ),
        (
            ["--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "2"],
            "--rollout-num-gpus 3 is not a multiple of --rollout-num-gpus-per-engine 2",
        ),
        (
            ["--colocate", "--actor-resources", '{"a": 1}', "--rollout-resources", '{"b": 1}'],
            "--colocate puts the engines in the trainers' slots",
        ),
        (["--actor-resources", '{"trainer_node": 0}'], "--actor-resources"),
        (["--slot-resource", ""], "--slot-resource"),
    ],
)
def test_refused_combinations_name_the_flags(argv, needle):
    with pytest.raises(ValueError) as e:
        parse(*argv)
    assert needle in str(e.value)


def test_bundles_are_ordered_by_node_then_index():
    nodes = {
        0: ("10.0.0.2", "b"),
        1: ("10.0.0.10", "c"),
        2: ("10.0.0.2", "a"),
        3: ("10.0.0.2", "b"),
        4: ("host-x", "d"),
    }
    # numeric IP order (10.0.0.2 before 10.0.0.10), node id within one IP (two Ray nodes on one machine), hostnames last
    assert by_node((0, 1, 2, 3, 4), nodes) == (2, 0, 3, 1, 4)


def test_shortfall_names_what_to_declare():
    assert shortfall({SLOT_RESOURCE: 3.0}, {SLOT_RESOURCE: 3.0, "CPU": 2.0}) is None
    why = shortfall({SLOT_RESOURCE: 3.0, "trainer_node": 0.002}, {"CPU": 8.0, "trainer_node": 1.0})
    assert (
        why is not None and f"3 {SLOT_RESOURCE} (the cluster has 0)" in why and "ray start --resources" in why
    )
    assert "trainer_node" not in why
    why = shortfall({"GPU": 4.0}, {"GPU": 2.0})
    assert why is not None and "4 GPU (the cluster has 2)" in why and "--slot-resource" in why


def test_the_cluster_must_hold_the_run_before_any_actor_starts(monkeypatch):
    two_ranks = parse("--data-parallel-size", "2", "--actor-num-nodes", "2")
    where = "the cluster at --ray-address x"
    assert cluster_problem(two_ranks, {SLOT_RESOURCE: 3.0}, 2, where) is None
    assert (
        cluster_problem(two_ranks, {SLOT_RESOURCE: 3.0}, 1, where)
        == f"--actor-num-nodes 2: {where} has 1 node(s)"
    )
    why = cluster_problem(
        parse("--actor-resources", '{"big": 1}'), {SLOT_RESOURCE: 2.0, "big": 0.5}, 1, where
    )
    assert why is not None and why.startswith("--actor-resources: ") and f"1 big ({where} has 0.5)" in why
    # a local Ray's resources are known before it starts: this machine's CPUs and GPUs, the run's own slots
    monkeypatch.setattr(placement, "_local_gpus", lambda: 1)
    gpus = parse("--slot-resource", "GPU")
    assert local_cluster(gpus)["GPU"] == 1.0 and local_cluster(RunConfig())[SLOT_RESOURCE] == 2.0
    why = cluster_problem(gpus, local_cluster(gpus), 1, LOCAL)
    assert why is not None and why.startswith("--slot-resource GPU: ") and f"2 GPU ({LOCAL} has 1)" in why
    assert (
        "--ray-address" in why and cluster_problem(RunConfig(), local_cluster(RunConfig()), 1, LOCAL) is None
    )


@pytest.mark.parametrize(
    "slot, key", [("GPU", "num_gpus"), ("CPU", "num_cpus"), (SLOT_RESOURCE, "resources")]
)
def test_actors_ask_a_share_of_their_bundle(slot, key):
    # only the scheduling strategy class is built: no Ray session is started
    p = Placement(group=None, slot=slot, trainers=(3, 1), engines=(0,))
    trainer, engine = p.trainer_options(1), p.engine_options(0)
    assert trainer["scheduling_strategy"].placement_group_bundle_index == 1
    assert engine["scheduling_strategy"].placement_group_bundle_index == 0
    if key == "resources":
        assert trainer[key] == {slot: TRAINER_SHARE} and engine[key] == {slot: ENGINE_SHARE}
    else:
        assert trainer[key] == TRAINER_SHARE and engine[key] == ENGINE_SHARE
    assert TRAINER_SHARE + ENGINE_SHARE + TRAINER_SHARE <= 1.0  # colocated pair + a replacement fit one slot


def test_rendezvous_is_loopback_on_one_node_and_rank0_ip_across_nodes(monkeypatch):
    assert (
        rendezvous_host([("n1", "192.0.2.7"), ("n1", "192.0.2.7")]) in LOOPBACK
    )  # the file store, no listener
    assert rendezvous_host([("n2", "192.0.2.8"), ("n1", "192.0.2.7")]) == "192.0.2.8"
    assert gloo_interface("127.0.0.1") == "lo" and gloo_interface("203.0.113.254") is None
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    use_interface_for("127.0.0.1", "127.0.0.1")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"  # one machine: gloo stays on loopback
    use_interface_for("192.0.2.8", "127.0.0.1")  # across nodes: the interface of this node's IP
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"  # (here that IP is loopback's)
    use_interface_for(
        "192.0.2.8", "203.0.113.254"
    )  # no interface has it: not loopback, gloo resolves the host
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    use_interface_for("192.0.2.8", "127.0.0.1")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "ib0"  # the user's own choice stays


def _fake_starts(monkeypatch, fail: str | None = None) -> list[str]:
    """Stand-ins for the two sides of `start_run_actors` that log when each begins and ends (the engines take two
    event loop turns, the trainers four), `fail` raising as it ends; the placement group is a no-op."""
    log: list[str] = []

    def side(name: str, turns: int):
        async def start(*args, **kwargs):
            log.append(f"{name} begins")
            try:
                for _ in range(turns):
                    await asyncio.sleep(0)
            except asyncio.CancelledError:
                log.append(f"{name} cancelled")
                raise
            if name == fail:
                raise RuntimeError(f"{name} could not start")
            log.append(f"{name} ends")
            return [name]

        return start

    async def placed(cfg):
        return None

    monkeypatch.setattr(actors, "_placement", placed)
    monkeypatch.setattr(actors, "start_engines", side("engines", 2))
    monkeypatch.setattr(actors, "start_trainers", side("trainers", 4))
    return log


def test_engines_and_trainers_start_side_by_side_unless_colocated(monkeypatch):
    log = _fake_starts(monkeypatch)
    assert asyncio.run(start_run_actors(RunConfig(), "ckpt")) == (["engines"], ["trainers"])
    assert log[:2] == ["engines begins", "trainers begins"]
    log.clear()
    colocated = parse("--colocate")
    assert asyncio.run(start_run_actors(colocated, "ckpt")) == (["engines"], ["trainers"])
    # the engines size their memory first
    assert log == ["engines begins", "engines ends", "trainers begins", "trainers ends"]
    log.clear()
    rollout_only = parse("--debug-rollout-only")
    assert asyncio.run(start_run_actors(rollout_only, "ckpt")) == (["engines"], [])
    assert log == ["engines begins", "engines ends"]


def test_a_side_that_fails_cancels_the_other_and_its_error_is_raised(monkeypatch):
    log = _fake_starts(monkeypatch, fail="engines")

    async def start() -> list[str]:
        with pytest.raises(RuntimeError, match="^engines could not start$"):
            await start_run_actors(RunConfig(), "ckpt")
        return list(log)  # before asyncio.run cancels whatever is left at its end

    assert asyncio.run(start())[-1] == "trainers cancelled"
    assert "trainers ends" not in log
