"""Bad --config files: syntax errors, wrong shapes, unknown or repeated keys, YAML alias bombs and files or values
too large."""

from __future__ import annotations

from tests.bad_inputs.common import Case, _yaml, run

# 9 levels of 9 aliases: 9^9 values once expanded (billion laughs, in YAML)
ALIAS_BOMB = "a0: &a0 [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)
)
ALIAS_BOMB_FLOW = "{" + ALIAS_BOMB.strip().replace("\n", ", ") + "}"
# under the alias count, over the expansion bound: 64 KB strings repeated
WIDE_ALIASES = (
    f"s: &s {'y' * 65536}\n" + f"t: &t [{', '.join(['*s'] * 8)}]\n" + f"u: [{', '.join(['*t'] * 8)}]\n"
)


CONFIG_FILE_CASES: list[Case] = [
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
]
