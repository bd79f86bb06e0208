"""`rollflow check-template`: render prompts the way the engine gets them and full turns the way a trainer
scores them, and report where they disagree (exit 1, naming the first differing token)."""

from __future__ import annotations

import argparse
import json
import sys

from rollout.data import DataError, Keys, load_prompts, tokenizer_at
from rollout.template import _probe_text, check_examples, format_check, resolve_stops


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
        if args.prompt_data:
            keys = Keys(
                args.input_key,
                args.label_key,
                "metadata",
                "tools",
                True,
                json.dumps(kwargs, sort_keys=True),
                None,
            )
            prompts = load_prompts(args.prompt_data, tok, keys).prompts[: args.examples]
            examples = [
                (
                    list(p.messages or []),
                    p.label if isinstance(p.label, str) and p.label else _probe_text(tok),
                )
                for p in prompts
            ]
        else:
            probe = _probe_text(tok)
            examples = [([{"role": "user", "content": probe}], probe)]
        checks = check_examples(tok, examples, stops, kwargs)
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
