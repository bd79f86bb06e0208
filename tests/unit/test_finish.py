"""rollout/finish.py: a rollout scored and written in the rollout actor gives the file the orchestrator would have
written, whatever the engines' split of the groups."""

from __future__ import annotations

import asyncio

import pytest

from artifacts.store import read_rollout, read_table
from config import RunConfig
from engines.torch_engine.engine import TorchEngine
from flows.resolve import resolve
from rollout import source
from rollout.finish import finish_rollout, in_entry_order
from rollout.requests import split_for_engines, to_samples
from tasks.stages import train_requests


@pytest.fixture(scope="module")
def generated(base_checkpoint, tmp_path_factory):
    """A resolved tiny-arith config, rollout 2's entries and their outputs from one engine (entry order)."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg, _ = resolve(
        RunConfig.model_validate(
            {
                "run_dir": str(run_dir),
                "rollout": {"rollout_batch_size": 6, "n_samples_per_prompt": 2},
                "train": {"global_batch_size": 12},
            }
        )
    )
    entries = train_requests(cfg, 2)
    outputs = TorchEngine(base_checkpoint).generate([e.request for e in entries])
    return cfg, entries, outputs


def test_the_answers_of_several_engines_come_back_in_entry_order(generated):
    cfg, entries, outputs = generated
    by_index = {e.sample_index: out for e, out in zip(entries, outputs, strict=True)}
    parts = [p for p in split_for_engines(entries, 4) if p]
    answers = [[by_index[e.sample_index] for e in part] for part in parts]
    assert (
        len(answers) == 4 and answers[0] != outputs[: len(answers[0])]
    )  # groups really were dealt round-robin
    assert in_entry_order(entries, 4, answers) == outputs
    with pytest.raises(ValueError, match="3 engine answers for 4 non-empty parts"):
        in_entry_order(entries, 4, answers[:3])


def test_the_file_is_the_samples_the_orchestrator_would_write_with_content_only_metadata(generated, tmp_path):
    cfg, entries, outputs = generated
    ref, tally = asyncio.run(finish_rollout(cfg, 2, entries, outputs, "w" * 64, tmp_path / "a.parquet"))
    src = source.rollout_source(cfg)
    expected = asyncio.run(to_samples(entries, outputs, src.tokenizer, src.stops, src.scorer, 2))
    assert read_rollout(ref) == expected
    assert tally.tokens == sum(s.response_length for s in expected) > 0
    assert tally.longest == max(s.response_length for s in expected) and tally.seconds >= 0
    meta = read_table(ref).schema.metadata
    assert meta[b"rollflow.weights_sha256"] == b'"' + b"w" * 64 + b'"'
    # the same outputs give the same bytes, written anywhere, by a process that never loaded the prompt data
    source._SOURCES.clear()
    again, _ = asyncio.run(finish_rollout(cfg, 2, entries, outputs, "w" * 64, tmp_path / "b.parquet"))
    assert again.sha256 == ref.sha256 and source._SOURCES == {} and source._SCORING


def test_an_eval_set_is_scored_with_the_eval_reward_and_written_as_one(generated, tmp_path):
    cfg, entries, outputs = generated
    ref, _ = asyncio.run(
        finish_rollout(cfg, 4, entries, outputs, "w" * 64, tmp_path / "e.parquet", eval_mode=True)
    )
    src = source.rollout_source(cfg)
    expected = asyncio.run(to_samples(entries, outputs, src.tokenizer, src.stops, src.eval_scorer, 4))
    assert ref.kind == "eval" and read_rollout(ref) == expected
    meta = {k: v for k, v in read_table(ref).schema.metadata.items() if k.startswith(b"rollflow.")}
    assert set(meta) == {
        b"rollflow.weights_sha256",
        b"rollflow.kind",
        b"rollflow.schema_version",
        b"rollflow.content_sha256",
    }
