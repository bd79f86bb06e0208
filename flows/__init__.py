"""Prefect flows, run configuration and the `rollflow` CLI.

Every flow is a module of this package. So this runs before anything a flow imports starts Ray, whoever
started the flow run. A process that did not set Ray's environment itself (the flow run a Prefect worker
starts from prefect.yaml) gets token authentication with Ray's own token file, and gloo on loopback.
`rollflow run` and `rollflow serve` set a run's own token before (flows.cli.configure_ray_env). The processes
started from here on (a local Ray's) get glibc's malloc settings of procs.with_malloc_tunables and the kernel cache
sizes of procs.cap_kernel_caches. A user's own settings stay."""

import os

from procs import cap_kernel_caches, with_malloc_tunables

os.environ.setdefault("RAY_AUTH_MODE", "token")  # Ray reads it as it is imported
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ["GLIBC_TUNABLES"] = with_malloc_tunables(os.environ.get("GLIBC_TUNABLES"))
cap_kernel_caches(os.environ)
