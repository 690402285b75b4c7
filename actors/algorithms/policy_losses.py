"""Policy losses beyond PPO-clip: GSPO, GMPO (sequence-level ratios), CISPO (clipped IS weight) and
TOPR (tapered REINFORCE). Same interface as `losses.ppo_clip` -- (logp, old_logp, adv, clip_eps=...,
clip_eps_high=None, mask=None) -> (per-token loss [B, T], per-token stats) -- and they compose with
the off-policy corrections (`losses.corrected`). `mask` [B, T] marks response tokens; the
sequence-level losses need it and the learner passes it to every loss that takes it.

A sequence-level objective J_i is written per token so that each response's token mean is J_i and its
gradient is J_i's: such losses aggregate with `seq_mean_token_mean` (their own `loss_agg`).
"""

from __future__ import annotations

import torch

from actors.algorithms import POLICY_LOSSES


def _seq_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Per-sequence mean over response tokens, [B, 1]."""
    if mask is None:
        return x.mean(dim=1, keepdim=True)
    m = mask.to(x.dtype)
    return (x * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)


def _unit(logprobs: torch.Tensor) -> torch.Tensor:
    """1 in value, grad(logp) in gradient."""
    return torch.exp(logprobs - logprobs.detach())


@POLICY_LOSSES.register("gspo")
def gspo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 3e-4,
         clip_eps_high: float | None = None, mask: torch.Tensor | None = None,
         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the importance ratio of a whole
    response, s = exp(mean_t(logp - old)), clipped per sequence: J = min(s A, clip(s, 1-eps, 1+eps_high) A).
    Per token (GSPO-token): s_t = sg(s) * pi_t / sg(pi_t), equal to s, with grad s * grad(logp_t); a
    response's token mean has J's gradient. The paper's ranges are tiny (3e-4, 4e-4): set clip_eps
    accordingly. clip_frac is 1 on every token of a clipped response."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    log_s = _seq_mean(logprobs - old_logprobs, mask)
    s_t = torch.exp(log_s.detach()) * _unit(logprobs)
    unclipped = s_t * advantages
    clipped = torch.clamp(s_t, 1 - clip_eps, 1 + high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, {"clip_frac": (clipped < unclipped).float(), "ratio": torch.exp(log_s).detach().expand_as(loss)}


@POLICY_LOSSES.register("gmpo")
def gmpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 0.4,
         clip_eps_high: float | None = None, mask: torch.Tensor | None = None,
         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization"): the geometric mean of the
    token-level clipped objective, J = A * exp(mean_t c_t), where c_t is the token's log-ratio clipped
    pessimistically in log space to [-eps, eps_high] (for A > 0 the upper bound applies, for A < 0
    the lower: sign(A) * min(sign(A) l_t, sign(A) clip(l_t))). Per token: -A * sg(G) * exp(c_t - sg(c_t)),
    whose response token mean is -J with J's gradient. The paper uses eps = 0.4 in log space."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = logprobs - old_logprobs
    sign = torch.sign(advantages).expand_as(log_ratio)
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    bounded = torch.clamp(log_ratio, -clip_eps, high)
    c = sign * torch.minimum(sign * log_ratio, sign * bounded)
    g = torch.exp(_seq_mean(c, mask))
    loss = -advantages * g.detach() * torch.exp(c - c.detach())
    return loss, {"clip_frac": (c != log_ratio).float().detach(), "ratio": g.detach().expand_as(loss)}


@POLICY_LOSSES.register("cispo")
def cispo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 0.2,
          clip_eps_high: float | None = None, mask: torch.Tensor | None = None,
          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax 2025, "MiniMax-M1"): REINFORCE with the importance weight clipped and detached,
    -sg(clip(r, 1-eps, 1+eps_high)) * A * logp: unlike PPO's clip, no token loses its gradient. The
    paper sets no lower bound in effect (a large eps) and tunes eps_high; clip_frac is where the
    weight was clipped."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs).detach()
    w = torch.clamp(ratio, 1 - clip_eps, 1 + high)
    loss = -w * advantages * _unit(logprobs)
    return loss, {"clip_frac": (w != ratio).float(), "ratio": ratio}


@POLICY_LOSSES.register("topr")
def topr(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 0.2,
         clip_eps_high: float | None = None, mask: torch.Tensor | None = None,
         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TOPR (Le Roux et al. 2025, "Tapered Off-Policy REINFORCE"): positive samples (A >= 0) get the
    plain supervised gradient -A * grad(logp), with no importance weight; negative ones get the
    response's importance ratio truncated to [0, 1], -sg(min(pi(y)/mu(y), 1)) * A * grad(logp), which
    keeps pushing down only as far as the sampler still puts mass there: stable without a KL term.
    clip_eps is unused; clip_frac is where a negative sample's weight was truncated."""
    log_seq = (logprobs - old_logprobs) * (mask.to(logprobs.dtype) if mask is not None else 1.0)
    seq_ratio = torch.exp(log_seq.sum(1, keepdim=True)).detach()
    negative = (advantages < 0).expand_as(logprobs)
    w = torch.where(negative, seq_ratio.clamp(max=1.0).expand_as(logprobs), torch.ones_like(logprobs))
    loss = -w * advantages * _unit(logprobs)
    # counted as truncated past rounding: on-policy, the sampler's and the learner's log-probs of a
    # response differ by ~1e-6, which would count every negative response
    truncated = negative & (seq_ratio > 1.0 + 1e-4)
    return loss, {"clip_frac": truncated.float(), "ratio": seq_ratio.expand_as(loss)}


# ---- entropy controls (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
# Reasoning Language Models"): the entropy falls where a token's log-prob and its advantage move
# together, so the few tokens with the largest covariance between them are held back. The
# covariance is centred over the response tokens the loss is given (one micro-batch).

def _covariance(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Per token (logp - mean logp) * (A - mean A), means over the masked tokens; detached."""
    lp = logprobs.detach()
    adv = advantages.expand_as(lp)
    m = torch.ones_like(lp) if mask is None else mask.to(lp.dtype)
    n = m.sum().clamp(min=1)
    return (lp - (lp * m).sum() / n) * (adv - (adv * m).sum() / n) * m


@POLICY_LOSSES.register("clip_cov")
def clip_cov(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 0.2,
             clip_eps_high: float | None = None, mask: torch.Tensor | None = None, ratio: float = 2e-4,
             lower: float = 1.0, upper: float = 5.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov: PPO-clip, except that a random `ratio` of the tokens, drawn from those whose
    covariance lies in [lower, upper], get no gradient (their loss is detached). At least one token
    is held back when any qualifies. clip_frac counts PPO's clipping and the held-back tokens."""
    from actors.algorithms.losses import ppo_clip

    loss, stats = ppo_clip(logprobs, old_logprobs, advantages, clip_eps=clip_eps, clip_eps_high=clip_eps_high)
    cov = _covariance(logprobs, advantages, mask)
    valid = mask.bool() if mask is not None else torch.ones_like(cov, dtype=torch.bool)
    candidates = torch.nonzero(valid & (cov >= lower) & (cov <= upper), as_tuple=False)
    held = torch.zeros_like(cov, dtype=torch.bool)
    if len(candidates):
        count = max(1, int(round(ratio * int(valid.sum()))))
        pick = candidates[torch.randperm(len(candidates), device=cov.device)[:count]]
        held[pick[:, 0], pick[:, 1]] = True
    loss = torch.where(held, loss.detach(), loss)
    stats["clip_frac"] = torch.maximum(stats["clip_frac"], held.float())
    return loss, stats


@POLICY_LOSSES.register("kl_cov")
def kl_cov(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 0.2,
           clip_eps_high: float | None = None, mask: torch.Tensor | None = None, ratio: float = 2e-3,
           coef: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov: the unclipped policy gradient -r * A, plus coef * |logp - old_logp| on the top `ratio`
    of the tokens by covariance (at least one), which ties them to the old policy. clip_frac marks
    those tokens."""
    r = torch.exp(logprobs - old_logprobs)
    loss = -r * advantages
    cov = _covariance(logprobs, advantages, mask)
    valid = mask.bool() if mask is not None else torch.ones_like(cov, dtype=torch.bool)
    count = max(1, int(round(ratio * int(valid.sum()))))
    scores = torch.where(valid, cov, torch.full_like(cov, -float("inf"))).flatten()
    top = torch.topk(scores, min(count, int(valid.sum())) if valid.any() else 0).indices
    tied = torch.zeros_like(scores, dtype=torch.bool)
    tied[top] = True
    tied = tied.view_as(cov)
    loss = loss + torch.where(tied, coef * (logprobs - old_logprobs).abs(), torch.zeros_like(loss))
    return loss, {"clip_frac": tied.float(), "ratio": r.detach()}
