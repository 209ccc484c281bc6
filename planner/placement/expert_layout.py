"""Expert layouts on EP ranks, their baseline and heuristic, and what a layout costs.

A layout of one MoE layer is ``share[e, r]``: the fraction of expert e's tokens served by EP rank r
(1 on one rank without replicas). Every rank holds the same number of expert copies, as the
engines allocate expert weights per rank. EP ranks ``ranks_per_domain`` apart in index share an
NVLink domain (rank r lives in domain r // ranks_per_domain).

Inter-layer traffic follows the affinity model (ExFlow, Yao et al. 2024, arXiv:2401.08383): a token
routed to expert i of layer l and expert j of layer l + 1 stays on its GPU when both sit on the same
rank; otherwise it crosses GPUs, and it crosses the scale-out fabric when the ranks are in
different NVLink domains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutCost:
    """What one layout of every MoE layer costs, in token-routings."""

    max_rank_tokens: np.ndarray
    """Per layer: tokens on the busiest EP rank (it sets the all-to-all receive time and the expert GEMMs)."""
    mean_rank_tokens: np.ndarray
    """Per layer: tokens per rank on average."""
    cross_gpu_tokens: np.ndarray
    """Per consecutive-layer pair: co-activated tokens whose two experts are on different ranks (0s if unknown)."""
    cross_domain_tokens: np.ndarray
    """Per consecutive-layer pair: of those, tokens whose ranks are in different NVLink domains."""


def slots_per_rank(num_experts: int, ep: int, replicas: int) -> int:
    """Expert copies each rank holds: (experts + replicas) / ep."""
    return (num_experts + replicas) // ep


def contiguous_share(num_experts: int, ep: int) -> np.ndarray:
    """Megatron's default: rank r holds experts [r·E/ep, (r+1)·E/ep); shape (experts, ep)."""
    share = np.zeros((num_experts, ep))
    share[np.arange(num_experts), np.arange(num_experts) // (num_experts // ep)] = 1.0
    return share


def greedy_share(load: np.ndarray, ep: int, replicas: int) -> np.ndarray:
    """The heuristic: give each extra copy to the expert with the most tokens per copy, then place
    copies heaviest first on the least loaded rank that has a free slot and lacks that expert."""
    experts = len(load)
    copies = np.ones(experts, dtype=int)
    for _ in range(replicas):  # an expert has at most one copy per rank
        copies[int(np.argmax(np.where(copies < ep, load / copies, -1.0)))] += 1
    pieces = sorted(((load[e] / copies[e], e) for e in range(experts) for _ in range(copies[e])), reverse=True)
    slots, share = slots_per_rank(experts, ep, replicas), np.zeros((experts, ep))
    rank_load, used = np.zeros(ep), np.zeros(ep, dtype=int)
    for tokens, expert in pieces:
        open_ranks = [r for r in range(ep) if used[r] < slots and share[expert, r] == 0]
        if not open_ranks:  # ties (a weightless layer) filled the ranks lacking it: make room on one
            open_ranks = [_make_room(share, rank_load, used, expert, load / copies)]
        rank = min(open_ranks, key=lambda r: (rank_load[r], r))
        share[expert, rank] = 1.0 / copies[expert]
        rank_load[rank] += tokens
        used[rank] += 1
    return share


def _make_room(share: np.ndarray, rank_load: np.ndarray, used: np.ndarray, expert: int,
               copy_tokens: np.ndarray) -> int:
    """A rank that lacks ``expert`` and now has a free slot, made when every rank with one already holds it.

    A full rank s lacking it holds more experts than a rank r with a free slot, so some expert f on s is not
    on r: move f's copy (the lightest such) from s to r and return s. Every expert has at most ep copies, so
    a rank lacking it exists.
    """
    free = int(np.argmin(used))
    lacking = np.nonzero(share[expert] == 0)[0]
    full = int(lacking[np.argmin(rank_load[lacking])])
    movable = np.nonzero((share[:, full] > 0) & (share[:, free] == 0))[0]
    moved = int(movable[np.argmin(copy_tokens[movable])])
    share[moved, free], share[moved, full] = share[moved, full], 0.0
    rank_load[free] += copy_tokens[moved]
    rank_load[full] -= copy_tokens[moved]
    used[free] += 1
    used[full] -= 1
    return full


def layout_cost(load: np.ndarray, coactivation: np.ndarray | None, shares: np.ndarray,
                ranks_per_domain: int) -> LayoutCost:
    """Cost of ``shares`` (layers, experts, ep) under ``load`` (layers, experts) and the optional
    co-activation (layers − 1, experts, experts)."""
    per_rank = np.einsum("le,ler->lr", load, shares)
    pairs = max(load.shape[0] - 1, 0)
    cross_gpu, cross_domain = np.zeros(pairs), np.zeros(pairs)
    if coactivation is not None:
        ep = shares.shape[2]
        domain = np.arange(ep) // ranks_per_domain
        same_domain = (domain[:, None] == domain[None, :]).astype(float)
        for layer in range(pairs):
            a, b, c = shares[layer], shares[layer + 1], coactivation[layer]
            # Σ_ij c[i, j]·Σ_r a[i, r]·b[j, r] as matrix products: the one-call einsum of the domain term
            # summed over (i, r, s, j) at once, 2.8 s per pair of 256-expert x 64-rank layers.
            together = float((c * (a @ b.T)).sum())
            together_domain = float((c * (a @ same_domain @ b.T)).sum())
            cross_gpu[layer] = c.sum() - together
            cross_domain[layer] = c.sum() - together_domain
    return LayoutCost(max_rank_tokens=per_rank.max(axis=1), mean_rank_tokens=per_rank.mean(axis=1),
                      cross_gpu_tokens=cross_gpu, cross_domain_tokens=cross_domain)


def affinity_cost(coactivation: np.ndarray, previous_share: np.ndarray, ranks_per_domain: int) -> np.ndarray:
    """Tokens that cross a GPU plus tokens that cross a domain if expert j of the next layer goes to
    rank r, given the previous layer's layout: shape (experts, ep)."""
    ep = previous_share.shape[1]
    domain = np.arange(ep) // ranks_per_domain
    same_domain = (domain[:, None] == domain[None, :]).astype(float)
    arriving = coactivation.T @ previous_share  # [j, r]: tokens of j whose previous expert sat on r
    arriving_domain = arriving @ same_domain
    total = coactivation.sum(axis=0)[:, None]
    return (total - arriving) + (total - arriving_domain)
