"""A slime launch script (`scripts/run-*.sh`) read as the argument list its `train.py` line passes: the bash arrays
(`MODEL_ARGS=( ... )`) and the `source`d model script expanded, `${VAR:-default}` filled in from `variables` or
the default. Only what slime's launch scripts use is understood: array and plain assignments, `source`, comments,
line continuations and the `${NAME[@]}` / `${VAR}` / `${VAR:-x}` expansions; command substitutions are left as
text."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

_ARRAY = re.compile(r"^\s*([A-Za-z_]\w*)=\((.*?)^\s*\)", re.S | re.M)
_ARRAY_ONE_LINE = re.compile(r"^\s*([A-Za-z_]\w*)=\(([^)\n]*)\)\s*$", re.M)
_PLAIN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=([^(\s][^\n]*)?$", re.M)
_SOURCE = re.compile(r"^\s*(?:source|\.)\s+(\S+)\s*$", re.M)
_EXPANSION = re.compile(r"\$\{([A-Za-z_]\w*)(\[@\])?(?::-([^}]*))?\}|\$([A-Za-z_]\w*)")


def train_args(
    script: str | Path, variables: dict[str, str] | None = None, entry: str = "train.py"
) -> list[str]:
    """The arguments the script passes to `entry` (slime's `train.py`), every array and variable expanded;
    ValueError when the script has no `entry` line or sources a file that is not there."""
    path = Path(script)
    env = dict(variables or {})
    arrays: dict[str, list[str]] = {}
    text = _read(path, env, arrays)
    joined = re.sub(r"\\\n", " ", text)
    line = next((ln for ln in joined.splitlines() if re.search(rf"\s{re.escape(entry)}(\s|$)", ln)), None)
    if line is None:
        raise ValueError(f"{path}: no line runs {entry}")
    tail = line.split(entry, 1)[1]
    out: list[str] = []
    for token in shlex.split(tail, comments=True):
        match = re.fullmatch(r"\$\{([A-Za-z_]\w*)\[@\]\}", token)
        if match:
            out += arrays.get(match.group(1), [])
        else:
            out.append(_expand(token, env, arrays))
    return out


def arrays_of(script: str | Path, variables: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Every bash array the script (and what it sources) defines, expanded: a model script's MODEL_ARGS."""
    arrays: dict[str, list[str]] = {}
    _read(Path(script), dict(variables or {}), arrays)
    return arrays


def _read(path: Path, env: dict[str, str], arrays: dict[str, list[str]]) -> str:
    """The script's text; its arrays and plain variables recorded, sourced files read in place."""
    text = path.read_text()
    env.setdefault("SCRIPT_DIR", str(path.parent))
    for match in _SOURCE.finditer(text):
        target = _expand(shlex.split(match.group(1))[0], env, arrays)
        _read(_sourced(Path(target), path), env, arrays)
    for match in _PLAIN.finditer(text):
        name, value = match.group(1), (match.group(2) or "").strip()
        if name in env or "$(" in value or "`" in value:
            continue
        try:
            expanded = _expand(" ".join(shlex.split(value, comments=True)), env, arrays) if value else ""
        except ValueError:  # a quoted value over several lines (a JSON env block): not an argument
            continue
        if "${" not in expanded:  # one that names a variable the script computes stays unset
            env[name] = expanded
    for pattern in (_ARRAY, _ARRAY_ONE_LINE):
        for match in pattern.finditer(text):
            items = shlex.split(match.group(2), comments=True)
            arrays[match.group(1)] = [_expand(item, env, arrays) for item in items]
    return text


def _sourced(target: Path, script: Path) -> Path:
    """A sourced file: where the script names it, else the same tail under the script's parent dirs (slime's
    reproducibility script names scripts/models/... under its own scripts/ dir)."""
    if target.is_file():
        return target
    tail = target.relative_to(script.parent) if target.is_relative_to(script.parent) else Path(target.name)
    for root in script.resolve().parents:
        for cut in range(len(tail.parts)):
            candidate = root.joinpath(*tail.parts[cut:])
            if candidate.is_file():
                return candidate
    raise ValueError(f"{script}: sources {target}, which is not there")


def _expand(token: str, env: dict[str, str], arrays: dict[str, list[str]]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(4)
        if match.group(2):
            return " ".join(arrays.get(name, []))
        if name in env and env[name] != "":
            return env[name]
        return match.group(3) if match.group(3) is not None else match.group(0)

    return _EXPANSION.sub(one, token)
