"""The Ray actor that hosts one engine of any backend."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray
import torch

from artifacts.wire import WireFile, WireWeights, from_wire, read_file, to_wire
from engines.base import Engine, EngineAnswer, GenerateRequest, StaleWeights
from engines.regenerate import regenerate_and_compare
from engines.registry import get_engine_class
from faults import FaultHookRequest, FaultInjector
from faults.drop_weight import dropped_weights
from procs import freeze_heap, memory_gib, trim_heap


class ModelLoadError(RuntimeError):
    """An engine could not load its model; the message names the model file and the cause, on one line."""


def load_failure(checkpoint: str, error: Exception) -> ModelLoadError:
    """`error`, raised loading the model in `checkpoint`, as one line naming the file at fault: the first
    .safetensors file whose header does not read, else the checkpoint itself (cause cut to 300 characters)."""
    from safetensors import safe_open

    where = Path(checkpoint)
    for path in sorted(where.glob("*.safetensors")) if where.is_dir() else []:
        try:
            with safe_open(str(path), "pt"):
                pass  # opening reads and checks the header, which is all this looks for
        except Exception:  # SafetensorError, OSError: this is the file the model could not be read from
            where = path
            break
    cause = " ".join(f"{type(error).__name__}: {error}".split())
    cut = cause if len(cause) <= 300 else f"{cause[:300]}... ({len(cause)} characters)"
    return ModelLoadError(f"cannot load the model {where}: {cut}")


@ray.remote(num_cpus=0)
class EngineActor:
    """Hosts one engine; every method forwards to it. Created by name per run (see tasks/actors.py).

    `faults`/`run_dir`/`epoch` arm the engine's fault hooks (faults/); `ctx` arguments carry the stage's
    context (rollout_id, attempt, stage) that a hook request can filter on."""

    def __init__(
        self,
        backend: str,
        checkpoint: str,
        num_threads: int,
        engine_index: int,
        fault_drop_weight: str | None = None,
        faults: list[FaultHookRequest] | None = None,
        run_dir: str | None = None,
        epoch: float | None = None,
        regenerate: bool = False,
        precision: str = "fp32",
    ) -> None:
        torch.set_num_threads(num_threads)
        self.index = engine_index
        # --ci-fault-drop-weight: a planted sync bug (names or globs)
        self.fault_drop_weight = fault_drop_weight
        try:
            self.engine: Engine = get_engine_class(backend)(
                checkpoint, num_threads=num_threads, precision=precision
            )
        except Exception as e:  # the driver reads only the last line of what an actor's constructor raised
            raise load_failure(checkpoint, e) from e
        self.faults = FaultInjector(faults or [], "engine", engine_index, run_dir, epoch)
        self.generate_calls = 0
        # --ci-test re-generates requests of the first call on each weight version (engines/regenerate.py); an
        # engine that does not say whether its sampling depends on the batch layout (SGLang without deterministic
        # inference) would report that as a difference
        self.regenerate = regenerate and hasattr(self.engine, "layout_invariant")
        self._regenerated_version = -1
        self._receiving: set[str] | None = None  # names of a streamed sync's buckets so far
        freeze_heap()  # the model, torch and Ray live as long as the actor

    def generate(
        self, requests: list[GenerateRequest], version: int, ctx: dict[str, Any] | None = None
    ) -> EngineAnswer:
        """Complete `requests` on the weights of `version`; StaleWeights if the engine holds another version (a
        retry or a restarted engine never answers from weights the call did not name)."""
        held = self.engine.weight_version()
        self.faults.reach("engine_generate_start", weight_version=held, **(ctx or {}))
        if held != version:
            ctx = ctx or {}
            raise StaleWeights(
                f"rollout {ctx.get('rollout_id')}, {ctx.get('stage') or 'generate'}: engine {self.index} holds "
                f"weight version {held} but the call names version {version}; refusing to generate on other "
                "weights"
            )
        self.generate_calls += 1
        began = time.perf_counter()
        outputs = self.engine.generate(requests)
        seconds = time.perf_counter() - began
        if self.regenerate and self._regenerated_version != held:
            self._regenerated_version = held  # once a version: plug-ins call generate once a request
            regenerate_and_compare(
                self.engine,
                requests,
                outputs,
                self.index,
                ctx,
                same_layout=not getattr(self.engine, "layout_invariant", False),
            )
        return EngineAnswer(outputs, seconds)

    def update_weights(
        self, weights: list[ray.ObjectRef[Any]], version: int, ctx: dict[str, Any] | None = None
    ) -> None:
        """Receive the trainer's weights (`[ref]` of TrainerActor.export_weights: wrapped in a list so that Ray
        does not fetch them before this method runs) and load them as `version`."""
        self.faults.reach("engine_update_weights_before_receive", weight_version=version, **(ctx or {}))
        named_tensors = from_wire(ray.get(weights[0]), copy=False)  # only read: load copies
        self.faults.reach("engine_update_weights_after_receive", weight_version=version, **(ctx or {}))
        self.engine.update_weights(self._dropping(named_tensors), version)
        trim_heap()  # the received copies and their casts are freed: give their pages back

    def _dropping(self, named_tensors: dict[str, Any]) -> dict[str, Any]:
        """--ci-fault-drop-weight, the planted sync bug: those tensors silently keep the engine's old copy."""
        dropped = dropped_weights(self.fault_drop_weight, named_tensors)
        return {**named_tensors, **self.engine.get_weights(dropped)} if dropped else named_tensors

    def snapshot_and_scramble(self) -> int:
        return self.engine.snapshot_and_scramble(seed=self.index)

    def load_weight_bucket(
        self, bucket: list[ray.ObjectRef[Any]], version: int, ctx: dict[str, Any] | None = None
    ) -> None:
        """One bucket of a streamed sync to `version` (`[ref]` of TrainerActor.stream_weights: the weights, or the
        WireFile they were written to)."""
        if self._receiving is None:  # the first bucket of this sync
            self.faults.reach("engine_update_weights_before_receive", weight_version=version, **(ctx or {}))
            self._receiving = set()
        sent = ray.get(bucket[0])
        named_tensors = self._dropping(
            read_file(sent) if isinstance(sent, WireFile) else from_wire(sent, copy=False)
        )
        self.engine.load_weights(named_tensors)
        self._receiving.update(named_tensors)

    def commit_weights(self, version: int, names: list[str], ctx: dict[str, Any] | None = None) -> None:
        """The last bucket of a streamed sync arrived: hold `version` once every weight came."""
        received, self._receiving = self._receiving or set(), None
        self.faults.reach("engine_update_weights_after_receive", weight_version=version, **(ctx or {}))
        missing = sorted(set(self.engine.weight_names()) - received)
        if missing:
            raise KeyError(
                f"engine {self.index}: the sync to version {version} delivered {len(received)} of the "
                f"engine's weights; missing {missing[:5]} (the trainer sent {len(names)})"
            )
        self.engine.set_weight_version(version)
        trim_heap()  # the received buckets and their casts are freed: give their pages back

    def get_weights(self, names: list[str] | None = None) -> WireWeights:
        """The engine's weights in the same wire format update_weights takes."""
        return to_wire(self.engine.get_weights(names))

    def weight_version(self) -> int:
        return self.engine.weight_version()

    def weights_sha256(self) -> str:
        return self.engine.weights_sha256()

    def tensor_hashes(self) -> dict[str, str]:
        return self.engine.tensor_hashes()

    def release_memory(self) -> None:
        self.engine.release_memory()

    def resume_memory(self) -> None:
        """Take the memory back for a weight load (after `release_memory`)."""
        self.engine.resume_memory()

    def health(self) -> dict[str, Any]:
        return {**self.engine.health(), "index": self.index, "generate_calls": self.generate_calls}

    def memory(self) -> dict[str, float]:
        """This process's resident memory now and at its peak, GiB (procs.memory_gib)."""
        return memory_gib()

    def shutdown(self) -> None:
        self.engine.shutdown()
