"""The one way rollflow reads YAML a user gives it (`--config`, a run's config.yaml, `--override` values).

PyYAML's `safe_load` runs no code, but it keeps the last of two equal keys (a second `rollout:` section silently
replaces the first), and its aliases let a few hundred bytes stand for gigabytes once the values are walked (a
432-byte alias bomb hung `run --config` for minutes). This loader refuses both, and documents over a size bound,
each as a `MarkedYAMLError` naming the line, which `describe_error` turns into one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_YAML_BYTES = 1 << 20  # a resolved run config is a few KB; a megabyte is a mistake or an attack
MAX_ALIASES = 100
# what the document may weigh once aliases are expanded (a value counts 1, a scalar also its length): a
# document of MAX_YAML_BYTES without aliases weighs less, so only alias expansion reaches it
MAX_EXPANDED = 2 * MAX_YAML_BYTES
QUOTE_LIMIT = 200
_MERGE_TAG = "tag:yaml.org,2002:merge"


def bounded(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text`, cut to `limit` characters with a "... (N characters)" marker when longer, so that an error
    message quoting a user's value stays one readable line."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, bounded like `bounded`."""
    return bounded(repr(value), limit)


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys, more than MAX_ALIASES aliases, recursive aliases and
    a document whose aliases expand it past MAX_EXPANDED (checked while composing, before anything is built)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._weights: dict[int, int] = {}  # id(node) -> its weight with aliases expanded, once composed

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise ComposerError(None, None, f"more than {MAX_ALIASES} aliases", event.start_mark)
            target = self.anchors.get(event.anchor)
            if target is not None and id(target) not in self._weights:
                raise ComposerError(
                    None,
                    None,
                    f"alias *{bounded(event.anchor, 40)} refers to a value that contains it",
                    event.start_mark,
                )
        node: Node = super().compose_node(parent, index)
        if id(node) not in self._weights:
            self._weights[id(node)] = weight = self._weight(node)
            if weight > MAX_EXPANDED:
                raise ComposerError(
                    None,
                    None,
                    f"aliases expand this value past {MAX_EXPANDED} values and characters",
                    node.start_mark,
                )
        return node

    def _weight(self, node: Node) -> int:
        if isinstance(node, ScalarNode):
            return 1 + len(node.value)
        if isinstance(node, SequenceNode):
            return 1 + sum(self._weights[id(child)] for child in node.value)
        if isinstance(node, MappingNode):
            return 1 + sum(self._weights[id(k)] + self._weights[id(v)] for k, v in node.value)
        return 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # checked before SafeConstructor flattens `<<` merges: a key given after a merge overrides it by design
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeConstructor refuses it with its own message
                continue
            if first is not None:
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {quote(key, 60)} (first at line {first + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def describe_error(e: yaml.YAMLError) -> str:
    """One line for a YAML error: "at line L column C: problem" (or the first line of the message)."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{where}: {bounded(problem)}"


def loads(text: str) -> Any:
    """Parse one YAML document with `BoundedLoader`; raises `yaml.YAMLError` (see `describe_error`)."""
    if len(text) > MAX_YAML_BYTES:
        raise yaml.YAMLError(f"{len(text)} characters, more than the {MAX_YAML_BYTES} a YAML value may have")
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read(path: Path, what: str) -> Any:
    """The YAML document in `path` (anything YAML holds; None when empty); raises ValueError with one line that
    starts with `what` (the flag or file the user knows it by): a missing file, more than MAX_YAML_BYTES, not
    UTF-8, or anything `BoundedLoader` refuses, with its line."""
    if not path.is_file():
        raise ValueError(f"{what}: no such file")
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ValueError(f"{what}: {size} bytes, more than the {MAX_YAML_BYTES} a config file may have")
    with open(path, "rb") as f:
        raw = f.read(MAX_YAML_BYTES + 1)  # the file may have grown since the stat
    if len(raw) > MAX_YAML_BYTES:
        raise ValueError(f"{what}: more than the {MAX_YAML_BYTES} bytes a config file may have")
    try:
        return loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{what}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{what}: not valid YAML{describe_error(e)}") from None
