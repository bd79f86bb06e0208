"""A two-node Ray cluster on this machine for the placement e2e test: starts `ray.cluster_utils.Cluster` with a
"trainer machine" (the head: custom resource `trainer_node`) and a "rollout machine" (`rollout_node`), each with
1 CPU and process slots, runs `rollflow run --ray-address <the cluster> FLAGS...` in a subprocess as a user would,
then reads Ray's actor table (from the GCS: no dashboard needed) and writes a JSON report:

    python -m tests.two_nodes REPORT.json [--slots-per-node N] -- FLAGS...

    {"returncode": 0, "output": "...tail...", "seconds": 71.2,
     "nodes": {"<node id>": "trainer_node", "<node id>": "rollout_node"},
     "actors": {"trainer-0": ["<node id>"], "engine-0": ["<node id>"], ...}}   (one node per incarnation)

Ray's temp dir is one of its own (RAY_TMPDIR): the Cluster writes its address where a plain `ray.init()` looks
for a cluster to join, and no other Ray user of this machine may find it there. Ray's token (RAY_AUTH_TOKEN)
comes from the environment, as the caller's: the nodes, the run and this reader share it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NODE_ROLES = ("trainer_node", "rollout_node")  # the head first


def main(report: Path, slots_per_node: int, flags: list[str]) -> None:
    """Start the cluster (`slots_per_node` process slots per "machine"), run rollflow with `flags` on it, write
    the report, stop the cluster."""
    ray_tmp = tempfile.mkdtemp(prefix="rf2n-", dir="/tmp")  # short: Ray's socket paths must stay short
    os.environ["RAY_TMPDIR"] = ray_tmp
    from flows.cli import configure_ray_env

    configure_ray_env()  # token auth on (the caller's token when it has one) before ray is imported
    from ray.cluster_utils import Cluster

    from config import SLOT_RESOURCE

    def node_args(role: str) -> dict:
        return {
            "num_cpus": 1,
            "resources": {role: 1, SLOT_RESOURCE: slots_per_node},
            "include_dashboard": False,
        }

    cluster = Cluster(initialize_head=True, head_node_args=node_args(NODE_ROLES[0]))
    try:
        rollout_machine = cluster.add_node(**node_args(NODE_ROLES[1]))
        nodes = {cluster.head_node.node_id: NODE_ROLES[0], rollout_machine.node_id: NODE_ROLES[1]}
        began = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", "--ray-address", cluster.address, *flags],
            cwd=ROOT,
            env=os.environ.copy(),
            capture_output=True,
            text=True,
            timeout=1200,
        )
        seconds = time.monotonic() - began
        actors: dict[str, list[str]] = {}
        for info in sorted(cluster.global_state.actor_table(None).values(), key=lambda a: a["StartTime"]):
            if info["Name"]:
                actors.setdefault(info["Name"], []).append(info["Address"]["NodeID"])
        report.write_text(
            json.dumps(
                {
                    "returncode": run.returncode,
                    "output": (run.stdout + run.stderr)[-20000:],
                    "seconds": seconds,
                    "nodes": nodes,
                    "actors": actors,
                },
                indent=1,
            )
        )
    finally:
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    ours, rollflow_flags = (
        (sys.argv[1:], [])
        if "--" not in sys.argv
        else (sys.argv[1 : sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1 :])
    )
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--slots-per-node", type=int, default=2, help='processes each "machine" may host')
    args = parser.parse_args(ours)
    main(args.report, args.slots_per_node, rollflow_flags)
