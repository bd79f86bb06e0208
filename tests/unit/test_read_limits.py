"""Damaged inputs reported in one line: Parquet sizes checked against limits before the data is read (the footer,
then each list cell in Arrow), metrics.jsonl records checked field by field, an engine's unloadable model named
by its file; the readers that tolerate damage (plots, metric comparison) skip or quote it without raising."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from artifacts.store import ArtifactError, ReadLimits, read_metrics, read_rollout, read_table, write_rollout
from tests.helpers import make_sample


def _rollout(tmp_path, lengths: list[int]):
    return write_rollout(tmp_path / "r.parquet", [make_sample(i, n=n) for i, n in enumerate(lengths)]).path


def test_footer_refuses_rows_and_average_list_length_before_decoding(tmp_path):
    path = _rollout(tmp_path, [16, 16, 16])  # and 10 prompt tokens each
    with pytest.raises(ArtifactError, match=r"r\.parquet: declares 3 rows, more than the 2 allowed here"):
        read_table(path, limits=ReadLimits(rows=2))
    with pytest.raises(
        ArtifactError,
        match=r"declares 48 values of response_tokens\.list\.element in 3 row\(s\) .* more than 12 per",
    ):
        read_rollout(path, limits=ReadLimits(list_len=12))
    assert len(read_rollout(path, limits=ReadLimits(rows=3, list_len=16))) == 3  # at the limits: read


def test_one_long_row_is_named_when_the_average_is_within_the_limit(tmp_path):
    path = _rollout(tmp_path, [2, 2, 2, 20])  # 26 response tokens in 4 rows: 6.5 a row on average
    with pytest.raises(
        ArtifactError, match=r"r\.parquet: row 3: response_tokens holds 20 values, more than the 10"
    ):
        read_table(path, limits=ReadLimits(list_len=10))


def test_bytes_on_disk_and_declared_uncompressed_are_bounded(tmp_path):
    path = _rollout(tmp_path, [4])
    size = (tmp_path / "r.parquet").stat().st_size
    with pytest.raises(ArtifactError, match=f"{size} bytes, more than the {size - 1} allowed"):
        read_table(path, limits=ReadLimits(bytes=size - 1))
    # 1 M zeros stored plain (no dictionary) compress to a few KB but declare 4 MB of column data
    zeros = pa.ListArray.from_arrays(
        pa.array([0, 1 << 20], pa.int32()), pa.array([0] * (1 << 20), pa.int32())
    )
    table = pa.table({"x": zeros}).replace_schema_metadata({b"rollflow.schema_version": b"1"})
    pq.write_table(table, tmp_path / "z.parquet", compression="zstd", use_dictionary=False)
    assert (tmp_path / "z.parquet").stat().st_size < 1 << 16
    with pytest.raises(
        ArtifactError, match=r"z\.parquet: declares \d+ bytes of uncompressed data, more than"
    ):
        read_table(tmp_path / "z.parquet", limits=ReadLimits(bytes=1 << 20))


def test_run_limits_follow_the_model_positions(tmp_path, base_checkpoint):
    from config import RunConfig
    from tasks.recordings import read_limits

    limits = read_limits(RunConfig(hf_checkpoint=base_checkpoint), rows=12)
    assert (limits.rows, limits.list_len) == (12, 64)  # tiny-arith: max_position_embeddings 64
    (tmp_path / "config.json").write_text('{"max_position_embeddings": "many"}')
    assert read_limits(RunConfig(hf_checkpoint=str(tmp_path))) == ReadLimits()  # not a count: the defaults


def test_prompt_parquet_checked_before_rows_become_python(tmp_path, monkeypatch):
    import rollout.data
    from rollout.data import DataError, read_rows

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"input": ["a", "b", "c"]}), path)
    monkeypatch.setattr(rollout.data, "PROMPT_LIMITS", ReadLimits(rows=2))
    with pytest.raises(DataError, match=r"^--prompt-data .*p\.parquet: declares 3 rows, more than the 2"):
        read_rows(path, "--prompt-data")


def test_strict_metrics_name_the_line_and_field(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = {"kind": "step", "rollout_id": 0, "step": 0, "metrics": {"train/loss": 0.5}}
    bad = [
        ({"kind": "step", "step": 0, "metrics": {}}, "'rollout_id' is missing, not a non-negative int"),
        ({**good, "rollout_id": True}, "'rollout_id' is True, not a non-negative int"),
        ({**good, "rollout_id": -1}, "'rollout_id' is -1, not a non-negative int"),
        ({**good, "step": 1.5}, "'step' is 1.5, not an int"),
        ({**good, "kind": 3}, "'kind' is 3, not a string"),
        ({**good, "metrics": "x" * 1000}, "'metrics' is 'xxxx"),
    ]
    for record, problem in bad:
        path.write_text(json.dumps(good) + "\n\n" + json.dumps(record) + "\n")
        assert read_metrics(path) == [good, record]  # lenient by default: the live run's readers
        with pytest.raises(ValueError) as caught:
            read_metrics(path, strict=True)
        assert str(caught.value).startswith(f"{path} line 3: {problem}") and len(str(caught.value)) < 200


def test_plots_and_metric_comparison_survive_damaged_records():
    from artifacts.compare import first_metric_difference
    from artifacts.plots import curves

    records = [
        {"kind": "step", "rollout_id": 0, "step": 0, "metrics": ["train/grad_norm"]},
        {"kind": "step", "rollout_id": 0, "step": 1, "metrics": {"train/grad_norm": 10**400}},
        {"kind": "step", "rollout_id": 0, "step": 2, "metrics": {"train/grad_norm": 0.5}},
    ]
    drawn = {m: xy for series in curves(records).values() for m, xy in series.items()}
    assert drawn["train/grad_norm"] == [(2, 0.5)]
    diff = first_metric_difference([{"m": 10**400}], [{"m": "y" * 1000}])
    assert diff is not None and diff.startswith("record 0: metric 'm': 1000") and len(diff) < 200


def test_engine_load_failure_names_the_broken_weights_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    from engines.actor import load_failure

    save_file({"w": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    (tmp_path / "b.safetensors").write_bytes(b"\0" * 64)
    error = load_failure(str(tmp_path), RuntimeError("boom\n  " + "z" * 1000))
    assert str(error).startswith(
        f"cannot load the model {tmp_path / 'b.safetensors'}: RuntimeError: boom zzz"
    )
    assert "\n" not in str(error) and str(error).endswith("(1019 characters)")
    assert str(load_failure(str(tmp_path / "none"), OSError("gone"))) == (
        f"cannot load the model {tmp_path / 'none'}: OSError: gone"
    )


def test_an_actor_that_died_after_starting_is_left_as_ray_reported_it():
    import ray

    from tasks.actors import start_failure

    died = ray.exceptions.RayActorError(actor_id="ab", error_msg="killed by OOM", actor_init_failed=False)
    assert start_failure(died, {"ab": "engine-0"}) is died


def test_replay_bounds_rows_by_the_rollout_size_unless_rollouts_were_recordings(base_checkpoint):
    from config import RunConfig
    from flows.replay import replay_limits

    cfg = RunConfig(hf_checkpoint=base_checkpoint)
    assert (replay_limits(cfg).rows, replay_limits(cfg).list_len) == (cfg.samples_per_rollout, 64)
    loaded = cfg.model_copy(
        update={"debug": cfg.debug.model_copy(update={"load_debug_rollout_data": "/r_{rollout_id}.parquet"})}
    )
    assert replay_limits(loaded).rows == ReadLimits().rows
