"""Fault hook requests (miles' model): parsing and refusal, and the injector's firing rules."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from faults import FaultInjector, FiredFault, parse_requests
from faults.models import ACTION_KINDS, HOOKS


def req(**kw) -> dict:
    base = {"request_id": "r1", "hook_name": "engine_generate_start", "action": {"kind": "observe"}}
    return {**base, **kw}


def parse(*requests: dict):
    return parse_requests(json.dumps(list(requests)))


def test_every_hook_and_action_parses():
    for hook in HOOKS:
        for i, kind in enumerate(ACTION_KINDS):
            action = {"kind": kind, **({"seconds": 1.0} if kind == "sleep" else {})}
            [r] = parse(req(request_id=f"{hook}-{i}", hook_name=hook, action=action))
            assert r.action.kind == kind and r.owner == HOOKS[hook]


@pytest.mark.parametrize(
    "request_, needle",
    [
        (req(hook_name="nope"), "unknown hook 'nope'"),
        (req(action={"kind": "explode"}), "action"),
        (req(action={"kind": "sleep"}), "seconds"),
        (req(target={"trainer_rank": 0}), "reached by the engine, so a trainer target can never match"),
        (req(target={"engine": 0, "trainer_rank": 0}), "exactly one process"),
        (req(hook_name="orchestrator_rollout_end", target={"engine": 0}), "reached by the orchestrator"),
        (req(action={"kind": "deadlock_thread"}, delay_ms=5), "needs delay_ms 0"),
        (req(delay_ms=-1), "delay_ms"),
        (req(rollout_id=-1), "rollout_id"),
        (req(request_id=""), "request_id"),
        (req(extra=1), "extra"),
        (req(rollout_id="1"), "rollout_id"),  # strict: no string-to-int coercion
    ],
)
def test_bad_requests_are_refused_naming_the_field(request_, needle):
    with pytest.raises(ValueError, match=needle):
        parse(request_)


def test_conflicting_and_duplicate_requests_are_refused():
    with pytest.raises(ValueError, match="request id 'r1' is used twice"):
        parse(req(), req(action={"kind": "raise"}))
    with pytest.raises(ValueError, match="requests 'a' and 'b' conflict"):
        parse(req(request_id="a", rollout_id=1), req(request_id="b", rollout_id=1))
    assert len(parse(req(request_id="a", rollout_id=1), req(request_id="b", rollout_id=2))) == 2


def test_json_and_path_are_mutually_exclusive_and_checked(tmp_path):
    with pytest.raises(ValueError, match="mutually exclusive"):
        parse_requests("[]", str(tmp_path / "x.json"))
    with pytest.raises(ValueError, match="no such file"):
        parse_requests(None, str(tmp_path / "x.json"))
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_requests("[{")
    (tmp_path / "h.json").write_text(json.dumps(req()))  # a single object is one request
    assert len(parse_requests(None, str(tmp_path / "h.json"))) == 1
    assert parse_requests(None, None) == [] and parse_requests("  ") == []


def test_filters_targets_and_fire_once_across_processes(tmp_path):
    [r] = parse(
        req(action={"kind": "raise", "message": "boom"}, target={"engine": 1}, rollout_id=2, attempt=0)
    )
    assert FaultInjector([r], "engine", 0, str(tmp_path)).pending == []  # another engine: never armed
    first = FaultInjector([r], "engine", 1, str(tmp_path))
    first.reach("engine_generate_start", rollout_id=1, attempt=0)  # filter does not match: nothing
    first.reach("engine_update_weights_before_receive", rollout_id=2, attempt=0)  # another hook
    with pytest.raises(FiredFault, match="fault hook r1: raise at engine_generate_start in engine-1 .*boom"):
        first.reach("engine_generate_start", rollout_id=2, attempt=0)
    first.reach("engine_generate_start", rollout_id=2, attempt=0)  # fired once: nothing more
    restarted = FaultInjector([r], "engine", 1, str(tmp_path))  # same requests, a new process
    restarted.reach("engine_generate_start", rollout_id=2, attempt=0)  # the claim on disk holds
    log = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [e["status"] for e in log] == ["reached", "fired"]
    assert log[1]["context"] == {"rollout_id": 2, "attempt": 0} and log[1]["process"] == "engine-1"


def test_expired_and_pending_lines(tmp_path):
    [r] = parse(req(lifetime_seconds=1.0))
    inj = FaultInjector([r], "engine", 0, str(tmp_path), epoch=0.0)  # started long ago: expired
    inj.log_pending()
    inj.reach("engine_generate_start")
    orchestrator = FaultInjector([r], "orchestrator", None, str(tmp_path))
    orchestrator.expire_unfired()  # already expired: not logged twice
    statuses = [json.loads(line)["status"] for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert statuses == ["pending", "expired"]


@pytest.mark.parametrize(
    "kind, check",
    [
        ("exit_process", lambda rc, out: rc == 1),
        ("kill_process", lambda rc, out: rc == -9),
        ("segfault_process", lambda rc, out: rc == -11),
        ("sleep", lambda rc, out: rc == 0 and "after" in out),
    ],
)
def test_process_actions_do_what_they_say(tmp_path, kind, check):
    action = {"kind": kind, **({"seconds": 0.2} if kind == "sleep" else {})}
    script = textwrap.dedent(f"""
        import json
        from faults import FaultInjector, parse_requests
        reqs = parse_requests(json.dumps([{{"request_id": "x", "hook_name": "trainer_save_before_rename",
                                            "action": {json.dumps(action)}}}]))
        FaultInjector(reqs, "trainer", 0, {str(tmp_path)!r}).reach("trainer_save_before_rename")
        print("after", flush=True)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
    )
    assert check(done.returncode, done.stdout), (done.returncode, done.stdout, done.stderr[-500:])
    fired = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert fired[-1]["status"] == "fired"  # written before the action, so it survives the process


@pytest.mark.parametrize("kind", ["stop_process", "freeze_process", "deadlock_thread"])
def test_hang_actions_hang(tmp_path, kind):
    script = textwrap.dedent(f"""
        import json
        from faults import FaultInjector, parse_requests
        reqs = parse_requests(json.dumps([{{"request_id": "x", "hook_name": "engine_generate_start",
                                            "action": {{"kind": "{kind}"}}}}]))
        FaultInjector(reqs, "engine", 0, {str(tmp_path)!r}).reach("engine_generate_start")
        print("after", flush=True)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
    )
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    proc.kill()
    proc.wait()
    assert "after" not in (proc.stdout.read() if proc.stdout else "")
