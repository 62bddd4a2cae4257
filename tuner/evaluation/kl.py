"""The fidelity's divergence formula alone (torch only), so that a process without the tuner's data
modules (``benchmarks/kvpress_worker.py``, in kvpress's own venv) computes the same number as
:func:`tuner.evaluation.fidelity.drift`.
"""

from __future__ import annotations

import torch


def topk_kl(topk_logp: torch.Tensor, topk_ids: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    """``(mean KL(P || Q), top-1 agreement)`` of logits ``[T, vocab]`` (Q) against a reference P given
    by its top-``k`` log-probabilities and token ids ``[T, k]`` (best first): the ``k`` tokens plus one
    "rest of the vocabulary" bucket, in float64, each step's KL floored at 0, the mean over steps."""
    logq = torch.log_softmax(logits.float(), dim=-1).double()  # [T, vocab]
    logp_k = topk_logp.double()  # [T, k]
    logq_k = logq.gather(1, topk_ids)  # [T, k]
    p_k, q_k = logp_k.exp(), logq_k.exp()
    per_step = (p_k * (logp_k - logq_k)).sum(dim=1)
    p_rest = (1.0 - p_k.sum(dim=1)).clamp_min(0.0)
    q_rest = (1.0 - q_k.sum(dim=1)).clamp_min(1e-300)
    per_step = per_step + torch.where(
        p_rest > 0, p_rest * (p_rest.clamp_min(1e-300).log() - q_rest.log()), 0.0
    )
    kl = float(per_step.clamp_min(0.0).mean())
    top1 = float((logits.argmax(dim=-1) == topk_ids[:, 0]).double().mean())
    return kl, top1
