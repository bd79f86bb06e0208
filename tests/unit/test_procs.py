"""procs.lower_priority and flows.runtime.yield_to_actors: the orchestrator and its Prefect server step back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import procs
from config import RunConfig
from flows import runtime

# a process with three threads (its main one and two it starts), alive until killed
_THREADS = (
    "import threading, time\nfor _ in range(2): threading.Thread(target=time.sleep, args=(60,)).start()\n"
    "print('up', flush=True)\ntime.sleep(60)\n"
)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", _THREADS], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    yield proc
    proc.kill()
    proc.wait()


def _niceness(pid: int) -> dict[int, int]:
    return {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


needs_proc = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread nice values: Linux")


@needs_proc
def test_every_thread_of_the_process_is_lowered_once(child: subprocess.Popen[str]) -> None:
    before = _niceness(child.pid)
    assert len(before) == 3
    assert procs.lower_priority([child.pid], 3) == [child.pid]
    assert _niceness(child.pid) == {t: min(19, n + 3) for t, n in before.items()}
    # once per process: a second run in the same orchestrator does not lower it further
    assert procs.lower_priority([child.pid], 3) == []
    assert _niceness(child.pid) == {t: min(19, n + 3) for t, n in before.items()}


@needs_proc
def test_nothing_is_lowered_at_zero_and_the_value_stops_at_19(child: subprocess.Popen[str]) -> None:
    before = _niceness(child.pid)
    assert procs.lower_priority([child.pid], 0) == []
    assert _niceness(child.pid) == before
    assert procs.lower_priority([child.pid], 40) == [child.pid]
    assert set(_niceness(child.pid).values()) == {19}


def test_a_process_that_ended_is_skipped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.05)
    assert procs.lower_priority([proc.pid], 5) == []
    assert proc.pid not in procs._LOWERED


class _Server:
    def __init__(self, process: subprocess.Popen[str] | None) -> None:
        self.server_process = process


def test_the_orchestrator_and_the_temporary_server_it_started_yield(
    monkeypatch: pytest.MonkeyPatch, child: subprocess.Popen[str]
) -> None:
    """`yield_to_actors` lowers this process and each running temporary Prefect server (not one that exited, nor a
    server it did not start), by the configured increment."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"], text=True)
    exited.wait()
    server = types.ModuleType("prefect.server.api.server")
    server.SubprocessASGIServer = types.SimpleNamespace(  # type: ignore[attr-defined]
        _instances={None: _Server(child), 4300: _Server(exited), 4301: _Server(None)}
    )
    monkeypatch.setitem(sys.modules, "prefect.server.api.server", server)
    calls: list[tuple[list[int], int]] = []
    monkeypatch.setattr(
        procs, "lower_priority", lambda pids, increment: calls.append((list(pids), increment))
    )
    cfg = RunConfig.model_validate({"placement": {"orchestrator_niceness": 7}})
    runtime.yield_to_actors(cfg)
    assert calls == [([os.getpid(), child.pid], 7)]
    # with PREFECT_API_URL (a `rollflow server`), no temporary server was started: this process alone
    monkeypatch.delitem(sys.modules, "prefect.server.api.server")
    calls.clear()
    runtime.yield_to_actors(RunConfig())
    assert calls == [([os.getpid()], 0)]  # the default: lower_priority leaves it as it is


def test_the_niceness_is_a_nice_increment() -> None:
    with pytest.raises(ValueError, match="orchestrator_niceness"):
        RunConfig.model_validate({"placement": {"orchestrator_niceness": 20}})
    with pytest.raises(ValueError, match="orchestrator_niceness"):
        RunConfig.model_validate({"placement": {"orchestrator_niceness": -1}})


def test_a_local_rays_processes_start_in_a_session_of_their_own():
    import inspect
    import os
    import sys

    from ray._private import services

    from tasks.actors import _local_ray_in_own_session

    assert "ConsolePopen(" in inspect.getsource(
        services.start_ray_process
    )  # how Ray starts GCS, raylet, workers
    _local_ray_in_own_session()
    _local_ray_in_own_session()  # idempotent: one subclass
    assert services.ConsolePopen.__bases__[0].__name__ == "ConsolePopen"
    child = services.ConsolePopen(
        [sys.executable, "-c", "import os; print(os.getsid(0))"], stdout=-1, text=True
    )
    out, _ = child.communicate(timeout=60)
    assert int(out) == child.pid != os.getsid(0)  # its own session leader, out of this process group


def test_a_sigterm_handler_installed_before_ray_init_stays_and_rays_replaces_only_the_default():
    import inspect
    import signal

    import ray
    from ray._private.utils import set_sigterm_handler

    from tasks.actors import _sigterm_handler_kept

    def rays(signum, frame):  # what ray.init installs: sys.exit
        raise SystemExit(signum)

    def bridge(signum, frame):
        """A flow run's SIGTERM bridge (a stand-in: the test installs it, never signals it)."""

    assert "set_sigterm_handler(" in inspect.getsource(ray.init)  # how ray.init installs its own
    original = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, bridge)
        with _sigterm_handler_kept():
            set_sigterm_handler(rays)
        assert signal.getsignal(signal.SIGTERM) is bridge
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with _sigterm_handler_kept():
            set_sigterm_handler(rays)
        assert signal.getsignal(signal.SIGTERM) is rays
    finally:
        signal.signal(signal.SIGTERM, original)


def test_malloc_tunables_are_added_and_a_users_own_stay():
    assert procs.with_malloc_tunables(None) == "glibc.malloc.mmap_threshold=1048576:glibc.malloc.hugetlb=1"
    assert procs.with_malloc_tunables("glibc.cpu.hwcaps=-AVX2:glibc.malloc.hugetlb=0") == (
        "glibc.cpu.hwcaps=-AVX2:glibc.malloc.hugetlb=0:glibc.malloc.mmap_threshold=1048576"
    )
    once = procs.with_malloc_tunables(None)
    assert procs.with_malloc_tunables(once) == once  # set again by a process the run started: unchanged


def test_kernel_caches_are_capped_and_a_users_own_stay():
    env = {"LRU_CACHE_CAPACITY": "8"}
    procs.cap_kernel_caches(env)
    assert env == {"LRU_CACHE_CAPACITY": "8", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
    procs.cap_kernel_caches(env)  # set again by a process the run started: unchanged
    assert env == {"LRU_CACHE_CAPACITY": "8", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}


# bf16 products of 300 shapes, none repeated (as decode steps' attention is); prints the bytes malloc holds after
# them beyond what it held before
_KERNELS_OF_NEW_SHAPES = """
import ctypes, ctypes.util, torch
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(ctypes.util.find_library("c")); libc.mallinfo2.restype = Info
def held():
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd
torch.set_num_threads(1)
x = torch.ones(4, 64, dtype=torch.bfloat16)
torch.nn.functional.linear(x, torch.ones(2, 64, dtype=torch.bfloat16))
before = held()
for n in range(3, 303):
    torch.nn.functional.linear(x, torch.ones(n, 64, dtype=torch.bfloat16))
print(held() - before)
"""


def test_capped_kernel_caches_keep_fewer_kernels_of_shapes_that_do_not_come_back():
    from engines.torch_engine.decoder import prepacked_linear_supported

    if not prepacked_linear_supported(torch.bfloat16, torch.device("cpu")):
        pytest.skip("this CPU has no bf16 matmul support: the run's bf16 products do not go through oneDNN")

    def grown(capacity: str | None) -> int:
        env = {k: v for k, v in os.environ.items() if k not in procs.KERNEL_CACHES}
        if capacity is None:
            procs.cap_kernel_caches(env)
        else:
            env.update(dict.fromkeys(procs.KERNEL_CACHES, capacity))
        run = subprocess.run(
            [sys.executable, "-c", _KERNELS_OF_NEW_SHAPES],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        return int(run.stdout)

    libraries_default, the_runs = grown("1024"), grown(None)
    # 300 cached kernels against 64: the run's processes keep well under half
    assert the_runs < libraries_default / 2, (the_runs, libraries_default)
