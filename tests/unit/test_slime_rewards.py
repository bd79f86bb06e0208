"""The built-in rewards score what slime's rm_hub scores (slime/rollout/rm_hub): a table of cases whose expected
values are slime's own (each was computed by running slime's functions on the case), scored through the Scorer
as a run scores them; remote_rm against a real HTTP server in a thread."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollout.rewards import RewardRequest, Scorer, builtin_reward, label_problem, probe_response

# (rm_type, response, label, slime's score[, metadata]); for dapo the score is the dict's "score"
SLIME_SCORES = [
    ("math", "The answer is 14.", "14", 0.0),
    ("math", "\\boxed{x+1}", "1+x", 1.0),
    ("math", "so \\boxed{14}.", "14", 1.0),
    ("math", "so \\boxed{14}.", 14, 1.0),
    ("math", "\\boxed{0}", 0, 0.0),
    ("math", "\\boxed{0}", "0", 1.0),
    ("math", "\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("math", "\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),
    ("math", "\\boxed{2/4}", "1/2", 0.0),
    ("math", "\\boxed{1/2}", "\\frac{1}{2}", 1.0),
    ("math", "\\boxed{0.5}", "1/2", 1.0),
    ("math", "\\boxed{10\\%}", "10", 1.0),
    ("math", "\\boxed{5 \\text{ cm}}", "5", 1.0),
    ("math", "\\boxed{\\text{Paris}}", "Paris", 1.0),
    ("math", "\\boxed{x = 3}", "3", 1.0),
    ("math", "\\boxed{1,000}", "1000", 1.0),
    ("math", "\\boxed{(1,2)}", "(1, 2)", 1.0),
    ("math", "\\boxed{[1,2)}", "(1,2)", 0.0),
    ("math", "\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("math", "\\boxed{2\\sqrt2}", "\\sqrt{8}", 1.0),
    ("math", "\\boxed{3.0}", "3", 1.0),
    ("math", "\\boxed{3.5}", "7/2", 1.0),
    ("math", "\\boxed{90^\\circ}", "90", 1.0),
    ("math", "\\boxed{\\pi}", "\\pi", 1.0),
    ("math", "\\boxed{2\\pi}", "\\pi*2", 1.0),
    ("math", "first \\boxed{3} then \\boxed{7}", "7", 1.0),
    ("math", "\\fbox{7}", "7", 0.0),
    ("math", "\\boxed 7", "7", 0.0),
    ("math", "\\boxed{7", "7", 0.0),
    ("math", "\\boxed{12}", "\\boxed{12}", 1.0),
    ("math", "\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("math", "\\boxed{5 dollars}", "5", 0.0),
    ("math", "\\boxed{3 \\text{ hours}}", "3", 1.0),
    ("math", "\\boxed{\\$5}", "5", 1.0),
    ("math", "\\boxed{7 3/4}", "31/4", 1.0),
    ("math", "\\boxed{-2}", "- 2", 1.0),
    ("math", "\\boxed{1e3}", "1000", 1.0),
    ("math", "\\boxed{}", "0", 0.0),
    ("math", "\\boxed{\\frac{a}{b}}", "a/b", 1.0),
    ("math", "\\boxed{\\sqrt}", "2", 0.0),
    ("math", "\\boxed{2 million}", "2000000", 0.0),
    ("math", "\\boxed{A}", "a", 1.0),
    ("deepscaler", "<think>maybe \\boxed{3}</think> so \\boxed{4}", "4", 1.0),
    ("deepscaler", "<think>\\boxed{4}</think> I think 4", "4", 0.0),
    ("deepscaler", "\\boxed{4}", "4", 0.0),
    ("deepscaler", "###Response the answer is \\boxed{0.5}", "1/2", 1.0),
    ("deepscaler", "</think>\\boxed{0}", 0, 1.0),
    ("deepscaler", "</think>\\boxed{0}", "", 0.0),
    ("deepscaler", "<think>a</think>b</think>\\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("deepscaler", "</think>\\boxed{2}", "\\boxed{2}", 1.0),
    ("deepscaler", "</think>\\boxed{2}", "\\boxed 2", 0.0),
    ("deepscaler", "###Response one ###Response \\boxed{2}", "2", 0.0),
    ("deepscaler", "</think>\\boxed{6}", 6.0, 1.0),
    ("dapo", "Answer: 14", "14", 1.0),
    ("dapo", "The answer is 14.", "14", -1.0),
    ("dapo", "\\boxed{14}", "14", -1.0),
    ("dapo", "answer : 1,000", "1000", 1.0),
    ("dapo", "Answer: $14$", "14", 1.0),
    ("dapo", "Answer: x = 14", "14", 1.0),
    ("dapo", "Answer: 14 dollars", "14", 1.0),
    ("dapo", "Answer: \\boxed{14}", "14", 1.0),
    ("dapo", "Answer: 13\nAnswer: 14", "14", 1.0),
    (
        "dapo",
        "Answer: 14 pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad pad",
        "14",
        -1.0,
    ),
    ("dapo", "Answer: 14.0", "14", -1.0),
    ("dapo", "Answer: 7", 7, 1.0),
    ("dapo", "Answer: 14", "14.0", 1.0),
    ("f1", "The answer is Paris.", "Paris", 0.5),
    ("f1", "Paris", "paris!", 1.0),
    ("f1", "the cat sat", "the cat", 0.6666666666666666),
    ("f1", "yes", "no", 0.0),
    ("f1", "yes it is", "yes", 0.0),
    ("f1", "", "x", 0.0),
    ("f1", "New York City", "new york", 0.8),
    ("f1", "an apple a day", "apple", 0.6666666666666666),
    ("boxed_f1", "I think \\boxed{Paris} is right", "Paris", 1.0),
    ("boxed_f1", "Paris", "Paris", 0.0),
    ("boxed_math", "\\boxed{\\boxed{3}}", "3", 0.0),
    ("boxed_dapo", "x \\boxed{Answer: 14}", "14", 1.0),
    ("boxed_deepscaler", "</think>\\boxed{4}", "4", 0.0),
    ("gpqa", "The answer is B", "B", 1.0),
    ("gpqa", "<think>A?</think> The correct option is C.", "C", 1.0),
    ("gpqa", "I choose A", "B", 0.0),
    ("gpqa", "Answer: (D)", 3, 1.0),
    ("gpqa", "It is photosynthesis", "photosynthesis", 1.0, {"choices": ["respiration", "photosynthesis"]}),
    ("gpqa", "Final answer: B", "photosynthesis", 1.0, {"choices": ["respiration", "photosynthesis"]}),
    ("gpqa", "answer: c", "x", 1.0, {"correct_letter": "c"}),
    ("gpqa", "E is correct", "E", 1.0, {"valid_letters": ["a", "b", "c", "d"]}),
    ("gpqa", "no letter here", "B", 0.0, {"choices": ["x", "y"], "correct_answer": "y"}),
    ("gpqa", "the answer is y", "", 1.0, {"choices": ["x", "y"], "correct_letter": "B"}),
]


def _req(response: str, label: object, metadata: dict | None = None, index: int = 0) -> RewardRequest:
    return RewardRequest("Q?", response, label, metadata or {}, index)


def _score(scorer: Scorer, *requests: RewardRequest):
    return asyncio.run(scorer.score(list(requests)))


@pytest.mark.parametrize("case", SLIME_SCORES, ids=lambda c: f"{c[0]}:{c[1][:30]!r}:{c[2]!r}")
def test_each_builtin_scores_what_slime_scores(case):
    rm_type, response, label, expected, *metadata = case
    key = "score" if rm_type.endswith("dapo") else None
    [scored] = _score(Scorer(rm_type, None, key), _req(response, label, *metadata))
    assert scored.error is None
    assert scored.reward == pytest.approx(expected, abs=1e-12)


def test_the_issues_cases():
    """math needs a boxed answer and checks equivalence; f1 normalises as SQuAD does."""
    assert builtin_reward("math")("The answer is 14.", "14") == 0
    assert builtin_reward("math")("\\boxed{x+1}", "1+x") == 1
    assert builtin_reward("f1")("The answer is Paris.", "Paris") == 0.5


def test_dapo_is_a_dict_with_its_accuracy_and_prediction_and_needs_reward_key():
    [scored] = _score(Scorer("dapo", None, "score"), _req("so\nAnswer: 1,000", "1000"))
    assert scored.reward == 1.0 and scored.extra == {"acc": True, "pred": "1000"}
    [wrong] = _score(Scorer("dapo", None, "score"), _req("no answer line", "7"))
    assert wrong.reward == -1.0 and wrong.extra == {"acc": False, "pred": "[INVALID]"}
    with pytest.raises(ValueError, match="--rm-type dapo returns a dict .* give --reward-key score"):
        Scorer("dapo", None, None)


@pytest.mark.parametrize(
    "rm_type, label, needle",
    [
        ("dapo", "1/2", "dapo compares integer answers; label '1/2' reads as '1/2'"),
        ("dapo", "x", "label 'x'"),
        ("f1", 3, "expects a string as the label, got int"),
        ("deepscaler", [4], "expects a string or a number as the label, got list"),
    ],
)
def test_labels_slime_cannot_score_are_refused_before_the_run(rm_type, label, needle):
    """slime raises on these for every sample; here check_labels refuses the row before anything starts, and a
    sample that still gets one fails alone."""
    why = label_problem(rm_type, label)
    assert why is not None and needle in why
    [scored] = _score(Scorer(rm_type, None, "score"), _req("</think>\\boxed{1}\nAnswer: 1", label))
    assert scored.error is not None and scored.reward == 0.0


def test_labels_the_other_rules_read_as_given_are_accepted():
    assert label_problem("dapo", "1,000") is None and label_problem("dapo", 12) is None
    for rm_type in ("gpqa", "random", "remote_rm", "boxed_random"):
        assert label_problem(rm_type, None) is None and label_problem(rm_type, {"any": 1}) is None


def test_random_is_a_fair_coin_per_sample_the_same_on_a_replay():
    scorer = Scorer("random", None, None)
    requests = [_req(f"response {i}", "x", index=i) for i in range(200)]
    first, again = _score(scorer, *requests), _score(scorer, *requests)
    values = [s.reward for s in first]
    assert set(values) == {0.0, 1.0} and values == [s.reward for s in again]
    assert 70 <= sum(values) <= 130  # a coin, not a constant (the draw is fixed by the hash)


def test_ifbench_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="--rm-type ifbench: .* give --custom-rm-path"):
        Scorer("ifbench", None, None)


@pytest.mark.parametrize(
    "rm_type, label",
    [
        ("math", "14"),
        ("boxed_f1", "Paris"),
        ("deepscaler", "3/4"),
        ("dapo", "12"),
        ("gpqa", "C"),
        ("f1", "Paris"),
    ],
)
def test_the_dry_run_response_answers_the_label_the_way_the_rule_reads_it(rm_type, label):
    """What `rollflow run --dry-run` scores: the label written as the rule expects scores the rule's top."""
    key = "score" if rm_type == "dapo" else None
    [scored] = _score(Scorer(rm_type, None, key), _req(probe_response(rm_type, label), label))
    assert scored.reward == 1.0


# -- remote_rm ---------------------------------------------------------------------------------------------
class _RewardServer:
    """A reward server on 127.0.0.1: `answer(payload) -> (status, body)` decides each reply; `seen` keeps the
    payloads it was sent."""

    def __init__(self, answer) -> None:
        self.seen: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.seen.append(payload)
                status, body = answer(payload)
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (
                    BrokenPipeError,
                    ConnectionResetError,
                ):  # the client gave up waiting (the timeout case)
                    pass

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/reward"
        threading.Thread(target=self.http.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def reward_server():
    servers = []

    def start(answer):
        servers.append(_RewardServer(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _remote(url: str, key: str | None = None, timeout: float | None = 5.0) -> Scorer:
    return Scorer("remote_rm", None, key, {"rm_url": url}, timeout)


def test_remote_rm_posts_slimes_payload_and_takes_the_json_answer(reward_server):
    server = reward_server(lambda p: (200, json.dumps(float(p["response"] == p["label"]))))
    out = _score(_remote(server.url), _req("4", "4"), _req("5", "4", index=1))
    assert [s.reward for s in out] == [1.0, 0.0]
    assert sorted(server.seen, key=lambda p: p["response"]) == [
        {"prompt": "Q?", "response": "4", "label": "4"},
        {"prompt": "Q?", "response": "5", "label": "4"},
    ]
    as_dict = reward_server(lambda p: (200, json.dumps({"score": 0.25, "why": "partial"})))
    [scored] = _score(_remote(as_dict.url, key="score"), _req("4", "4"))
    assert scored.reward == 0.25 and scored.extra == {"why": "partial"}


def test_remote_rm_retries_a_server_error(reward_server, monkeypatch):
    from rollout.rm_hub import remote

    monkeypatch.setattr(remote, "backoff", lambda attempt: 0.01)  # slime's first wait is 1-2 s
    calls = []

    def flaky(payload):
        calls.append(payload)
        return (503, "busy") if len(calls) == 1 else (200, "1")

    server = reward_server(flaky)
    [scored] = _score(_remote(server.url), _req("4", "4"))
    assert scored.reward == 1.0 and scored.error is None and len(calls) == 2


def test_remote_rm_failures_fail_their_sample_with_a_message_naming_server_and_error(reward_server):
    broken = reward_server(lambda p: (500, "model not loaded"))
    [scored] = _score(_remote(broken.url, timeout=0.5), _req("4", "4"))
    assert scored.reward == 0.0 and scored.error is not None
    assert scored.error.startswith(
        f"RemoteRewardError: remote_rm POST {broken.url}: HTTP 500 Internal Server Error"
    )
    assert "'model not loaded' (attempt 1," in scored.error and "bounded to 0.5 s)" in scored.error

    refused = reward_server(lambda p: (422, "bad label"))
    [scored] = _score(_remote(refused.url, timeout=30), _req("4", "4"))
    assert "HTTP 422" in scored.error and "(attempt 1," in scored.error and len(refused.seen) == 1

    not_json = reward_server(lambda p: (200, "great answer"))
    [scored] = _score(_remote(not_json.url), _req("4", "4"))
    assert "the answer is not JSON: 'great answer'" in scored.error

    released = threading.Event()

    def slow(payload):
        released.wait(30)  # answers only once the test is over
        return 200, "1"

    hung = reward_server(slow)
    [late, other] = _score(_remote(hung.url, timeout=0.5), _req("4", "4"), _req("5", "4", index=1))
    assert late.error is not None and "no answer before the timeout" in late.error
    assert other.error is not None and late.reward == other.reward == 0.0
    released.set()


def test_remote_rm_unbounded_takes_slimes_per_attempt_timeout_and_retries(reward_server, monkeypatch):
    """Without --rm-timeout each attempt has slime's bound (120 s; shortened here) and a late attempt is retried,
    so a server slower than a custom reward's 5 s still scores the sample; the retries are slime's 10."""
    from rollout.rm_hub import remote

    monkeypatch.setattr(remote, "ATTEMPT_SECONDS", 0.3)
    monkeypatch.setattr(remote, "backoff", lambda attempt: 0.01)
    released = threading.Event()
    calls = []

    def late_once(payload):
        calls.append(payload)
        if len(calls) == 1:
            released.wait(30)  # past the attempt's bound: abandoned, then tried again
        return 200, "1"

    server = reward_server(late_once)
    [scored] = _score(_remote(server.url, timeout=None), _req("4", "4"))
    released.set()
    assert scored.reward == 1.0 and scored.error is None and len(calls) == 2

    broken = reward_server(lambda p: (500, "model not loaded"))
    [scored] = _score(_remote(broken.url, timeout=None), _req("4", "4"))
    assert scored.error is not None and "(attempt 10," in scored.error and len(broken.seen) == 10
    assert "bounded to" not in scored.error


def test_remote_rm_names_a_server_that_is_not_there():
    [scored] = _score(_remote("http://127.0.0.1:9/reward", timeout=0.5), _req("4", "4"))
    assert (
        scored.error is not None and "remote_rm POST http://127.0.0.1:9/reward: ConnectError" in scored.error
    )


def test_remote_rm_needs_rm_url():
    with pytest.raises(
        ValueError, match="--rm-type remote_rm posts each sample to a reward server: give --rm-url"
    ):
        Scorer("remote_rm", None, None)


def test_a_samples_metadata_rm_type_chooses_its_rule_as_in_slime(reward_server):
    """slime's async_rm scores a sample by `metadata["rm_type"]` when set (an eval dataset's own rule)."""
    server = reward_server(lambda p: (200, "0.5"))
    scorer = Scorer("math", None, None, {"rm_url": server.url})
    out = _score(
        scorer,
        _req("\\boxed{2}", "2"),
        _req("The answer is Paris.", "Paris", {"rm_type": "f1"}, 1),
        _req("x", "y", {"rm_type": " remote_rm "}, 2),
        _req("\\boxed{2}", "2", {"rm_type": "nope"}, 3),
    )
    assert [s.reward for s in out] == [1.0, 0.5, 0.5, 0.0]
    assert server.seen == [{"prompt": "Q?", "response": "x", "label": "y"}]
    assert out[3].error is not None and out[3].error.startswith("ValueError: --rm-type 'nope': unknown")
    [no_url] = _score(Scorer("math", None, None), _req("x", "y", {"rm_type": "remote_rm"}, 7))
    assert no_url.error == "ValueError: sample 7 asks for rm_type remote_rm: give --rm-url URL"
