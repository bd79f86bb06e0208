"""`rollflow check-template`: render prompts the way the engine gets them and full turns the way a trainer
scores them, and report where they disagree (exit 1, naming the first differing token)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rollout.data import DataError, Keys, load_prompts, tokenizer_at
from rollout.template import _probe_text, check_examples, engine_side_problem, format_check, resolve_stops


def check_template_command(args: argparse.Namespace) -> int:
    try:
        tok = tokenizer_at(args.hf_checkpoint)
    except (OSError, ValueError) as e:
        print(
            f"rollflow: error: --hf-checkpoint {args.hf_checkpoint}: cannot load a tokenizer ({e})",
            file=sys.stderr,
        )
        return 2
    kwargs = args.apply_chat_template_kwargs
    try:
        stops = resolve_stops(tok, args.hf_checkpoint, args.rollout_stop, args.rollout_stop_token_ids, kwargs)
        keys = Keys(
            args.input_key if args.prompt_data else "input",
            args.label_key if args.prompt_data else None,
            "metadata",
            "tools",
            True,
            json.dumps(kwargs, sort_keys=True),
            None,
        )
        with tempfile.TemporaryDirectory() as tmp:
            data = args.prompt_data
            if not data:  # the probe goes through the run's prompt pipeline too: the engine's side of it
                data = str(Path(tmp) / "probe.jsonl")
                Path(data).write_text(json.dumps({"input": _probe_text(tok)}) + "\n")
            # the prompts as the run gives them to the engine (rendered and tokenized by rollout/data.py)
            prompts = load_prompts(data, tok, keys).prompts[: args.examples]
        examples = [
            (list(p.messages or []), p.label if isinstance(p.label, str) and p.label else _probe_text(tok))
            for p in prompts
        ]
        checks = check_examples(tok, examples, stops, kwargs)
        for p, c in zip(prompts, checks, strict=True):
            problem = engine_side_problem(tok, p.text, list(p.tokens), c)
            if problem:
                c.problems.insert(0, problem)
    except (DataError, ValueError) as e:
        print(f"rollflow: error: {e}", file=sys.stderr)
        return 2
    print(
        f"stop token ids: {list(stops.ids)} {[tok.convert_ids_to_tokens(i) for i in stops.ids]}"
        + (f"; stop strings {list(stops.strings)}" if stops.strings else "")
    )
    for i, c in enumerate(checks):
        print(f"example {i}:\n{format_check(tok, c)}")
    bad = [p for c in checks for p in c.problems]
    if bad:
        print(f"rollflow check-template: MISMATCH: {bad[0]}", file=sys.stderr)
        return 1
    print(f"rollflow check-template: ok ({len(checks)} example(s))")
    return 0
