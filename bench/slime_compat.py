"""How `rollflow run` takes slime launch scripts: each script's `train.py` arguments (bash arrays and the sourced
model script expanded, flows/slime_script.py), with only paths and sizes swapped, parsed by rollflow's own parser
and config (`flows.cli.parse_args` + `build_config`), checked against the local model's config.json
(`flows.resolve.check_model_args`) and, with --resolve, resolved as a run is before it starts. Prints per flag:
accepted (slime's meaning), accepted and checked against config.json, ignored with the start-up notice, or refused
(with the line that says what to do), then the totals.

Paths become a local HF model of the script's family (tiny-arith's Qwen2 model; a Qwen3 model of the same size,
randomly initialised, for a script with --qk-layernorm) and JSONL files made from the tiny-arith prompts under the
script's --input-key/--label-key. Sizes become CPU-sized: the architecture numbers those of the local model, one
trainer slot and one engine slot per engine, TP 1, a few prompts and tokens.

    python bench/slime_compat.py [SCRIPT ...] [--mirror SLIME_GIT_DIR] [--resolve]

Default scripts: scripts/run-qwen2.5-0.5B-reproducibility.sh and scripts/run-qwen3-4B.sh, read from the slime
mirror (a bare git dir) when it is there, else from tests/data/slime_scripts/.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_SCRIPTS = ("scripts/run-qwen2.5-0.5B-reproducibility.sh", "scripts/run-qwen3-4B.sh")
MIRROR = Path("/work/.mirror/THUDM+slime/repo")

# flag -> its CPU size (None: computed below)
SIZES: dict[str, str | None] = {
    "--num-rollout": "2",
    "--rollout-batch-size": "4",
    "--n-samples-per-prompt": "4",
    "--global-batch-size": None,  # rollout batch x samples: one step per rollout
    "--rollout-max-response-len": "8",
    "--eval-max-response-len": "8",
    "--n-samples-per-eval-prompt": "2",
    "--actor-num-gpus-per-node": "1",
    "--tensor-model-parallel-size": "1",
    "--rollout-num-gpus-per-engine": "1",
    "--save-interval": "1",
    "--eval-interval": "1",
    "--max-tokens-per-gpu": "256",
}
PATHS = ("--hf-checkpoint", "--ref-load", "--load", "--save", "--prompt-data", "--eval-prompt-data")
STATUSES = ("accepted", "checked", "notice", "refused")


def script_files(names: list[str], mirror: Path, into: Path) -> list[Path]:
    """The scripts (and the model scripts they source) as files: paths given as they are, names of slime's
    scripts from the mirror, else from tests/data/slime_scripts."""
    out = []
    for name in names:
        if Path(name).is_file():
            out.append(Path(name))
            continue
        if mirror.is_dir():
            listed = subprocess.run(
                ["git", "-C", str(mirror), "ls-tree", "-r", "--name-only", "HEAD", "scripts/"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            for rel in [name, *(p for p in listed if p.startswith("scripts/models/"))]:
                target = into / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(
                    subprocess.run(
                        ["git", "-C", str(mirror), "show", f"HEAD:{rel}"], capture_output=True, check=True
                    ).stdout
                )
            out.append(into / name)
        else:
            out.append(ROOT / "tests" / "data" / "slime_scripts" / name)
    return out


def local_model(family: str, into: Path) -> Path:
    """A local HF model dir: tiny-arith's Qwen2 model, or a Qwen3 of its size (random weights, its tokenizer)."""
    from recipes.registry import get_recipe

    base = get_recipe("tiny-arith").ensure_checkpoint()
    if family == "qwen2":
        return base
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    out = into / "tiny-qwen3"
    if (out / "config.json").is_file():
        return out
    cfg = json.loads((base / "config.json").read_text())
    torch.manual_seed(0)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    qwen3 = Qwen3Config(
        **{k: cfg[k] for k in keys},
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg["hidden_size"] // cfg["num_attention_heads"],
        max_position_embeddings=cfg["max_position_embeddings"],
        rms_norm_eps=cfg["rms_norm_eps"],
        tie_word_embeddings=cfg["tie_word_embeddings"],
        bos_token_id=cfg["bos_token_id"],
        eos_token_id=cfg["eos_token_id"],
        pad_token_id=cfg["pad_token_id"],
    )
    Qwen3ForCausalLM(qwen3).save_pretrained(out)
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        if (base / name).is_file():
            shutil.copy(base / name, out / name)
    # the tokenizer class transformers picks for tiny-arith's qwen2 model_type, named: a qwen3 one gets another
    tok = json.loads((base / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**tok, "tokenizer_class": "Qwen2Tokenizer"}))
    return out


def local_data(input_key: str, label_key: str, split: str, like: str, into: Path) -> Path:
    """A JSONL file of tiny-arith prompts (chat messages + label, under the script's keys), named as the script's
    file `like` is (its dir and stem: a run is named after its data)."""
    import pyarrow.parquet as pq

    from recipes.registry import get_recipe

    parquet = dict(zip(("train", "eval"), get_recipe("tiny-arith").ensure_data(), strict=True))[split]
    original = Path(like)
    path = (
        into
        / "data"
        / f"{input_key}-{label_key}"
        / original.parent.name
        / (original.name.split(".")[0] + ".jsonl")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = pq.read_table(parquet).slice(0, 64).to_pylist()
    path.write_text("".join(json.dumps({input_key: r["prompt"], label_key: r["label"]}) + "\n" for r in rows))
    return path


def swapped(argv: list[str], into: Path) -> tuple[list[str], dict[str, str]]:
    """`argv` with paths and sizes swapped; also {flag: the value it had} for every swapped flag."""
    from config.arch import hf_values
    from flows.cli import flag

    values = _values(argv)
    family = "qwen3" if "--qk-layernorm" in values else "qwen2"
    model = local_model(family, into)
    hf = hf_values(json.loads((model / "config.json").read_text()))
    arch_numbers = {
        flag(k): str(v) for k, v in hf.items() if not isinstance(v, bool) and not isinstance(v, str)
    }
    keys = ((values.get("--input-key") or ["input"])[0], (values.get("--label-key") or ["label"])[0])
    batch = int(SIZES["--rollout-batch-size"] or 1) * int(SIZES["--n-samples-per-prompt"] or 1)
    out: list[str] = []
    was: dict[str, str] = {}
    for name, args in _groups(argv):
        new = list(args)
        if name in ("--hf-checkpoint", "--ref-load"):
            new = [str(model)]
        elif name in ("--load", "--save"):
            new = [str(into / "ckpt")]
        elif name == "--prompt-data":
            new = [str(local_data(*keys, "train", args[0], into))]
        elif name == "--eval-prompt-data":
            new = [x if i % 2 == 0 else str(local_data(*keys, "eval", x, into)) for i, x in enumerate(args)]
        elif name == "--global-batch-size":
            new = [str(batch)]
        elif name in SIZES and SIZES[name] is not None:
            new = [str(SIZES[name])]
        elif name in arch_numbers and args and not _same_number(args[0], arch_numbers[name]):
            new = [arch_numbers[name]]
        if new != args:
            was[name] = " ".join(args)
        out += [name, *new]
    return out, was


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def unswapped_arch(argv: list[str], local: list[str]) -> str:
    """The refusal the script's own architecture flags get against the local model (the check at work)."""
    from config.arch import ArchConfig, check_arch
    from flows.cli import build_config, parse_args

    arch_flags = {"--" + n.replace("_", "-") for n in ArchConfig.model_fields}
    own = [t for name, args in _groups(argv) if name in arch_flags for t in (name, *args)]
    model = _values(local)["--hf-checkpoint"][0]
    try:
        check_arch(
            build_config(parse_args(["run", *own])).arch,
            json.loads(Path(model, "config.json").read_text()),
            "config.json",
        )
    except ValueError as e:
        return str(e)
    return "accepted"


def _groups(argv: list[str]) -> list[tuple[str, list[str]]]:
    """argv as (flag, its values) in order."""
    groups: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            groups.append((token, []))
        elif groups:
            groups[-1][1].append(token)
    return groups


def _values(argv: list[str]) -> dict[str, list[str]]:
    return dict(_groups(argv))


def classify(argv: list[str], resolve: bool) -> tuple[dict[str, tuple[str, str]], list[str], str]:
    """{flag: (status, note)} for every flag of `argv`, the notice lines and the run's name; a refused flag is
    dropped and the rest tried again, so each refusal is the flag's own."""
    from config.slime_compat import FLAGS, notices
    from flows.cli import build_config, parse_args
    from flows.resolve import check_model_args
    from flows.resolve import resolve as resolve_run

    flags = [name for name, _ in _groups(argv)]
    refused: dict[str, str] = {}
    rest = list(argv)
    while True:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                cfg = build_config(parse_args(["run", *rest]))
                check_model_args(cfg)
                if resolve:
                    resolve_run(cfg, build=True)
            break
        except (SystemExit, ValueError) as e:
            line = (str(e) if isinstance(e, ValueError) else err.getvalue()).strip().splitlines()[-1]
            line = line.removeprefix("rollflow: error: ")
            named = _named_flag(line, [f for f in flags if f not in refused])
            if named is None:
                raise RuntimeError(f"refused without naming a flag of the script: {line}") from None
            refused[named] = line
            rest = [t for name, args in _groups(rest) if name != named for t in (name, *args)]
    lines = notices(cfg)
    out: dict[str, tuple[str, str]] = {}
    for name in flags:
        entry = FLAGS.get("--sglang-*" if name.startswith("--sglang-") else name)
        if name in refused:
            out[name] = ("refused", refused[name])
        elif any(name in line for line in lines):
            out[name] = ("notice", entry[1] if entry else "")
        elif entry and entry[0] == "checked":
            out[name] = ("checked", "matches config.json")
        else:
            out[name] = ("accepted", entry[1] if entry else "")
    return out, lines, cfg.name


def _named_flag(line: str, flags: list[str]) -> str | None:
    """The first of `flags` the refusal names (a whole flag, not a prefix of a longer one)."""
    import re

    hits = [(m.start(), f) for f in flags if (m := re.search(rf"{re.escape(f)}(?![\w-])", line))]
    return min(hits)[1] if hits else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scripts", nargs="*", default=list(DEFAULT_SCRIPTS), help="slime launch scripts")
    parser.add_argument(
        "--mirror", type=Path, default=MIRROR, help="slime's git dir (bare) to read scripts from"
    )
    parser.add_argument(
        "--resolve", action="store_true", help="also resolve each line as a run does (data, reward)"
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="make the local model, data and checkpoints in DIR (kept) and print each swapped `rollflow run` line",
    )
    args = parser.parse_args()
    from flows.slime_script import train_args

    totals = dict.fromkeys(STATUSES, 0)
    seen: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep.resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for script in script_files(args.scripts, args.mirror, work / "slime"):
            argv = train_args(script, {"NUM_GPUS": "8"})
            local, was = swapped(argv, work)
            statuses, lines, run_name = classify(local, args.resolve)
            print(f"\n## {script.name}: {len(statuses)} distinct flags\n")
            print("| flag | slime value | bench value | status | note |")
            print("|---|---|---|---|---|")
            values = _values(local)
            for name, (status, note) in statuses.items():
                old = was.get(name, " ".join(values.get(name, [])))
                new = " ".join(values.get(name, [])) if name in was else "="
                print(f"| {name} | {_short(old)} | {_short(new)} | {status} | {note.replace('|', '/')} |")
                seen.setdefault(name, status)
            counts = {s: sum(v[0] == s for v in statuses.values()) for s in STATUSES}
            print(f"\n{script.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
            print(f"run name: {run_name}")
            for line in lines:
                print(f"notice: {line}")
            print(
                f"the script's own architecture flags against the local model: {unswapped_arch(argv, local)}"
            )
            if args.keep:
                print("rollflow run " + " ".join(shlex.quote(t) for t in local))
            for s in STATUSES:
                totals[s] += counts[s]
    distinct = {s: sum(v == s for v in seen.values()) for s in STATUSES}
    print(f"\nall scripts: {len(seen)} distinct flags: " + ", ".join(f"{n} {s}" for s, n in distinct.items()))


def _short(text: str, width: int = 40) -> str:
    text = text.replace("|", "/")
    return text if len(text) <= width else "..." + text[-(width - 3) :]


if __name__ == "__main__":
    main()
