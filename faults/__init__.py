"""Fault hooks with miles' request model: named points in engines, trainers and the orchestrator where a
declared fault fires once. The faults: kill, exit, segfault, SIGSTOP, a frozen interpreter, a deadlocked
thread, a sleep, an exception. So a run's survival can be tested on purpose.

A bottom package like `artifacts`: engines, trainers and flows import it; it imports none of them.
`faults.models` is the request model (strict pydantic), `faults.injector` the per-process runtime.
"""

from faults.injector import FaultInjector, FiredFault
from faults.models import HOOKS, FaultHookRequest, parse_requests

__all__ = ["HOOKS", "FaultHookRequest", "FaultInjector", "FiredFault", "parse_requests"]
