"""The bad inputs and hostile files rollflow is tried with: each must be refused before any work with one line
naming the flag or file, a non-zero exit and no traceback. `tests/unit/test_bad_inputs.py` runs every case;
`bench/bad_inputs.py` prints them as the README's table."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class Case:
    """One bad input: `argv(tmp)` builds the command line (and any file it needs) in `tmp`; the refusal must
    contain `needle`."""

    kind: str  # the class of bad input (one test per class at least)
    what: str  # what is wrong, in words (the README's table)
    argv: Callable[[Path], list[str]]
    needle: str


TABLE_HEADER = ["| class | bad input | exit | refused with (one line) |", "|---|---|---|---|"]


def table_row(case: Case, code: int, last_line: str, tmp: Path) -> str:
    """The README table's row of `case`, refused with exit `code` and `last_line` (its temp dir written `$TMP`)."""
    message = last_line.replace(str(tmp), "$TMP").replace("|", "\\|")
    return f"| {case.kind} | {case.what} | {code} | `{message[:150]}` |"


def readme_rows(readme: str) -> list[str]:
    """The rows of the bad-input table in the README's text (between its header and the end of its block)."""
    start = (
        readme.index(TABLE_HEADER[0] + "\n" + TABLE_HEADER[1])
        + len(TABLE_HEADER[0])
        + len(TABLE_HEADER[1])
        + 2
    )
    return readme[start : readme.index("\n\n</details>", start)].splitlines()


def _fixed(*argv: str) -> Callable[[Path], list[str]]:
    return lambda tmp: list(argv)


def _model_dir(tmp: Path) -> Path:
    """An HF model dir as far as the checks before a run read it: a 3-layer Qwen2 config.json and a tokenizer file."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 3}))
    (model / "tokenizer.json").write_text("{}")
    return model


def run(*flags: str, needle: str, kind: str, what: str) -> Case:
    """A `rollflow run` case, in a run dir of the test's own (an explicit --run-dir in `flags` wins)."""
    return Case(kind, what, lambda tmp: ["run", "--run-dir", str(tmp / "run"), *flags], needle)


# -- files to break -----------------------------------------------------------------------------------------
def good_rollout(tmp: Path) -> Path:
    """A valid rollout Parquet (the thing the hostile variants start from)."""
    from artifacts.store import write_rollout
    from tests.helpers import make_sample

    path = tmp / "good" / "rollout_0.parquet"
    if not path.is_file():
        write_rollout(path, [make_sample(i) for i in range(4)])
    return path


def _hostile(name: str, make: Callable[[Path, Path], None]) -> Callable[[Path], Path]:
    """A file `name` in tmp, made by `make(good_rollout, target)`."""

    def build(tmp: Path) -> Path:
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        make(good_rollout(tmp), target)
        return target

    return build


def _write(data: bytes) -> Callable[[Path, Path], None]:
    return lambda good, target: target.write_bytes(data)


def _truncate(good: Path, target: Path) -> None:
    data = good.read_bytes()
    target.write_bytes(data[: len(data) // 2])


def _consistent(table: pa.Table, template: pa.Table, target: Path) -> None:
    """Write `table` with the template's metadata and a content checksum that matches: a file whose checksum
    holds, so that only the reader's schema checks can catch what is wrong with it."""
    from artifacts.store import table_content_sha256

    meta = dict(template.schema.metadata or {})
    key = next(k for k in meta if k.endswith(b"content_sha256"))
    meta[key] = (
        json.dumps(table_content_sha256(table)).encode()
        if meta[key].startswith(b'"')
        else table_content_sha256(table).encode()
    )
    pq.write_table(table.replace_schema_metadata(meta), target)


def _retype(good: Path, target: Path) -> None:  # reward as text: a column of the wrong type
    table = pq.read_table(good)
    i = table.schema.get_field_index("reward")
    _consistent(
        table.set_column(i, "reward", pa.array([str(v) for v in table.column(i).to_pylist()])), table, target
    )


def _drop_column(good: Path, target: Path) -> None:
    table = pq.read_table(good)
    _consistent(table.drop_columns(["response_tokens"]), table, target)


def _tamper(good: Path, target: Path) -> None:  # content changed, checksum in the metadata kept
    table = pq.read_table(good)
    i = table.schema.get_field_index("reward")
    changed = table.set_column(i, "reward", pa.array([9.0] * table.num_rows))
    pq.write_table(changed.replace_schema_metadata(table.schema.metadata), target)


def _future(good: Path, target: Path) -> None:
    table = pq.read_table(good)
    meta = dict(table.schema.metadata or {})
    key = next(k for k in meta if b"version" in k)
    meta[key] = b"999"
    pq.write_table(table.replace_schema_metadata(meta), target)


def _pickle_code(good: Path, target: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self):  # noqa: D105 - the point of the file: unpickling it runs code
            return (print, ("pwned",))

    with open(target, "wb") as f:
        pickle.dump({"rollout_id": 0, "samples": [Evil()]}, f)


def _pt_no_samples(good: Path, target: Path) -> None:
    import torch

    torch.save({"rollout_id": 0, "metadata": {}}, target)


def _mismatched_lists(good: Path, target: Path) -> None:  # loss_mask shorter than the response
    table = pq.read_table(good)
    i = table.schema.get_field_index("loss_mask")
    short = pa.array([m[:-1] for m in table.column(i).to_pylist()], pa.list_(pa.int8()))
    _consistent(table.set_column(i, "loss_mask", short), table, target)


HOSTILE_FILES: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "empty.parquet": ("an empty file", _hostile("h/empty.parquet", _write(b""))),
    "noise.parquet": ("random bytes", _hostile("h/noise.parquet", _write(bytes(range(256)) * 8))),
    "half.parquet": ("a Parquet file cut in half", _hostile("h/half.parquet", _truncate)),
    "retyped.parquet": ("reward stored as text", _hostile("h/retyped.parquet", _retype)),
    "dropped.parquet": ("the response_tokens column missing", _hostile("h/dropped.parquet", _drop_column)),
    "tampered.parquet": ("rewards edited, checksum left as it was", _hostile("h/tampered.parquet", _tamper)),
    "future.parquet": ("a schema version from the future", _hostile("h/future.parquet", _future)),
    "lists.parquet": ("loss_mask shorter than the response", _hostile("h/lists.parquet", _mismatched_lists)),
    "code.pt": ("a .pt whose unpickling runs code", _hostile("h/code.pt", _pickle_code)),
    "noise.pt": ("random bytes as .pt", _hostile("h/noise.pt", _write(b"\x80\x04garbage" * 10))),
    "empty.pt": ("an empty .pt", _hostile("h/empty.pt", _write(b""))),
    "nosamples.pt": ("a slime dump without samples", _hostile("h/nosamples.pt", _pt_no_samples)),
    "data.csv": ("an unsupported extension", _hostile("h/data.csv", _write(b"a,b\n1,2\n"))),
}


def _file(name: str) -> Callable[[Path], str]:
    return lambda tmp: str(HOSTILE_FILES[name][1](tmp))


def inspect(name: str, needle: str) -> Case:
    return Case(
        "hostile file",
        f"`inspect` of {HOSTILE_FILES[name][0]}",
        lambda tmp: ["inspect", _file(name)(tmp)],
        needle,
    )


def _run_dir(tmp: Path, broken: str) -> str:
    """A small run dir made by hand, with one part broken."""
    d = tmp / f"run-{broken}"
    (d / "rollouts").mkdir(parents=True, exist_ok=True)
    shutil.copy(good_rollout(tmp), d / "rollouts" / "rollout_000000.parquet")
    (d / "metrics.jsonl").write_text(
        json.dumps({"kind": "step", "rollout_id": 0, "step": 0, "metrics": {"train/loss": 0.1}}) + "\n"
    )
    (d / "config.yaml").write_text("name: x\n")
    if broken == "yaml":
        (d / "config.yaml").write_text("name: [unclosed\n")
    if broken == "rollout":
        (d / "rollouts" / "rollout_000000.parquet").write_bytes(b"PAR1 garbage")
    if broken == "unknown-key":
        (d / "config.yaml").write_text("train: {learning_rate: 1}\n")
    if broken == "dup-key":
        (d / "config.yaml").write_text("name: x\nname: y\n")
    if broken == "noconfig":
        (d / "config.yaml").unlink()
    return str(d)


def _checkpoint(tmp: Path, broken: str) -> str:
    """A --load dir with one broken part."""
    d = tmp / f"ckpt-{broken}"
    it = d / "iter_0000000"
    it.mkdir(parents=True, exist_ok=True)
    (it / "meta.json").write_text(json.dumps({"rollout_id": 0, "global_step": 1}))
    (it / "config.json").write_text("{}")
    (it / "model.safetensors").write_bytes(b"not safetensors")
    (d / "latest_checkpointed_iteration.txt").write_text("0")
    if broken == "latest":
        (d / "latest_checkpointed_iteration.txt").write_text("zero")
    if broken == "missing-iter":
        (d / "latest_checkpointed_iteration.txt").write_text("7")
    if broken == "meta":
        (it / "meta.json").write_text("{not json")
    return str(d)


def whole_checkpoint(d: Path, rollout_id: int = 0) -> Path:
    """An iter_ dir with every file a torch-format `--load` reads (tiny tensors; config.json implies no shapes)."""
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.ones(2, 3)}, str(d / "model.safetensors"))
    save_file({"w::exp_avg": torch.zeros(2, 3)}, str(d / "optimizer.safetensors"))
    save_file({"torch_rng": torch.get_rng_state()}, str(d / "rng.safetensors"))
    (d / "scheduler.json").write_text(json.dumps({"last_epoch": rollout_id}))
    (d / "config.json").write_text("{}")
    (d / "meta.json").write_text(json.dumps({"rollout_id": rollout_id, "global_step": rollout_id + 1}))
    (d.parent / "latest_checkpointed_iteration.txt").write_text(str(rollout_id))
    return d


def _save_dir(tmp: Path, broken: str) -> str:
    """A --save dir with one whole checkpoint, then one thing wrong: a file a load reads removed, or only an
    unfinished save (a trainer killed before its rename) beside it."""
    d = tmp / f"save-{broken}"
    it = whole_checkpoint(d / "iter_0000001", 1)
    if broken.endswith((".safetensors", ".json")):
        (it / broken).unlink()
    if broken == "only-tmp":
        it.rename(d / "iter_0000002.tmp-4242")
        (d / "latest_checkpointed_iteration.txt").unlink()
    return str(d)


def _yaml(tmp: Path, text: str, name: str) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def _jsonl(tmp: Path, text: str, name: str) -> str:
    path = tmp / f"{name}.jsonl"
    path.write_bytes(text.encode("latin-1") if name == "binary" else text.encode())
    return str(path)


def _model_dir_without_config(tmp: Path) -> str:
    d = tmp / "not-a-model"
    d.mkdir(exist_ok=True)
    return str(d)


# 9 levels of 9 aliases: 9^9 values once expanded (billion laughs, in YAML)
ALIAS_BOMB = "a0: &a0 [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)
)
ALIAS_BOMB_FLOW = "{" + ALIAS_BOMB.strip().replace("\n", ", ") + "}"
# under the alias count, over the expansion bound: 64 KB strings repeated
WIDE_ALIASES = (
    f"s: &s {'y' * 65536}\n" + f"t: &t [{', '.join(['*s'] * 8)}]\n" + f"u: [{', '.join(['*t'] * 8)}]\n"
)


CASES: list[Case] = [
    # -- numbers out of range or not finite ----------------------------------------------------------------
    run(
        "--rollout-batch-size",
        "0",
        needle="--rollout-batch-size",
        kind="number",
        what="zero prompts per rollout",
    ),
    run("--rollout-batch-size", "-3", needle="--rollout-batch-size", kind="number", what="negative batch"),
    run("--num-rollout", "0", needle="--num-rollout", kind="number", what="zero rollouts"),
    run("--num-rollout", "100000000", needle="--num-rollout", kind="number", what="10^8 rollouts"),
    run(
        "--n-samples-per-prompt",
        "0",
        needle="--n-samples-per-prompt",
        kind="number",
        what="zero samples per prompt",
    ),
    run(
        "--n-samples-per-prompt",
        "1000000",
        needle="--n-samples-per-prompt",
        kind="number",
        what="a million samples per prompt",
    ),
    run(
        "--rollout-max-response-len",
        "0",
        needle="--rollout-max-response-len",
        kind="number",
        what="zero new tokens",
    ),
    run(
        "--rollout-max-response-len",
        "100000000",
        needle="--rollout-max-response-len",
        kind="number",
        what="10^8 new tokens",
    ),
    run("--rollout-temperature", "0", needle="--rollout-temperature", kind="number", what="temperature 0"),
    run(
        "--rollout-temperature", "inf", needle="--rollout-temperature", kind="number", what="temperature inf"
    ),
    run(
        "--rollout-temperature", "nan", needle="--rollout-temperature", kind="number", what="temperature NaN"
    ),
    run("--rollout-top-p", "1.5", needle="--rollout-top-p", kind="number", what="top-p above 1"),
    run("--rollout-top-k", "-2", needle="--rollout-top-k", kind="number", what="top-k -2"),
    run("--lr", "inf", needle="--lr", kind="number", what="learning rate inf"),
    run("--lr", "nan", needle="--lr", kind="number", what="learning rate NaN"),
    run("--lr", "0", needle="--lr", kind="number", what="learning rate 0"),
    run("--lr", "-1e-4", needle="--lr", kind="number", what="negative learning rate"),
    run("--lr", "fast", needle="--lr", kind="number", what="learning rate not a number"),
    run("--min-lr", "inf", needle="--min-lr", kind="number", what="min lr inf"),
    run("--eps-clip", "0", needle="--eps-clip", kind="number", what="clip range 0"),
    run("--eps-clip-c", "0.5", needle="--eps-clip-c", kind="number", what="dual-clip constant below 1"),
    run("--adam-beta1", "1.0", needle="--adam-beta1", kind="number", what="Adam beta1 = 1"),
    run("--weight-decay", "-1", needle="--weight-decay", kind="number", what="negative weight decay"),
    run("--clip-grad", "-1", needle="--clip-grad", kind="number", what="negative grad clip"),
    run("--rollout-num-engines", "0", needle="--rollout-num-engines", kind="number", what="zero engines"),
    run("--num-threads", "0", needle="--num-threads", kind="number", what="zero threads"),
    run("--eval-interval", "0", needle="--eval-interval", kind="number", what="eval every 0 rollouts"),
    run("--task-retries", "-1", needle="--task-retries", kind="number", what="negative retries"),
    run("--prefect-timeout", "0", needle="--prefect-timeout", kind="number", what="Prefect timeout 0"),
    run("--rollout-timeout", "-5", needle="--rollout-timeout", kind="number", what="negative stage timeout"),
    run("--rm-timeout", "0", needle="--rm-timeout", kind="number", what="reward timeout 0"),
    # -- combinations ------------------------------------------------------------------------------------------
    run(
        "--global-batch-size",
        "7",
        needle="--global-batch-size 7 must divide",
        kind="combination",
        what="global batch does not divide the rollout",
    ),
    run(
        "--data-parallel-size",
        "3",
        needle="--data-parallel-size 3",
        kind="combination",
        what="batch not divisible by the ranks",
    ),
    run(
        "--micro-batch-size",
        "5",
        needle="--micro-batch-size 5",
        kind="combination",
        what="micro-batch does not divide the rank's share",
    ),
    run(
        "--kl-loss-coef",
        "0.1",
        needle="--use-kl-loss",
        kind="combination",
        what="KL coefficient without KL loss",
    ),
    run("--save-interval", "2", needle="--save DIR", kind="combination", what="save interval without --save"),
    run(
        "--ci-save-model-hash", needle="needs --save", kind="combination", what="model hashes without --save"
    ),
    run("--ci-check-model-hash", needle="needs --load", kind="combination", what="hash check without --load"),
    run(
        "--debug-rollout-only",
        "--debug-train-only",
        needle="mutually exclusive",
        kind="combination",
        what="rollout-only and train-only",
    ),
    run(
        "--ci-metric-checker-key",
        "eval/x",
        needle="go together",
        kind="combination",
        what="gate key without threshold",
    ),
    run(
        "--input-key",
        "question",
        needle="--input-key given without --prompt-data",
        kind="combination",
        what="a data key without --prompt-data",
    ),
    run(
        "--ci-fault-hooks",
        "[]",
        "--ci-fault-hooks-path",
        "/tmp/h.json",
        needle="mutually exclusive",
        kind="combination",
        what="fault hooks given twice",
    ),
    Case(
        "combination",
        "--resume with other flags",
        lambda tmp: ["run", "--resume", _run_dir(tmp, "ok"), "--lr", "1e-3"],
        "drop --lr",
    ),
    # -- names and choices -------------------------------------------------------------------------------------
    run("--train-backend", "nope", needle="invalid choice", kind="name", what="an unknown trainer backend"),
    run("--rollout-backend", "nope", needle="invalid choice", kind="name", what="an unknown engine backend"),
    run("--kl-loss-type", "k9", needle="invalid choice", kind="name", what="an unknown KL estimator"),
    run("--advantage-estimator", "magic", needle="invalid choice", kind="name", what="an unknown estimator"),
    run("--name", "my run!", needle="--name", kind="name", what="a run name with spaces"),
    run(
        "--refresh",
        "generat",
        needle="--refresh: unknown stage",
        kind="name",
        what="a misspelt --refresh stage",
    ),
    run(
        "--rm-type",
        "bogus",
        "--prompt-data",
        "/nonexistent.jsonl",
        needle="no such file",
        kind="name",
        what="an unknown reward with a missing file (the file first)",
    ),
    run(
        "--no-such-flag", "1", needle="unrecognized flag --no-such-flag", kind="name", what="an unknown flag"
    ),
    run(
        "--rollout-batchsize",
        "8",
        needle="did you mean --rollout-batch-size?",
        kind="name",
        what="a misspelt flag (the closest one named)",
    ),
    run(
        "--num-experts",
        "8",
        needle="--num-experts: not supported",
        kind="name",
        what="a slime flag rollflow cannot honour (MoE)",
    ),
    Case(
        "name",
        "an architecture flag that disagrees with config.json",
        lambda tmp: [
            "run",
            "--run-dir",
            str(tmp / "run"),
            "--hf-checkpoint",
            str(_model_dir(tmp)),
            "--num-layers",
            "24",
        ],
        "--num-layers 24 disagrees with the model: num_hidden_layers is 3",
    ),
    run(
        "--attention-dropout",
        "0.1",
        needle="--attention-dropout: 0.1: rollflow's trainers run without dropout",
        kind="number",
        what="dropout (the trainers never drop out)",
    ),
    run(
        "--actor-num-gpus-per-node",
        "4",
        "--data-parallel-size",
        "2",
        needle="--actor-num-gpus-per-node 4 = 4 slots",
        kind="placement",
        what="GPU-count flags that contradict --data-parallel-size",
    ),
    # -- templates ---------------------------------------------------------------------------------------------
    run(
        "--save-debug-rollout-data",
        "/tmp/x.parquet",
        needle="has no {rollout_id}",
        kind="template",
        what="a recording path without {rollout_id}",
    ),
    run(
        "--save-debug-rollout-data",
        "/tmp/x_{rollout_id}.csv",
        needle="the extension picks the format",
        kind="template",
        what="a recording with an unknown extension",
    ),
    run(
        "--save-debug-rollout-data",
        "/tmp/x_{rollout_id:06d}.parquet",
        needle="bad template",
        kind="template",
        what="a template with a format spec",
    ),
    run(
        "--ci-save-grad-norm",
        "/tmp/{x}.json",
        needle="bad template",
        kind="template",
        what="a grad-norm template with an unknown field",
    ),
    # -- paths -------------------------------------------------------------------------------------------------
    run(
        "--hf-checkpoint",
        "/nonexistent/model",
        needle="--hf-checkpoint /nonexistent/model",
        kind="path",
        what="a model dir that does not exist",
    ),
    Case(
        "path",
        "a model dir without config.json",
        lambda tmp: ["run", "--hf-checkpoint", _model_dir_without_config(tmp)],
        "no config.json",
    ),
    run(
        "--ref-load",
        "/nonexistent/ref",
        needle="--ref-load",
        kind="path",
        what="a reference that does not exist",
    ),
    Case(
        "path",
        "--load with a broken latest_checkpointed_iteration.txt",
        lambda tmp: ["run", "--load", _checkpoint(tmp, "latest")],
        "not an iteration number",
    ),
    Case(
        "path",
        "--load naming an iteration that is missing",
        lambda tmp: ["run", "--load", _checkpoint(tmp, "missing-iter")],
        "missing or incomplete",
    ),
    run(
        "--load-debug-rollout-data",
        "/nonexistent/r_{rollout_id}.parquet",
        needle="recording for rollout 0",
        kind="path",
        what="train-only from recordings that do not exist",
    ),
    run(
        "--ci-inject-rollout-data-path",
        "/nonexistent/r_{rollout_id}.parquet",
        needle="recording for rollout 0",
        kind="path",
        what="injection from recordings that do not exist",
    ),
    run(
        "--load-forge-rollout-data",
        "/nonexistent/r.parquet",
        needle="recording for rollout 0",
        kind="path",
        what="forge replay of a missing recording",
    ),
    run("--save", "/proc/ckpt", needle="--save /proc/ckpt", kind="path", what="an unwritable --save dir"),
    run("--run-dir", "/proc/run", needle="/proc/run", kind="path", what="an unwritable run dir"),
    run(
        "--dump-details",
        "/proc/dump",
        needle="--dump-details /proc/dump",
        kind="path",
        what="an unwritable --dump-details dir",
    ),
    run(
        "--save-debug-rollout-data",
        "/proc/r_{rollout_id}.parquet",
        needle="--save-debug-rollout-data",
        kind="path",
        what="an unwritable recording path",
    ),
    run(
        "--prompt-data",
        "/nonexistent.jsonl",
        "--rm-type",
        "math",
        needle="no such file",
        kind="path",
        what="prompt data that does not exist",
    ),
    Case(
        "path",
        "--resume of a dir that does not exist",
        _fixed("run", "--resume", "/nonexistent/run"),
        "--resume /nonexistent/run",
    ),
    run(
        "--ci-fault-hooks-path",
        "/nonexistent/h.json",
        needle="no such file",
        kind="path",
        what="a fault plan that does not exist",
    ),
    # -- data and reward ---------------------------------------------------------------------------------------
    Case(
        "data",
        "prompt data with an unreadable JSONL line",
        lambda tmp: [
            "run",
            "--prompt-data",
            _jsonl(tmp, '{"input": "a"}\n{oops\n', "badline"),
            "--rm-type",
            "math",
        ],
        "line 2: not valid JSON",
    ),
    Case(
        "data",
        "prompt data that is not UTF-8",
        lambda tmp: [
            "run",
            "--prompt-data",
            _jsonl(tmp, '{"input": "\xe9"}\n', "binary"),
            "--rm-type",
            "math",
        ],
        "not UTF-8",
    ),
    Case(
        "data",
        "a row without --input-key",
        lambda tmp: [
            "run",
            "--prompt-data",
            _jsonl(tmp, '{"question": "a"}\n', "nokey"),
            "--rm-type",
            "math",
        ],
        "no key 'input'",
    ),
    Case(
        "data",
        "a custom reward that does not import",
        lambda tmp: [
            "run",
            "--prompt-data",
            _jsonl(tmp, '{"input": "1+2="}\n', "ok"),  # a prompt the tiny tokenizer encodes
            "--custom-rm-path",
            "nowhere_xyz.fn",
        ],
        "cannot import 'nowhere_xyz'",
    ),
    run("--rm-type", "remote_rm", needle="give --rm-url", kind="data", what="remote_rm without --rm-url"),
    run(
        "--rm-type",
        "dapo",
        needle="give --reward-key score",
        kind="data",
        what="dapo's dict reward without --reward-key",
    ),
    run(
        "--rm-type",
        "ifbench",
        needle="give --custom-rm-path",
        kind="data",
        what="slime's ifbench reward (it fetches code when imported)",
    ),
    run(
        "--custom-generate-function-path",
        "nowhere_xyz.generate",
        needle="cannot import 'nowhere_xyz'",
        kind="data",
        what="a generate plug-in that does not import",
    ),
    run(
        "--rollout-function-path",
        "rollout.sample.label_text",
        needle="slime calls it with 3",
        kind="data",
        what="a rollout function that takes one argument",
    ),
    run(
        "--eval-prompt-data",
        "a",
        "/x.jsonl",
        "a",
        "/y.jsonl",
        needle="duplicate eval dataset name",
        kind="data",
        what="two eval datasets with one name",
    ),
    run("--eval-prompt-data", "a", needle="NAME PATH pairs", kind="data", what="an eval name without a path"),
    run(
        "--apply-chat-template-kwargs",
        "{bad",
        needle="--apply-chat-template-kwargs",
        kind="data",
        what="template kwargs that are not JSON",
    ),
    run("--ci-fault-hooks", "[{", needle="not valid JSON", kind="data", what="a fault plan that is not JSON"),
    run(
        "--ci-fault-hooks",
        '[{"request_id": "a", "hook_name": "nope", "action": {"kind": "observe"}}]',
        needle="unknown hook 'nope'",
        kind="data",
        what="a fault request for a hook that does not exist",
    ),
    run("--rollout-stop", "", needle="empty stop string", kind="data", what="an empty stop string"),
    run(
        "--rollout-stop-token-ids",
        "999999",
        needle="outside the tokenizer's vocabulary",
        kind="data",
        what="a stop id outside the vocabulary",
    ),
    # -- config files ------------------------------------------------------------------------------------------
    run(
        "--config",
        "/nonexistent.yaml",
        needle="--config /nonexistent.yaml: no such file",
        kind="config file",
        what="a config file that does not exist",
    ),
    Case(
        "config file",
        "a YAML syntax error",
        lambda tmp: ["run", "--config", _yaml(tmp, "train: [1,\n", "syntax")],
        "line",
    ),
    Case(
        "config file",
        "a section given as a scalar",
        lambda tmp: ["run", "--config", _yaml(tmp, "train: 5\n", "scalar")],
        "train",
    ),
    Case(
        "config file",
        "an unknown key",
        lambda tmp: ["run", "--config", _yaml(tmp, "train: {lrr: 1}\n", "unknown")],
        "--lrr",
    ),
    Case(
        "config file",
        "a list at the top level",
        lambda tmp: ["run", "--config", _yaml(tmp, "- 1\n", "list")],
        "mapping",
    ),
    Case(
        "config file",
        "binary garbage as YAML",
        lambda tmp: ["run", "--config", _yaml(tmp, "\x00\x01\x02: [", "garbage")],
        "--config",
    ),
    Case(
        "config file",
        "a key given twice",
        lambda tmp: ["run", "--config", _yaml(tmp, "train: {lr: 1.0e-3}\ntrain: {lr: 2.0e-3}\n", "dup")],
        "line 2 column 1: duplicate key 'train' (first at line 1)",
    ),
    Case(
        "config file",
        "a field given twice in one section",
        lambda tmp: ["run", "--config", _yaml(tmp, "rollout:\n  num_rollout: 2\n  num_rollout: 3\n", "dupf")],
        "line 3 column 3: duplicate key 'num_rollout'",
    ),
    Case(
        "config file",
        "a 400-byte YAML alias bomb",
        lambda tmp: ["run", "--config", _yaml(tmp, ALIAS_BOMB, "bomb")],
        "aliases expand this value",
    ),
    Case(
        "config file",
        "101 aliases",
        lambda tmp: ["run", "--config", _yaml(tmp, f"a: &a 1\nb: [{', '.join(['*a'] * 101)}]\n", "aliases")],
        "more than 100 aliases",
    ),
    Case(
        "config file",
        "16 aliases of a 64 KB string, 4 MB expanded",
        lambda tmp: ["run", "--config", _yaml(tmp, WIDE_ALIASES, "wide")],
        "aliases expand this value",
    ),
    Case(
        "config file",
        "an alias that contains itself",
        lambda tmp: ["run", "--config", _yaml(tmp, "rollout: &a {x: *a}\n", "recursive")],
        "refers to a value that contains it",
    ),
    Case(
        "config file",
        "a 2 MB config file",
        lambda tmp: ["run", "--config", _yaml(tmp, "# " + "x" * (2 << 20) + "\n", "huge")],
        "more than the 1048576",
    ),
    Case(
        "config file",
        "a 300 KB value quoted in the refusal",
        lambda tmp: ["run", "--config", _yaml(tmp, f"rollout: {{num_rollout: {'9' * 300_000}x}}\n", "long")],
        "... (300003 characters))",
    ),
    # -- hostile files for the other commands ------------------------------------------------------------------
    inspect("empty.parquet", "empty.parquet"),
    inspect("noise.parquet", "noise.parquet"),
    inspect("half.parquet", "half.parquet"),
    inspect("retyped.parquet", "reward"),
    inspect("dropped.parquet", "response_tokens"),
    inspect("tampered.parquet", "checksum"),
    inspect("future.parquet", "version"),
    inspect("lists.parquet", "loss_mask"),
    inspect("code.pt", "--trust-pickle"),
    inspect("noise.pt", "noise.pt"),
    inspect("empty.pt", "empty.pt"),
    inspect("nosamples.pt", "samples"),
    inspect("data.csv", "data.csv"),
    Case(
        "hostile file",
        "`inspect` of a path that does not exist",
        _fixed("inspect", "/nonexistent.parquet"),
        "/nonexistent.parquet",
    ),
    Case("hostile file", "`inspect` of a directory", lambda tmp: ["inspect", str(tmp)], ""),
    Case(
        "hostile file",
        "`convert` from a corrupt Parquet",
        lambda tmp: ["convert", _file("half.parquet")(tmp), str(tmp / "out.pt")],
        "half.parquet",
    ),
    Case(
        "hostile file",
        "`convert` to an unknown extension",
        lambda tmp: ["convert", str(good_rollout(tmp)), str(tmp / "out.txt")],
        "out.txt",
    ),
    Case(
        "hostile file",
        "`convert` into a directory that cannot be written",
        lambda tmp: ["convert", str(good_rollout(tmp)), "/proc/out.parquet"],
        "/proc/out.parquet",
    ),
    Case(
        "hostile file",
        "`diff` of a dir that is not a run",
        lambda tmp: ["diff", str(tmp), str(tmp)],
        "not a run directory",
    ),
    Case(
        "hostile file",
        "`diff` of a run with a corrupt rollout",
        lambda tmp: ["diff", _run_dir(tmp, "rollout"), _run_dir(tmp, "ok")],
        "rollout_000000.parquet",
    ),
    Case(
        "hostile file",
        "`diff` of a run whose config.yaml is not YAML",
        lambda tmp: ["diff", _run_dir(tmp, "yaml"), _run_dir(tmp, "ok")],
        "config.yaml",
    ),
    Case(
        "hostile file",
        "`replay` of a run without config.yaml",
        lambda tmp: ["replay", _run_dir(tmp, "noconfig"), "--rollout-id", "0", "--task", "generate"],
        "config.yaml",
    ),
    Case(
        "hostile file",
        "`replay` of a run whose config has an unknown key",
        lambda tmp: ["replay", _run_dir(tmp, "unknown-key"), "--rollout-id", "0", "--task", "generate"],
        "learning",
    ),
    Case(
        "hostile file",
        "`replay` of a rollout that was never recorded",
        lambda tmp: ["replay", _run_dir(tmp, "ok"), "--rollout-id", "5", "--task", "train-step"],
        "rollout_000005",
    ),
    Case(
        "hostile file",
        "`serve` with a config file that does not exist",
        _fixed("serve", "--config", "/none.yaml"),
        "/none.yaml",
    ),
    Case(
        "hostile file",
        "`serve` with a YAML syntax error",
        lambda tmp: ["serve", "--config", _yaml(tmp, "rollout: {num_rollout: [\n", "serve-syntax")],
        "line",
    ),
    Case(
        "hostile file",
        "`serve` with a config that gives a section twice",
        lambda tmp: ["serve", "--config", _yaml(tmp, "rollout: {}\nrollout: {}\n", "serve-dup")],
        "duplicate key 'rollout'",
    ),
    Case(
        "hostile file",
        "`replay` with an --override that is an alias bomb",
        lambda tmp: [
            "replay",
            _run_dir(tmp, "ok"),
            "--rollout-id",
            "0",
            "--task",
            "generate",
            "--override",
            "train.lr=" + ALIAS_BOMB_FLOW,
        ],
        "--override train.lr",
    ),
    Case(
        "hostile file",
        "`doctor` of a run whose config.yaml gives a key twice",
        lambda tmp: ["doctor", _run_dir(tmp, "dup-key")],
        "duplicate key 'name'",
    ),
    Case(
        "hostile file",
        "`--load` of a checkpoint without optimizer.safetensors",
        lambda tmp: ["run", "--load", _save_dir(tmp, "optimizer.safetensors")],
        "optimizer.safetensors: missing",
    ),
    Case(
        "hostile file",
        "`--load` of a checkpoint without rng.safetensors",
        lambda tmp: ["run", "--load", _save_dir(tmp, "rng.safetensors")],
        "rng.safetensors: missing",
    ),
    Case(
        "hostile file",
        "`--load` of a checkpoint without scheduler.json",
        lambda tmp: ["run", "--load", _save_dir(tmp, "scheduler.json")],
        "scheduler.json: missing",
    ),
    Case(
        "hostile file",
        "`--load` of a regular file",
        lambda tmp: ["run", "--load", str(good_rollout(tmp))],
        "not a directory",
    ),
    Case(
        "hostile file",
        "`lint-ckpt` of a --save dir holding only an unfinished save",
        lambda tmp: ["lint-ckpt", _save_dir(tmp, "only-tmp")],
        "1 unfinished save(s) only: iter_0000002.tmp-4242",
    ),
    Case(
        "hostile file",
        "`--load` of a checkpoint whose meta.json is not JSON",
        lambda tmp: ["run", "--load", _checkpoint(tmp, "meta")],
        "meta.json",
    ),
    Case(
        "hostile file",
        "`check-template` of a model dir that does not exist",
        _fixed("check-template", "--hf-checkpoint", "/nonexistent/model"),
        "/nonexistent/model",
    ),
    Case(
        "hostile file",
        "`--load-debug-rollout-data` of a .pt whose unpickling runs code",
        lambda tmp: ["run", "--load-debug-rollout-data", _file("code.pt")(tmp)],
        "--trust-pickle",
    ),
    Case(
        "hostile file",
        "`--load-debug-rollout-data` of a corrupt Parquet",
        lambda tmp: ["run", "--load-debug-rollout-data", _file("half.parquet")(tmp)],
        "half.parquet",
    ),
]


# -- the model's limits, the data's types, fault targets and placement (checked in flows/resolve.py) -----------
def _model(tmp: Path, broken: str = "") -> str:
    """A copy of the tiny-arith model (64 positions) in tmp: whole, without its tokenizer files ("notok"), or with
    config.json / tokenizer.json not JSON ("config.json", "tokenizer.json")."""
    from recipes.tiny_arith.bootstrap import ensure_checkpoint

    d = tmp / f"model-{broken or 'ok'}"
    if not d.is_dir():
        shutil.copytree(ensure_checkpoint(), d)
    if broken == "notok":
        for f in d.glob("tokenizer*"):
            f.unlink()
    if broken.endswith(".json"):
        (d / broken).write_text("{not json\n")
    return str(d)


def _prompts(tmp: Path, rows: list[dict], name: str) -> str:
    return _jsonl(tmp, "".join(json.dumps(r) + "\n" for r in rows), name)


def _own(tmp: Path, *flags: str, rows: list[dict] | None = None, model: str = "") -> list[str]:
    """`rollflow run` on a model and prompt file of the case's own (two "a+b=" prompts with string labels)."""
    rows = rows if rows is not None else [{"input": "1+2=", "label": "3"}, {"input": "2+2=", "label": "4"}]
    data = _prompts(tmp, rows, "own")
    return [
        "run",
        "--run-dir",
        str(tmp / "run"),
        "--hf-checkpoint",
        _model(tmp, model),
        "--prompt-data",
        data,
    ] + list(flags)


def _observe(target: str) -> str:
    return json.dumps(
        [
            {
                "request_id": "f",
                "hook_name": "engine_generate_start"
                if "engine" in target
                else "trainer_step_before_allreduce",
                "target": json.loads(target),
                "action": {"kind": "observe"},
            }
        ]
    )


CASES += [
    Case(
        "model limit",
        "--rollout-max-response-len 500 on a model with 64 positions",
        lambda tmp: _own(
            tmp, "--rm-type", "math", "--label-key", "label", "--rollout-max-response-len", "500"
        ),
        "--rollout-max-response-len 500: the longest prompt of --prompt-data",
    ),
    Case(
        "model limit",
        "--eval-max-response-len 100 on a model with 64 positions",
        lambda tmp: [
            *_own(tmp, "--rm-type", "math", "--label-key", "label", "--eval-max-response-len", "100"),
            "--eval-prompt-data",
            "e",
            _prompts(tmp, [{"input": "3+3=", "label": "6"}], "eval"),
        ],
        "--eval-max-response-len 100: the longest prompt of --eval-prompt-data e",
    ),
    run(
        "--eval-max-response-len",
        "1e9",
        needle="--eval-max-response-len",
        kind="number",
        what="eval length 1e9",
    ),
    run(
        "--eval-max-response-len",
        "1000000000",
        needle="--eval-max-response-len",
        kind="number",
        what="10^9 eval tokens",
    ),
    run("--seed", str(2**70), needle="--seed", kind="number", what="a 70-bit trainer seed"),
    run("--rollout-seed", "-1", needle="--rollout-seed", kind="number", what="a negative rollout seed"),
    Case(
        "data",
        "labels of the wrong type for the reward",
        lambda tmp: _own(
            tmp,
            "--rm-type",
            "tiny-arith",
            "--label-key",
            "label",
            rows=[{"input": "1+2=", "label": "3"}, {"input": "2+2=", "label": 4}],
        ),
        "line 2: --label-key 'label': --rm-type tiny-arith expects a string as the label, got int",
    ),
    Case(
        "data",
        "a built-in reward without --label-key",
        lambda tmp: _own(tmp, "--rm-type", "math"),
        "no --label-key names the row key",
    ),
    Case(
        "data",
        "an empty prompt",
        lambda tmp: _own(
            tmp,
            "--rm-type",
            "math",
            "--label-key",
            "label",
            rows=[{"input": "1+2=", "label": "3"}, {"input": "", "label": "0"}],
        ),
        "own.jsonl line 2: --input-key 'input': the prompt '' encodes to no tokens",
    ),
    Case(
        "data",
        "tools that are not JSON",
        lambda tmp: _own(
            tmp,
            "--rm-type",
            "math",
            "--label-key",
            "label",
            "--apply-chat-template",
            rows=[{"input": "1+2=", "label": "3", "tools": "[{oops"}],
        ),
        "own.jsonl line 1: --tool-key 'tools' is a string that is not JSON",
    ),
    run(
        "--ci-fault-hooks",
        _observe('{"engine": 5}'),
        needle="targets engine 5, but the run has 1 engine(s)",
        kind="combination",
        what="a fault for engine 5 of 1",
    ),
    run(
        "--ci-fault-hooks",
        _observe('{"trainer_rank": 2}'),
        "--data-parallel-size",
        "2",
        needle="targets trainer rank 2, but the run has 2 trainer rank(s)",
        kind="combination",
        what="a fault for trainer rank 2 of 2",
    ),
    run(
        "--actor-num-nodes",
        "2",
        "--data-parallel-size",
        "2",
        needle="--actor-num-nodes 2: a local Ray (no --ray-address) has 1 node(s)",
        kind="placement",
        what="trainers over 2 nodes on a local Ray",
    ),
    run(
        "--actor-resources",
        '{"trainer_node": 1}',
        needle="--actor-resources: the run's placement group needs 1 trainer_node",
        kind="placement",
        what="a resource no node of a local Ray has",
    ),
    Case(
        "path",
        "a model dir without tokenizer files",
        lambda tmp: ["run", "--run-dir", str(tmp / "run"), "--hf-checkpoint", _model(tmp, "notok")],
        "no tokenizer files (none of tokenizer.json",
    ),
    Case(
        "hostile file",
        "a model whose config.json is not JSON",
        lambda tmp: ["run", "--run-dir", str(tmp / "run"), "--hf-checkpoint", _model(tmp, "config.json")],
        "config.json line 1 column 2: not valid JSON",
    ),
    Case(
        "hostile file",
        "a model whose tokenizer.json is not JSON",
        lambda tmp: ["run", "--run-dir", str(tmp / "run"), "--hf-checkpoint", _model(tmp, "tokenizer.json")],
        "tokenizer.json line 1 column 2: not valid JSON",
    ),
]


# -- Parquet sizes declared before reading, damaged run dirs for diff and replay (issue 12, items 2 and 5) -------
def _declared_tokens(tokens: int, rows: int) -> Callable[[Path, Path], None]:
    """A rollout of `rows` samples whose response_tokens hold `tokens` zeros in all: a few KB on disk that
    declare them in the footer (the content checksum is not updated: the footer alone must refuse it)."""

    def make(good: Path, target: Path) -> None:
        import numpy as np

        table = pq.read_table(good)
        table = pa.concat_tables([table] * (rows // table.num_rows + 1)).slice(0, rows)
        cuts = [tokens * i // rows for i in range(rows + 1)]
        values = pa.array(np.zeros(tokens, np.int32))
        column = pa.ListArray.from_arrays(pa.array(cuts, pa.int32()), values)
        i = table.schema.get_field_index("response_tokens")
        pq.write_table(table.set_column(i, "response_tokens", column), target, compression="zstd")

    return make


HOSTILE_FILES["tokens.parquet"] = (
    "an 8 KB Parquet declaring 20 M tokens",
    _hostile("h/tokens.parquet", _declared_tokens(20_000_000, 1)),
)
HOSTILE_FILES["long.parquet"] = (
    "samples of 100 tokens for a model of 64 positions",
    _hostile("h/long.parquet", _declared_tokens(400, 4)),
)


def _prompts_declaring(tokens: int) -> Callable[[Path], str]:
    """A Parquet prompt file whose one row carries a list of `tokens` zeros (a few KB on disk)."""

    def build(tmp: Path) -> str:
        import numpy as np

        path = tmp / "prompts-big.parquet"
        values = pa.array(np.zeros(tokens, np.int32))
        column = pa.ListArray.from_arrays(pa.array([0, tokens], pa.int32()), values)
        pq.write_table(pa.table({"input": ["1+1="], "label": ["2"], "ids": column}), path, compression="zstd")
        return str(path)

    return build


def _damaged_run(tmp: Path, what: str) -> str:
    """A hand-made run dir (see `_run_dir`) with its metrics.jsonl or its rollout damaged as `what` says."""
    d = Path(_run_dir(tmp, f"damaged-{what}"))
    rollout = d / "rollouts" / "rollout_000000.parquet"
    if what in ("tampered.parquet", "dropped.parquet", "long.parquet"):
        shutil.copy(HOSTILE_FILES[what][1](tmp), rollout)
    if what == "long.parquet":  # the tiny-arith model: 64 positions
        from recipes.tiny_arith.bootstrap import ensure_checkpoint

        (d / "config.yaml").write_text(f"name: x\nhf_checkpoint: {ensure_checkpoint()}\n")
    records = {
        "no-id": {"kind": "step", "step": 0, "metrics": {"train/loss": 0.1}},
        "text-step": {"kind": "step", "rollout_id": 0, "step": "zero", "metrics": {}},
        "list-metrics": {"kind": "rollout", "rollout_id": 0, "metrics": ["x" * 500]},
    }
    if what in records:
        (d / "metrics.jsonl").write_text(json.dumps(records[what]) + "\n")
    return str(d)


def _replay_of(what: str, task: str = "generate") -> Callable[[Path], list[str]]:
    return lambda tmp: ["replay", _damaged_run(tmp, what), "--rollout-id", "0", "--task", task]


CASES += [
    inspect("tokens.parquet", "declares 20000000 values of response_tokens.list.element in 1 row(s)"),
    Case(
        "hostile file",
        "`convert` of an 8 KB Parquet declaring 20 M tokens",
        lambda tmp: ["convert", _file("tokens.parquet")(tmp), str(tmp / "out.pt")],
        "tokens.parquet: declares 20000000 values",
    ),
    Case(
        "hostile file",
        "`--load-debug-rollout-data` of samples longer than the model's 64 positions",
        lambda tmp: [
            "run",
            "--run-dir",
            str(tmp / "run"),
            "--load-debug-rollout-data",
            _file("long.parquet")(tmp),
        ],
        "long.parquet: declares 400 values of response_tokens.list.element in 4 row(s) (row group 0), more than 64",
    ),
    Case(
        "hostile file",
        "`--prompt-data` Parquet declaring 20 M values in one row",
        lambda tmp: [
            "run",
            "--run-dir",
            str(tmp / "run"),
            "--prompt-data",
            _prompts_declaring(20_000_000)(tmp),
            "--rm-type",
            "math",
        ],
        "prompts-big.parquet: declares 20000000 values of ids.list.element",
    ),
    Case(
        "hostile file",
        "`diff` of a run whose metrics record has no rollout_id",
        lambda tmp: ["diff", _damaged_run(tmp, "no-id"), _run_dir(tmp, "ok")],
        "metrics.jsonl line 1: 'rollout_id' is missing",
    ),
    Case(
        "hostile file",
        "`diff` of a run whose metrics record has a text step",
        lambda tmp: ["diff", _run_dir(tmp, "ok"), _damaged_run(tmp, "text-step")],
        "metrics.jsonl line 1: 'step' is 'zero', not an int",
    ),
    Case(
        "hostile file",
        "`diff` of a run whose rollout lacks a column (checksum kept)",
        lambda tmp: ["diff", _damaged_run(tmp, "dropped.parquet"), _run_dir(tmp, "ok")],
        "missing required column(s) ['response_tokens']",
    ),
    Case(
        "hostile file",
        "`replay` of a run whose rollout was tampered with",
        _replay_of("tampered.parquet"),
        "rollout_000000.parquet: content checksum mismatch",
    ),
    Case(
        "hostile file",
        "`replay` of a run whose rollout lacks a column (checksum kept)",
        _replay_of("dropped.parquet"),
        "missing required column(s) ['response_tokens']",
    ),
    Case(
        "hostile file",
        "`replay` of a run whose samples are longer than its model's positions",
        _replay_of("long.parquet"),
        "more than 64 per row",
    ),
    Case(
        "hostile file",
        "`replay --task check` of a run whose metrics record holds a list",
        _replay_of("list-metrics", "check"),
        "metrics.jsonl line 1: 'metrics' is ['xxxxxxxx",
    ),
]

# slime's loss and sampling plug-ins
CASES += [
    run(
        "--loss-type",
        "custom_loss",
        needle="needs --custom-loss-function-path",
        kind="combination",
        what="a custom loss without its path",
    ),
    run(
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        "nowhere_xyz.loss",
        needle="cannot import 'nowhere_xyz'",
        kind="path",
        what="a custom loss that does not import",
    ),
    run(
        "--dynamic-sampling-filter-path",
        "nowhere_xyz.keep",
        needle="cannot import 'nowhere_xyz'",
        kind="path",
        what="a dynamic sampling filter that does not import",
    ),
    run(
        "--buffer-filter-path",
        "examples.buffer_filter.retry.fewest_tries_first",
        needle="needs --rollout-function-path",
        kind="combination",
        what="a buffer filter without a rollout function to serve",
    ),
    run(
        "--partial-rollout",
        needle="no partial sample is left",
        kind="combination",
        what="slime's --partial-rollout",
    ),
]


# plug-ins called by `run --dry-run` on probe samples (rollout/plugin_check.py), each given another plug-in's path
def _dry_run(*flags: str) -> Callable[[Path], list[str]]:
    def argv(tmp: Path) -> list[str]:
        data = _jsonl(tmp, '{"input": "1+2=", "label": "3"}\n', "sums")  # prompts the tiny tokenizer encodes
        return [
            "run",
            "--dry-run",
            "--run-dir",
            str(tmp / "run"),
            "--prompt-data",
            data,
            "--label-key",
            "label",
            *flags,
        ]

    return argv


CASES += [
    Case(
        "plug-in",
        "`run --dry-run`: a --group-rm reward that returns a filter's verdict",
        _dry_run("--custom-rm-path", "examples.dapo_filter.filters.mixed_and_finished", "--group-rm"),
        "called as reward(args, samples) on a group of 1 sample of --prompt-data",
    ),
    Case(
        "plug-in",
        "`run --dry-run`: a dynamic sampling filter of another signature",
        _dry_run("--rm-type", "exact_match", "--dynamic-sampling-filter-path", "rollout.sample.label_text"),
        "called as filter(args, samples) on a group of 1 sample of --prompt-data",
    ),
    Case(
        "plug-in",
        "`run --dry-run`: a dynamic sampling filter given as the buffer filter",
        _dry_run(
            "--rm-type",
            "exact_match",
            "--rollout-function-path",
            "examples.buffer_filter.retry.generate_rollout",
            "--buffer-filter-path",
            "examples.dapo_filter.filters.mixed_and_finished",
        ),
        "mixed_and_finished() takes 2 positional arguments but 4 were given",
    ),
    Case(
        "plug-in",
        "`run --dry-run`: a buffer filter given as the custom loss",
        _dry_run(
            "--rm-type",
            "exact_match",
            "--loss-type",
            "custom_loss",
            "--custom-loss-function-path",
            "rollout.plugins.pop_first",
        ),
        "called as a trainer calls it on a synthetic micro-batch of 2 samples",
    ),
]
