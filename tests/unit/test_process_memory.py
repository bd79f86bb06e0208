"""Per-process memory records: /proc status parsing, the perf metric names, the end-of-run summary line."""

from __future__ import annotations

import pytest

from flows.console import memory_line
from procs import memory_gib
from tasks.memory import memory_metrics, peaks

_STATUS = "Name:\tpython\nVmPeak:\t 9000000 kB\nVmHWM:\t 3145728 kB\nVmRSS:\t 1048576 kB\nThreads:\t4\n"


def test_status_text_is_read_in_gib() -> None:
    assert memory_gib(_STATUS) == {"rss": 1.0, "peak": 3.0}


def test_status_without_the_fields_is_refused() -> None:
    with pytest.raises(ValueError, match="VmRSS and VmHWM"):
        memory_gib("Name:\tpython\nVmRSS:\t 10 kB\n")
    with pytest.raises(ValueError, match="in kB"):
        memory_gib("VmRSS:\t 10 MB\nVmHWM:\t 10 kB\n")


def test_own_peak_rises_with_a_touched_allocation() -> None:
    before = memory_gib()
    assert 0 < before["rss"] <= before["peak"]
    block = bytearray(256 << 20)  # zero-filled: every page is touched
    during = memory_gib()
    assert during["rss"] >= before["rss"] + 0.2
    assert during["peak"] >= before["rss"] + 0.2
    del block


def test_metric_names_totals_and_summary() -> None:
    first = memory_metrics({"driver": {"rss": 1.0, "peak": 1.5}, "engine-0": {"rss": 2.0, "peak": 4.0}})
    assert first == {
        "perf/mem_rss_gb/driver": 1.0,
        "perf/mem_peak_gb/driver": 1.5,
        "perf/mem_rss_gb/engine-0": 2.0,
        "perf/mem_peak_gb/engine-0": 4.0,
        "perf/mem_rss_gb/total": 3.0,
        "perf/mem_peak_gb/total": 5.5,
    }
    later = memory_metrics({"driver": {"rss": 1.0, "peak": 2.0}, "engine-0": {"rss": 1.0, "peak": 4.0}})
    records = [
        {"kind": "perf", "rollout_id": 0, "metrics": first},
        {"kind": "rollout", "rollout_id": 0, "metrics": {"perf/mem_peak_gb/driver": 99.0}},
        {"kind": "perf", "rollout_id": 1, "metrics": later},
    ]
    assert peaks(records) == {"driver": 2.0, "engine-0": 4.0, "total": 6.0}
    assert memory_line(records) == "driver 2.00, engine-0 4.00 GiB (sum 6.00)"
    assert memory_line([{"kind": "perf", "rollout_id": 0, "metrics": {"perf/step_time": 1.0}}]) is None
