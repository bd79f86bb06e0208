"""Pure policy-loss, KL and reduction functions shared by every trainer backend (slime / miles semantics).

Conventions: token tensors are ``[B, T]`` over response tokens (``B`` samples of a micro-batch, ``T`` padded
response length); ``loss_mask`` is ``[B, T]`` with 0/1 entries (float, int or bool) and marks the tokens that
count. Values at masked-out positions are ignored, even when they are non-finite.

Registries:
    ``POLICY_LOSSES[name]``: ``fn(log_probs, old_log_probs, advantages, *, eps_clip, eps_clip_high,
    eps_clip_c=None) -> (pg_loss_tok, clipfrac_tok, ppo_kl_tok)``, all ``[B, T]``.
    ``KL_ESTIMATORS[name]``: ``fn(log_probs, ref_log_probs) -> kl_tok [B, T]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

PolicyLoss = Callable[..., tuple[Tensor, Tensor, Tensor]]
KLEstimator = Callable[[Tensor, Tensor], Tensor]

POLICY_LOSSES: dict[str, PolicyLoss] = {}
KL_ESTIMATORS: dict[str, KLEstimator] = {}

# slime clamps low_var_kl to this range so one wildly off-reference token cannot dominate the loss.
LOW_VAR_KL_CLAMP = 10.0


_Fn = TypeVar("_Fn", bound=Callable[..., Any])  # a registry's kind of function


def _register(registry: dict[str, _Fn], kind: str, name: str) -> Callable[[_Fn], _Fn]:
    def decorator(fn: _Fn) -> _Fn:
        if name in registry:
            raise ValueError(f"{kind} {name!r} is already registered")
        registry[name] = fn
        return fn

    return decorator


def _lookup(registry: dict[str, _Fn], kind: str, name: str) -> _Fn:
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(registry))}") from None


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator registering a policy loss in :data:`POLICY_LOSSES` (duplicates are an error)."""
    return _register(POLICY_LOSSES, "policy loss", name)


def register_kl(name: str) -> Callable[[KLEstimator], KLEstimator]:
    """Decorator registering a KL estimator in :data:`KL_ESTIMATORS` (duplicates are an error)."""
    return _register(KL_ESTIMATORS, "KL estimator", name)


def get_policy_loss(name: str) -> PolicyLoss:
    """Return the policy loss registered as ``name``; ``ValueError`` naming the known ones otherwise."""
    return _lookup(POLICY_LOSSES, "policy loss", name)


def get_kl_estimator(name: str) -> KLEstimator:
    """Return the KL estimator registered as ``name``; ``ValueError`` naming the known ones otherwise."""
    return _lookup(KL_ESTIMATORS, "KL estimator", name)


# ---------------------------------------------------------------------------------------------- KL estimators
# All take log_ratio = log_probs - ref_log_probs (current policy vs reference), per token.


@register_kl("k1")
def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1 = log r, with log r = log_probs - ref_log_probs. [B, T] -> [B, T]."""
    return log_probs - ref_log_probs


@register_kl("k2")
def kl_k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k2 = 0.5 * (log r)^2. [B, T] -> [B, T]."""
    log_ratio = log_probs - ref_log_probs
    return 0.5 * log_ratio**2


@register_kl("k3")
def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k3 = exp(-log r) - 1 + log r (Schulman's unbiased, non-negative estimator), unclamped. [B, T] -> [B, T]."""
    log_ratio = log_probs - ref_log_probs
    return torch.exp(-log_ratio) - 1 + log_ratio


@register_kl("low_var_kl")
def kl_low_var(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """low_var_kl = k3 clamped to [-10, 10] (the recipes' estimator; slime's default is k1). [B, T] -> [B, T]."""
    return kl_k3(log_probs, ref_log_probs).clamp(min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)


# ------------------------------------------------------------------------------------------------ policy losses


@register_policy_loss("ppo_clip")
def ppo_clip(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO clipped surrogate, per token (slime ``compute_policy_loss``).

    ``ppo_kl = old_log_probs - log_probs``; ``ratio = exp(-ppo_kl)``;
    ``loss = max(-ratio * A, -clamp(ratio, 1 - eps_clip, 1 + eps_clip_high) * A)``;
    ``clipfrac = 1`` where the clipped term was strictly larger (i.e. selected). With ``eps_clip_c`` (dual
    clip, must be > 1) tokens with ``A < 0`` use ``min(loss, -eps_clip_c * A)``, bounding the loss when the
    ratio explodes on a negative-advantage token.

    Shapes: all inputs [B, T] -> (pg_loss_tok, clipfrac_tok, ppo_kl_tok), each [B, T].
    """
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"eps_clip_c (dual-clip bound) must be > 1.0, got {eps_clip_c}")
    ppo_kl = old_log_probs - log_probs
    ratio = torch.exp(-ppo_kl)
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    clip_pg_losses = torch.maximum(pg_losses1, pg_losses2)
    clipfrac = (pg_losses2 > pg_losses1).float()
    if eps_clip_c is not None:
        pg_losses3 = -eps_clip_c * advantages
        dual_clipped = torch.minimum(clip_pg_losses, pg_losses3)
        pg_losses = torch.where(advantages < 0, dual_clipped, clip_pg_losses)
    else:
        pg_losses = clip_pg_losses
    return pg_losses, clipfrac, ppo_kl


@register_policy_loss("vanilla_pg")
def vanilla_pg(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Plain policy gradient (REINFORCE): ``loss = -log_probs * A``; clipfrac is 0.

    The clip parameters are accepted for the uniform signature and ignored. ``ppo_kl`` is still
    ``old_log_probs - log_probs`` so the off-policy-ness metric stays comparable across losses.

    Shapes: all inputs [B, T] -> (pg_loss_tok, clipfrac_tok, ppo_kl_tok), each [B, T].
    """
    del eps_clip, eps_clip_high, eps_clip_c
    ppo_kl = old_log_probs - log_probs
    return -log_probs * advantages, torch.zeros_like(log_probs, dtype=torch.float32), ppo_kl


# ------------------------------------------------------------------------------------------ logits utilities


def log_probs_from_logits(logits: Tensor, tokens: Tensor) -> Tensor:
    """Log-probability of each target token: ``log_softmax(logits.float())`` gathered at ``tokens``.

    The caller aligns them: ``logits[b, t]`` must be the distribution that predicted ``tokens[b, t]``.
    Shapes: logits [B, T, V] (any float dtype), tokens [B, T] int -> [B, T] float32.
    """
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits [B, T, V] and tokens [B, T], got {tuple(logits.shape)} and {tuple(tokens.shape)}"
        )
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy ``-sum_v p_v log p_v`` of each token's distribution, computed in float32 via log_softmax.

    Logits of ``-inf`` (e.g. masked vocabulary entries) contribute 0 rather than NaN, with finite gradients.
    Shapes: logits [B, T, V] -> [B, T] float32.
    """
    log_p = torch.log_softmax(logits.float(), dim=-1)
    # p * log p is 0 * -inf = NaN for impossible tokens; clamping log p to the most negative finite float
    # makes that term exactly 0 and the clamp blocks the NaN gradient.
    log_p = log_p.clamp(min=torch.finfo(log_p.dtype).min)
    return -(log_p.exp() * log_p).sum(dim=-1)


# Elements of one chunk's [rows, V] logits in linear_log_probs_and_entropy: 1M float32 (4 MiB) stays in a CPU's
# L2/L3 cache for the half-dozen passes over it, and is large enough that the chunk's matmuls run at full speed.
CHUNK_ELEMENTS = 1 << 20
# A chunk's rows at least: each chunk's backward adds its rows' products into the whole [V, H] weight gradient, a
# pass over V x H floats however few the rows, so a large vocabulary's chunks must be tall enough that the matmul,
# not that pass, sets the backward's time. Its [rows, V] float32 buffers then outgrow the cache, which a large
# vocabulary's do anyway.
MIN_CHUNK_ROWS = 128


def chunk_rows_for(vocab_size: int) -> int:
    """Rows per chunk of :func:`linear_log_probs_and_entropy` for a vocabulary of ``vocab_size``: CHUNK_ELEMENTS
    logits, and at least MIN_CHUNK_ROWS."""
    return max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // max(vocab_size, 1))


class _LinearLogProbs(torch.autograd.Function):
    """The output layer, log-softmax, target gather and entropy of N tokens, chunk by chunk over the rows.

    Per chunk it keeps only ``log p`` ([rows, V] float32, for the backward) and never builds the logits, the
    log-softmax, the softmax or their gradients for all N tokens at once (on a CPU every such pass costs as much
    as the output matmul itself). With ``recompute`` it keeps nothing per chunk: the backward runs the chunk's
    forward again (bitwise the same ``log p``), trading one more output matmul for [N, V] float32 of memory."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        tokens: Tensor,
        temperature: float,
        chunk_rows: int,
        matmul_dtype: torch.dtype | None,
        recompute: bool,
        weight_grad_sink: Callable[[Tensor], bool] | None,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        chunks = _Chunks(hidden, weight, temperature, matmul_dtype)
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device)
        saved: list[Tensor] = []
        for start in range(0, n, chunk_rows):
            rows = slice(start, min(n, start + chunk_rows))
            log_p = chunks.log_softmax(rows)  # [rows, V] float32
            log_probs[rows] = log_p.gather(-1, tokens[rows, None]).squeeze(-1)
            # -sum p log p, term by term >= 0 (log p <= 0), as entropy_from_logits computes it
            entropy[rows] = -(log_p.exp() * log_p).sum(-1)
            if not recompute:
                saved.append(log_p)
        ctx.save_for_backward(hidden, weight, tokens, entropy)
        ctx.log_p, ctx.temperature, ctx.chunk_rows = saved, temperature, chunk_rows
        ctx.matmul_dtype, ctx.recompute, ctx.weight_grad_sink = matmul_dtype, recompute, weight_grad_sink
        ctx.set_materialize_grads(False)
        return log_probs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any, grad_lp: Tensor | None, grad_ent: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None, None, None, None]:
        hidden, weight, tokens, entropy = ctx.saved_tensors
        grad_h = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        if grad_lp is None and grad_ent is None:
            return grad_h, grad_w, None, None, None, None, None, None
        n = hidden.shape[0]
        starts = range(0, n, ctx.chunk_rows)
        chunks = _Chunks(hidden, weight, ctx.temperature, ctx.matmul_dtype) if ctx.recompute else None
        for i, start in enumerate(starts):
            rows = slice(start, min(n, start + ctx.chunk_rows))
            log_p = chunks.log_softmax(rows) if chunks is not None else ctx.log_p[i]
            g = _chunk_logits_grad(
                log_p,
                tokens[rows],
                entropy[rows],
                None if grad_lp is None else grad_lp[rows],
                None if grad_ent is None else grad_ent[rows],
            )
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            g = g.to(hidden.dtype)
            if grad_h is not None:
                grad_h[rows] = g @ weight
            if grad_w is not None:
                grad_w.addmm_(g.t(), hidden[rows])
        ctx.log_p = []  # the chunks were overwritten above: this backward runs once
        if grad_w is not None and ctx.weight_grad_sink is not None and ctx.weight_grad_sink(grad_w):
            grad_w = None  # the sink took it and gives it to autograd itself
        return grad_h, grad_w, None, None, None, None, None, None


class _Chunks:
    """``log_softmax(hidden @ weight.T / temperature)`` of a slice of rows, the matmul in ``matmul_dtype`` when
    given (the weight cast once per forward or backward, not per chunk)."""

    def __init__(self, hidden: Tensor, weight: Tensor, temperature: float, matmul_dtype: torch.dtype | None):
        self.hidden, self.temperature = hidden, temperature
        self.weight = weight if matmul_dtype is None else weight.detach().to(matmul_dtype)

    def log_softmax(self, rows: slice) -> Tensor:
        """[rows, V] float32."""
        return _chunk_log_softmax(self.hidden[rows].to(self.weight.dtype), self.weight, self.temperature)


def _chunk_log_softmax(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """``log_softmax(hidden @ weight.T / temperature)`` in float32, in the order of torch's log_softmax kernel
    (shift by the row max, subtract the log of the sum of exponentials). [rows, H], [V, H] -> [rows, V]."""
    z = (hidden @ weight.t()).float()
    if temperature != 1.0:
        z = z.div_(temperature)
    z = z.sub_(z.amax(-1, keepdim=True))
    return z.sub_(z.exp().sum(-1, keepdim=True).log_())


def _chunk_logits_grad(
    log_p: Tensor, tokens: Tensor, entropy: Tensor, grad_lp: Tensor | None, grad_ent: Tensor | None
) -> Tensor:
    """d(loss)/d(logits / temperature) of one chunk, written over ``log_p`` (which is not needed after):
    d lp_i / dz_ij = [j = t_i] - p_ij and d H_i / dz_ij = -p_ij (log p_ij + H_i). [rows, V] float32."""
    p = log_p.exp()
    if grad_ent is None:
        assert grad_lp is not None
        g = p.mul_(-grad_lp[:, None])
    else:
        g = log_p.add_(entropy[:, None]).mul_(grad_ent[:, None])
        if grad_lp is not None:
            g = g.add_(grad_lp[:, None])
        g = g.mul_(p).neg_()
    if grad_lp is not None:
        g.scatter_add_(-1, tokens[:, None], grad_lp[:, None])
    return g


def linear_log_probs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    matmul_dtype: torch.dtype | None = None,
    recompute: bool = False,
    weight_grad_sink: Callable[[Tensor], bool] | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-probability of each target token and entropy of each distribution, straight from the hidden states
    and the output layer, without materialising [N, V] logits, log-softmax or their gradients.

    ``logits = hidden @ weight.T / temperature`` (an output layer without bias); ``log_probs[i] =
    log_softmax(logits[i])[tokens[i]]``, ``entropy[i] = -sum_v p log p``, both float32, equal to
    :func:`log_probs_from_logits` / :func:`entropy_from_logits` of those logits within float32 rounding.
    Differentiable in ``hidden`` and ``weight`` through either output (the gradient is computed chunk by chunk
    in the backward; backward runs once). The result of a row depends only on that row and on ``chunk_rows``,
    so the same call under ``no_grad`` and with autograd gives bitwise the same values.

    Shapes: hidden [N, H], weight [V, H], tokens [N] int -> (log_probs [N], entropy [N]).
    ``chunk_rows`` defaults to :func:`chunk_rows_for` of V. ``matmul_dtype`` (bfloat16 under --precision bf16):
    the forward's logits matmul runs on ``hidden`` and ``weight`` cast to it, as a bf16 engine computes its
    logits; the log-softmax, the outputs and the backward stay float32. ``recompute`` (activation
    checkpointing): nothing [N, V] is kept for the backward, which recomputes each chunk; the gradients are
    bitwise the same. ``weight_grad_sink``: offered the weight's [V, H] gradient in the backward; when it returns
    True it has taken the gradient and passes it on to autograd itself (a tied embedding, see
    trainers/torch_trainer/tied.py), so the backward returns none for the weight.
    """
    if (
        hidden.dim() != 2
        or weight.dim() != 2
        or hidden.shape[1] != weight.shape[1]
        or tokens.shape != hidden.shape[:1]
    ):
        raise ValueError(
            f"expected hidden [N, H], weight [V, H], tokens [N]; got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}, {tuple(tokens.shape)}"
        )
    rows = chunk_rows or chunk_rows_for(weight.shape[0])
    log_probs, entropy = _LinearLogProbs.apply(
        hidden, weight, tokens.long(), float(temperature), rows, matmul_dtype, recompute, weight_grad_sink
    )
    return log_probs, entropy


# ----------------------------------------------------------------------------------------------- reduction


def masked_sample_mean(x: Tensor, loss_mask: Tensor) -> Tensor:
    """Per-sample mean of ``x`` over the tokens where ``loss_mask`` is non-zero.

    A sample with an all-zero mask gives 0 (denominator clamped to 1, as in slime), not NaN; masked-out
    positions are excluded even if they hold NaN/inf. Shapes: x [B, T], loss_mask [B, T] (0/1) -> [B].
    """
    if x.shape != loss_mask.shape:
        raise ValueError(f"x and loss_mask shapes differ: {tuple(x.shape)} vs {tuple(loss_mask.shape)}")
    keep = loss_mask != 0
    total = torch.where(keep, x, torch.zeros_like(x)).sum(dim=-1)
    count = keep.sum(dim=-1).clamp(min=1).to(total.dtype)
    return total / count


def policy_objective(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages_tok: Tensor,
    loss_mask: Tensor,
    entropy_tok: Tensor,
    ref_log_probs: Tensor | None = None,
    *,
    policy_loss: str = "ppo_clip",
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
    entropy_coef: float = 0.0,
    use_kl_loss: bool = False,
    kl_loss_coef: float = 0.0,
    kl_loss_type: str = "low_var_kl",
    rollout_log_probs: Tensor | None = None,
    normaliser: float,
    per_token: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Total actor loss of one micro-batch and its metrics, assembled as slime does.

    ``loss = pg_loss - entropy_coef * entropy_loss (+ kl_loss_coef * kl_loss if use_kl_loss)``.

    Reduction: every token quantity ``q`` becomes ``sum_b masked_sample_mean(q, loss_mask)[b] / normaliser``.
    The trainer passes the GLOBAL batch size (samples per optimizer step, over all accumulation steps and DP
    ranks) as ``normaliser``, so summing this loss (and each metric) over micro-batches and all-reducing
    (SUM) across DP ranks yields the global per-sample mean; gradients accumulate the same way.
    With ``per_token`` (slime ``--calculate-per-token-loss``) ``q`` becomes its sum over the loss tokens ``/ normaliser``
    and the trainer passes the step's token count (over every sample of the optimizer step, each counting at
    least 1 as in slime), so the sum is the global per-token mean.

    Args:
        log_probs: [B, T] current-policy log-probs (carries grad).
        old_log_probs: [B, T] log-probs of the policy that produced the batch (recomputed or rollout).
        advantages_tok: [B, T] per-token advantages (per-sample advantages broadcast over tokens).
        loss_mask: [B, T] 0/1.
        entropy_tok: [B, T] token entropies (from :func:`entropy_from_logits`; carries grad if entropy_coef).
        ref_log_probs: [B, T] reference-model log-probs; required when ``use_kl_loss``.
        policy_loss: name in :data:`POLICY_LOSSES`; eps_clip / eps_clip_high / eps_clip_c are passed to it.
        entropy_coef, use_kl_loss, kl_loss_coef, kl_loss_type: as slime's flags of the same names.
        rollout_log_probs: [B, T] inference-engine log-probs; adds ``train_rollout_logprob_abs_diff``.
        normaliser: > 0, the global batch size, or with ``per_token`` the step's token count (see Reduction).
        per_token: reduce per token over the step instead of per sample (see Reduction).

    Returns:
        ``(loss, metrics)``: ``loss`` a 0-dim tensor with grad; ``metrics`` detached 0-dim tensors with keys
        ``pg_loss, pg_clipfrac, ppo_kl, entropy_loss, loss``, plus ``kl_loss`` if ``use_kl_loss`` and
        ``train_rollout_logprob_abs_diff`` if ``rollout_log_probs`` is given, all reduced by the same rule.
    """
    if not normaliser > 0:
        raise ValueError(f"normaliser must be > 0, got {normaliser}")
    tensors = {
        "old_log_probs": old_log_probs,
        "advantages_tok": advantages_tok,
        "loss_mask": loss_mask,
        "entropy_tok": entropy_tok,
        "ref_log_probs": ref_log_probs,
        "rollout_log_probs": rollout_log_probs,
    }
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be [B, T], got {tuple(log_probs.shape)}")
    for name, t in tensors.items():
        if t is not None and t.shape != log_probs.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != log_probs shape {tuple(log_probs.shape)}")
    if use_kl_loss and ref_log_probs is None:
        raise ValueError("use_kl_loss=True requires ref_log_probs")

    def reduce(tok: Tensor) -> Tensor:
        if per_token:
            return torch.where(loss_mask != 0, tok, torch.zeros_like(tok)).sum() / normaliser
        return masked_sample_mean(tok, loss_mask).sum() / normaliser

    pg_fn = get_policy_loss(policy_loss)
    pg_tok, clipfrac_tok, ppo_kl_tok = pg_fn(
        log_probs,
        old_log_probs,
        advantages_tok,
        eps_clip=eps_clip,
        eps_clip_high=eps_clip_high,
        eps_clip_c=eps_clip_c,
    )
    pg_loss = reduce(pg_tok)
    entropy_loss = reduce(entropy_tok)

    loss = pg_loss
    # Skipping a zero entropy term keeps loss == pg_loss exactly and avoids backpropagating through the
    # entropy graph for nothing.
    if entropy_coef != 0.0:
        loss = loss - entropy_coef * entropy_loss

    metrics: dict[str, Tensor] = {
        "pg_loss": pg_loss.detach(),
        "pg_clipfrac": reduce(clipfrac_tok.detach()),
        "ppo_kl": reduce(ppo_kl_tok.detach()),
        "entropy_loss": entropy_loss.detach(),
    }
    if use_kl_loss and ref_log_probs is not None:  # None already rejected above; this narrows the type
        kl_tok = get_kl_estimator(kl_loss_type)(log_probs, ref_log_probs)
        kl_loss = reduce(kl_tok)
        loss = loss + kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    if rollout_log_probs is not None:
        metrics["train_rollout_logprob_abs_diff"] = reduce((old_log_probs.detach() - rollout_log_probs).abs())
    metrics["loss"] = loss.detach()
    return loss, metrics
