"""The sample a plug-in sees: slime's `Sample`, with slime's field names and meanings, so a slime reward
(`--custom-rm-path`), generate function (`--custom-generate-function-path`) or rollout function
(`--rollout-function-path`) reads and fills it unchanged.

`tokens` is the whole sequence (prompt then response); the response is its last `response_length` tokens, and
`loss_mask` / `rollout_log_probs` are aligned with those. A token the model did not produce (a tool's output, an
environment's observation) carries loss mask 0, and its rollout log-prob is a placeholder the trainer never reads.
`status` says how generation ended: PENDING before, COMPLETED at a stop, TRUNCATED at the length limit, ABORTED
when it was stopped, FAILED when a tool, parser or reward failed.

`to_row` / `from_row` convert to and from the rollout Parquet row (artifacts.schema.Sample), which is what every
later stage and `rollflow replay` read.
"""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from typing import Any

from artifacts.schema import Sample as Row


class SampleError(ValueError):
    """A sample a plug-in returned that cannot become a rollout row; the message names the sample and field."""


@dataclasses.dataclass
class Sample:
    """One response to one prompt, as slime's `slime.utils.types.Sample` (see the module docstring)."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = dataclasses.field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    # rollflow's: the sample's sampling seed, from --rollout-seed, the rollout and the index. Every engine call
    # for this sample derives its own seed from it, so a replay samples the same tokens.
    seed: int | None = None

    @property
    def prompt_tokens(self) -> list[int]:
        """The prompt part of `tokens`."""
        return self.tokens[: len(self.tokens) - self.response_length]

    @property
    def response_tokens(self) -> list[int]:
        """The response part of `tokens` (its last `response_length`)."""
        return self.tokens[len(self.tokens) - self.response_length :] if self.response_length else []

    @property
    def effective_response_length(self) -> int:
        """Response tokens that are trained on (loss mask 1)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def get_reward_value(self, args: Any) -> float:
        """The scalar reward: `reward` itself, or its `args.reward_key` entry when the reward is a dict."""
        key = getattr(args, "reward_key", None)
        value = self.reward[key] if key and isinstance(self.reward, dict) else self.reward
        if value is None or isinstance(value, dict):
            raise SampleError(f"sample {self.index}: no scalar reward (reward is {self.reward!r})")
        return float(value)

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: list[int] | None = None,
        log_probs: list[float] | None = None,
        trainable: bool = True,
        meta_info: dict[str, Any] | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Add response tokens, keeping `loss_mask` and `rollout_log_probs` aligned with them. The model's own
        tokens (`trainable`) need their rollout log-probs and get loss mask 1; a tool's or environment's tokens
        (`trainable=False`) take no log-probs and get loss mask 0 and placeholder log-probs. `text` is appended
        to `response`; an engine answer's `meta_info` (rollout.engine_client) sets the status from its finish
        reason and records its weight version."""
        new = [int(t) for t in tokens or []]
        lps = None if log_probs is None else [float(x) for x in log_probs]
        if lps is not None and len(lps) != len(new):
            raise SampleError(f"sample {self.index}: {len(lps)} log-probs for {len(new)} tokens")
        if new and trainable and lps is None:
            raise SampleError(f"sample {self.index}: the model's tokens need their rollout log-probs")
        if new and not trainable:
            if lps is not None:
                raise SampleError(f"sample {self.index}: a tool's tokens take no rollout log-probs")
            lps = [0.0] * len(new)
        if text is not None:
            self.response += text
        before = self.response_length
        if new:
            if not self.tokens:
                raise SampleError(
                    f"sample {self.index}: set tokens to the prompt's before appending a response"
                )
            self.tokens += new
            self.response_length += len(new)
            self.loss_mask = (self.loss_mask if self.loss_mask is not None else [1] * before) + [
                1 if trainable else 0
            ] * len(new)
        if lps is not None:
            if self.rollout_log_probs is None:
                if trainable and before:
                    raise SampleError(
                        f"sample {self.index}: rollout log-probs for new tokens but none for the "
                        f"{before} already in the response"
                    )
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs += lps
        if meta_info and update_terminal_info:
            self._apply_meta_info(meta_info)

    def _apply_meta_info(self, meta_info: dict[str, Any]) -> None:
        if "weight_version" in meta_info:
            self.weight_versions.append(str(meta_info["weight_version"]))
        reason = (meta_info.get("finish_reason") or {}).get("type")
        status = {
            "length": Sample.Status.TRUNCATED,
            "abort": Sample.Status.ABORTED,
            "stop": Sample.Status.COMPLETED,
        }
        if reason in status:
            self.status = status[reason]

    def to_dict(self) -> dict[str, Any]:
        """Every field, the status as its text (slime's `to_dict`)."""
        out = dict(self.__dict__)
        out["status"] = self.status.value
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
        """The inverse of `to_dict`; keys that are not fields become attributes (as slime's)."""
        data = dict(data)
        if "status" in data:
            data["status"] = Sample.Status(data["status"])
        names = {f.name for f in dataclasses.fields(Sample)}
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for k, v in data.items():
            if k not in names:
                setattr(sample, k, v)
        return sample


def from_row(row: Row) -> Sample:
    """The slime sample of a rollout row (what a reward or a plug-in sees of a sample read back)."""
    return Sample(
        group_index=row.group_index,
        index=row.sample_index,
        rollout_id=row.rollout_id,
        prompt=row.prompt,
        tokens=list(row.prompt_tokens) + list(row.response_tokens),
        response=row.response,
        response_length=row.response_length,
        label=row.label,
        reward=row.reward,
        loss_mask=list(row.loss_mask),
        weight_versions=[str(row.weight_version)],
        rollout_log_probs=list(row.rollout_log_probs) or None,
        status=Sample.Status(row.status),
        metadata=dict(row.metadata),
        seed=row.seed,
    )


def to_row(sample: Sample, rollout_id: int, weight_version: int, reward: float) -> Row:
    """The rollout row of `sample`, with the scalar `reward` (the sample's own may be a dict). A sample left
    PENDING by a plug-in is taken as completed (slime trains on it alike); a failed or aborted one is kept with
    its status and its loss mask zeroed, so no token of it is trained on."""
    where = f"sample {sample.index} (group {sample.group_index})"
    n = sample.response_length
    if not isinstance(n, int) or n < 0 or n > len(sample.tokens):
        raise SampleError(f"{where}: response_length {n!r} but the sample has {len(sample.tokens)} tokens")
    mask = [1] * n if sample.loss_mask is None else [int(m) for m in sample.loss_mask]
    lps = [] if sample.rollout_log_probs is None else [float(x) for x in sample.rollout_log_probs]
    for name, values in (("loss_mask", mask), ("rollout_log_probs", lps)):
        if values and len(values) != n:
            raise SampleError(f"{where}: {name} has {len(values)} entries but response_length is {n}")
    if sample.index is None or sample.group_index is None:
        raise SampleError(f"{where}: index and group_index must be set")
    status = Sample.Status.COMPLETED if sample.status is Sample.Status.PENDING else sample.status
    if status in (Sample.Status.FAILED, Sample.Status.ABORTED):
        mask = [0] * n
    prompt = (
        sample.prompt if isinstance(sample.prompt, str) else json.dumps(sample.prompt, ensure_ascii=False)
    )
    return Row(
        rollout_id=rollout_id,
        group_index=sample.group_index,
        sample_index=sample.index,
        prompt=prompt,
        prompt_tokens=sample.prompt_tokens,
        response=sample.response,
        response_tokens=sample.response_tokens,
        response_length=n,
        label=label_text(sample.label),
        reward=reward,
        status=status.value,
        loss_mask=mask,
        rollout_log_probs=lps,
        weight_version=weight_version,
        seed=sample.seed if sample.seed is not None else 0,
        metadata=dict(sample.metadata),
    )


def label_text(label: Any) -> str:
    """The label column is text: strings as they are, anything else as JSON (None -> "")."""
    if label is None:
        return ""
    return label if isinstance(label, str) else json.dumps(label, sort_keys=True, ensure_ascii=False)


def reward_sample(request: Any) -> Sample:
    """The sample an (args, sample) reward receives for a `rollout.rewards.RewardRequest`: the one the rollout
    built (`request.sample`), else one made from the request's fields (a caller that has only those)."""
    if request.sample is not None:
        return request.sample
    return Sample(
        index=request.sample_index,
        prompt=request.prompt,
        response=request.response,
        label=request.label,
        metadata=request.metadata,
        status=Sample.Status.COMPLETED,
    )
