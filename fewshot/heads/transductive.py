"""Transductive test-time classifiers on frozen features: each also uses the episode's unlabelled
queries, all nq of them at once (a separate protocol from the inductive classifiers).

- `bd_cspn`: BD-CSPN (Liu et al., ECCV 2020): prototypes rectified with pseudo-labelled queries.
- `tim`: TIM-GD (Boudiaf et al., NeurIPS 2020): mutual information maximised on the queries.
- `pt_map`: PT-MAP (Hu et al., ICANN 2021): power transform, then MAP class centres by Sinkhorn.

Batched over the B episodes like the heads, no loop over episodes; the queries' order does not
matter (permuting them permutes the logits' rows). Not differentiable: the logits are detached.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fewshot.heads.classifiers import cosine
from fewshot.heads.episode_inputs import (
    check_query,
    class_counts,
    class_means,
    support_one_hot,
    unit_length,
)
from fewshot.runtime.errors import FewshotError

SINKHORN_MAX_ITERS = 1000  # PT-MAP's code: compute_optimal_transport's maxiters
# Sinkhorn iterations between the host's looks at which episodes go on.
SINKHORN_BLOCK = 16
# On a CPU, Sinkhorn's episodes in groups of at most this much kernel (float64). On a 2-core
# EPYC (1 MiB L2 a core), twenty-way episodes (47 KiB each) ran fastest 32-42 at a time: in
# smaller groups the per-operation overhead counts, in batches of 200 the memory traffic.
SINKHORN_CACHE_BYTES = 1 << 21

# What each classifier assumes of the queries it classifies together, beyond an inductive one:
# `fewshot eval`'s episodes hold as many of each class, but `fewshot predict` and
# FewShotClassifier take queries in any number, of any classes (`query_refusal`).
QUERY_ASSUMPTIONS = {
    "bd-cspn": "are spread over the {way} classes as the support is (it shifts them by the "
    "difference of the two sets' means)",
    "tim": "are spread evenly over the {way} classes (it maximises the entropy of their mean "
    "prediction)",
    "pt-map": "are balanced over the {way} classes (it divides them equally among them)",
}
# The classifiers a refusal offers first: inductive, they classify any number of queries.
INDUCTIVE_CHOICES = ("centroid", "logistic")


def bd_cspn(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    epsilon: float = 10.0,
    shift: bool = True,
) -> torch.Tensor:
    """Return BD-CSPN's cosines [B, nq, way] of the queries to the rectified prototypes.

    In [-1, 1] (the caller scales); one pass: no iteration, no tolerance; not differentiable.
    Liu et al., "Prototype Rectification for Few-Shot Learning" (ECCV 2020):

    1. Cross-class bias (if `shift`): every query moves by xi = mean(support) - mean(query), the
       difference of the episode's two means, into the support's domain.
    2. Intra-class bias: the basic prototypes P_n are the support's class means (of the raw
       features); each (shifted) query is pseudo-labelled with its most cosine-similar P_n. The
       rectified prototype of class n is sum_i w_i x_i over its support samples and the queries
       pseudo-labelled n, w_i = exp(epsilon cos(x_i, P_n)) / sum_j exp(epsilon cos(x_j, P_n)):
       a softmax over the class's members, the paper's weighted sum and easyfsl's
       BDCSPN.rectify_prototypes (hard pseudo-labels, weights normalised per class). As in
       easyfsl every query is pseudo-labelled (the paper's sum runs over the support and Z
       pseudo-labelled queries); epsilon is the paper's 10, where easyfsl takes exp(cos): 1.
    3. The logits are cosine similarities, as easyfsl's (the paper's CSPN classifies by cosine):
       of the shifted queries, the features the prototypes were rectified with (easyfsl
       classifies the unshifted ones; with shift=False the two agree).
    """
    if not epsilon > 0:
        raise FewshotError(f"bd-cspn epsilon must be positive, got {epsilon}")
    one_hot = _episode("bd-cspn", query, support, support_labels, way, shot)
    with torch.no_grad():
        support, query = support.detach(), query.detach()
        if shift:
            query = query + (support.mean(1, keepdim=True) - query.mean(1, keepdim=True))
        # Cosines to the basic prototypes: Meta-Baseline's `cosine` is CSPN's classifier.
        similarity = torch.cat(
            [
                cosine(support, support, support_labels, way, shot),
                cosine(query, support, support_labels, way, shot),
            ],
            dim=1,
        )
        pseudo = F.one_hot(similarity[:, support.shape[1] :].argmax(2), way).to(one_hot)
        members = torch.cat([one_hot, pseudo], dim=1) > 0  # [B, ns + nq, way]
        # Every class has a support sample: no column is all -inf.
        scores = (epsilon * similarity).masked_fill(~members, float("-inf"))
        weights = torch.softmax(scores, dim=1)
        prototypes = weights.transpose(1, 2) @ torch.cat([support, query], dim=1)
        return unit_length(query, dim=2) @ unit_length(prototypes, dim=2).transpose(1, 2)


def tim(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    steps: int = 1000,
    lr: float = 1e-4,
    temperature: float = 15.0,
    alpha: float = 0.1,
    lambda_: float = 0.1,
) -> torch.Tensor:
    """Return TIM-GD's query logits [B, nq, way] after `steps` Adam steps (no tolerance).

    Not differentiable. Boudiaf et al., "Transductive Information Maximization for Few-Shot
    Learning" (NeurIPS 2020), as its official code (github.com/mboudiaf/TIM, src/tim.py TIM_GD,
    L2N features):

    - Features L2-normalised; the weights W [B, way, d] start at the class means of the
      normalised support.
    - Logits -temperature/2 |z - w_k|^2 = temperature (z.w_k - |w_k|^2/2 - |z|^2/2): the paper's
      softmax model and the code's 'l2' classifier (easyfsl's TIM takes -|z - w_k|, unsquared,
      unscaled and on raw features, instead).
    - Loss of each episode: lambda_ CE(support) - H(Y_q) + alpha H(Y_q|X_q), with H(Y_q) the
      entropy of the mean query prediction and H(Y_q|X_q) the mean entropy of the query
      predictions: alpha weights the conditional entropy as in the paper's mutual information.
      Defaults of the official code: loss_weights [0.1, 1.0, 0.1] for [CE, H(Y_q), H(Y_q|X_q)],
      temperature 15, Adam with lr 1e-4; 1000 iterations as its TIM-GD evaluation scripts set.
    - All episodes' W in one tensor, their losses summed: Adam acts elementwise, so each
      episode follows its own Adam trajectory. The gradient is written out (`_tim_gradient`)
      rather than taken by autograd: two batched products per step and no graph, on
      features detached from theirs; no host synchronisation in the loop.
    """
    if steps < 0:
        raise FewshotError(f"tim steps must be non-negative, got {steps}")
    if not lr > 0 or not temperature > 0 or not alpha >= 0 or not lambda_ >= 0:
        raise FewshotError(
            f"tim needs lr > 0, temperature > 0, alpha >= 0 and lambda_ >= 0, got lr={lr}, "
            f"temperature={temperature}, alpha={alpha}, lambda_={lambda_}"
        )
    one_hot = _episode("tim", query, support, support_labels, way, shot)
    with torch.no_grad():
        support = unit_length(support.detach(), dim=2)
        query = unit_length(query.detach(), dim=2)
        features = torch.cat([support, query], dim=1)  # [B, ns + nq, d]
        across = features.transpose(1, 2).contiguous()
        targets = one_hot.transpose(1, 2)  # class-major [B, way, ns], as the logits
        weights = class_means(one_hot, support, shot)
        optimizer = torch.optim.Adam([weights], lr=lr)
        for _ in range(steps):
            weights.grad = _tim_gradient(
                weights, features, across, targets, temperature, alpha, lambda_
            )
            optimizer.step()
        return temperature / 2 * _neg_sq_distances(query, weights)


def _tim_gradient(
    weights: torch.Tensor,
    features: torch.Tensor,
    across: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    alpha: float,
    lambda_: float,
) -> torch.Tensor:
    """The gradient [B, way, d] of the summed TIM losses in the weights [B, way, d], by hand:
    features [B, ns + nq, d] (support first), `across` their transpose, targets [B, way, ns].

    The logits are class-major [B, way, n] (reductions over the classes then run along
    contiguous rows) and leave out the sample's own -temperature/2 |z|^2, which no softmax
    over the classes sees. With p the query probabilities and m their mean, the losses'
    derivatives in the logits are lambda_ (p_s - y) / ns on the support and
    p (g - sum_k p_k g_k) / nq on the queries, g = log m - alpha log p; the logits' in w_k
    is temperature (z - w_k)."""
    samples = targets.shape[2]
    queries = features.shape[1] - samples
    logits = temperature * torch.baddbmm(
        weights.pow(2).sum(2, keepdim=True), weights, across, beta=-0.5
    )
    support_logits, query_logits = logits.split([samples, queries], dim=2)
    log_probs = torch.log_softmax(query_logits, dim=1)
    probs = log_probs.exp()
    # The clamp only matters where a class's mean probability underflows (0 log 0 = 0).
    tiny = torch.finfo(probs.dtype).tiny
    g = probs.mean(2, keepdim=True).clamp(min=tiny).log() - alpha * log_probs
    grad = torch.cat(
        [
            lambda_ / samples * (torch.softmax(support_logits, dim=1) - targets),
            probs * (g - (probs * g).sum(1, keepdim=True)) / queries,
        ],
        dim=2,
    )
    return temperature * (grad @ features - grad.sum(2, keepdim=True) * weights)


def pt_map(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    beta: float = 0.5,
    lam: float = 10.0,
    alpha: float = 0.2,
    steps: int = 30,
    epsilon: float = 1e-6,
    center: bool = True,
    tol: float = 1e-6,
) -> torch.Tensor:
    """Return the log of PT-MAP's query class assignments [B, nq, way] (Sinkhorn, MAP steps).

    `steps` MAP steps, each solving a Sinkhorn transport to `tol` (at most SINKHORN_MAX_ITERS
    iterations); not differentiable. Hu et al., "Leveraging the Feature Distribution in
    Transfer-based Few-Shot Learning" (ICANN 2021), as its official code (github.com/yhu01/PT-MAP,
    test_standard.py), in float64:

    - Power transform (x + epsilon)^beta of features made non-negative first: negative values
      are clamped at 0, as after the ReLU the method assumes (easyfsl's PTMAP does the same).
      Then L2 normalisation; then, if `center` (the official code's "trans-mean-sub"), the
      support and the queries are each centred on their own mean and L2-normalised again: a
      shift of the query domain is removed. Its QR reduction is an isometry, left out.
    - Class centres start at the support's class means. Each step: the distances d of the
      queries to the centres give the Sinkhorn plan of exp(-lam d^2) with every query's row
      summing to 1 and every class's column to nq / way (the balanced queries): rows then
      columns rescaled until the row sums change by at most `tol` in an iteration, per episode
      (the official code's test, but there the whole batch stops together). The centres then
      move by `alpha` toward the means of all the samples weighted by their assignments:
      one-hot for the support (its labels fixed), the plan's rows for the queries.
    - The logits: the log of the final plan's rows (from the centres after the last step).

    Defaults of the official code (beta 0.5, lam 10, alpha 0.2, the power transform's 1e-6, the
    Sinkhorn tolerance 1e-6 and its 1000 iterations at most), but 30 MAP steps where it takes 20.
    """
    if not beta > 0 or not lam > 0 or not 0 < alpha <= 1 or not epsilon >= 0 or not tol >= 0:
        raise FewshotError(
            f"pt-map needs beta > 0, lam > 0, 0 < alpha <= 1, epsilon >= 0 and tol >= 0, got "
            f"beta={beta}, lam={lam}, alpha={alpha}, epsilon={epsilon}, tol={tol}"
        )
    if steps < 0:
        raise FewshotError(f"pt-map steps must be non-negative, got {steps}")
    one_hot = _episode("pt-map", query, support, support_labels, way, shot).double()
    samples = support.shape[1]
    with torch.no_grad():
        features = torch.cat([support, query], dim=1).detach().double()
        features = F.normalize((features.clamp(min=0) + epsilon).pow(beta), dim=2)
        if center:
            parts = (features[:, :samples], features[:, samples:])
            features = torch.cat(
                [F.normalize(part - part.mean(1, keepdim=True), dim=2) for part in parts], dim=1
            )
        support, query_features = features[:, :samples], features[:, samples:]
        # Class-major [B, way, ...] throughout: sums over the classes run along rows.
        labelled = one_hot.transpose(1, 2) @ support
        counts = class_counts(one_hot, shot)
        centres = labelled / counts
        column_mass = query.shape[1] / way
        query_norms = query_features.pow(2).sum(2).unsqueeze(1)  # the same at every step

        def transport(centres: torch.Tensor) -> torch.Tensor:
            """The Sinkhorn plan [B, way, nq] of the queries' squared distances to centres."""
            norms = centres.pow(2).sum(2, keepdim=True) + query_norms
            cost = torch.baddbmm(norms, centres, query_features.transpose(1, 2), alpha=-2.0)
            return _sinkhorn(cost, lam, column_mass, tol)

        for _ in range(steps):
            plan = transport(centres)
            # The support's one-hot assignments and the queries' plan, as weights of a mean.
            estimate = (labelled + plan @ query_features) / (counts + plan.sum(2, keepdim=True))
            centres = centres + alpha * (estimate - centres)
        plan = transport(centres)
        logs = plan.clamp(min=torch.finfo(plan.dtype).tiny).log()
        return logs.transpose(1, 2).to(query.dtype)


def query_assumption(name: str | None, way: int) -> str | None:
    """What classifier `name` assumes of the queries of a `way`-way problem, as one clause
    ('pt-map assumes the queries are balanced over the 5 classes (...)'), or None (an
    inductive one; None: a model's own head)."""
    if name not in QUERY_ASSUMPTIONS:
        return None
    return f"{name} assumes the queries {QUERY_ASSUMPTIONS[name].format(way=way)}"


def fewest_queries(name: str | None, way: int) -> int:
    """The fewest queries classifier `name` classifies together in a `way`-way problem."""
    if name not in QUERY_ASSUMPTIONS:
        return 1
    # PT-MAP's transport gives every class nq / way of the queries: with fewer queries than
    # classes no query can be given a class whole, so every one's scores are wrong by
    # construction (one query: 1 / way for every class).
    if name == "pt-map":
        return way
    # BD-CSPN and TIM read the queries' distribution softly. One query leaves nothing to
    # transduce from: BD-CSPN's shift moves it onto the support's mean (its image no longer
    # counts) and TIM's marginal entropy is its own, pushed to uniform scores (0.2 x 5). Below
    # half the classes both fall under nearest centroid, from half on they match or beat it:
    # on 30 Gaussian 1-shot problems each, queries of distinct classes, BD-CSPN / TIM /
    # centroid 10 / 83 (scores 0.2 x 5) / 73 % at 1 of 5 queries, 60 / 47 / 75 % at 2 of 5,
    # 77 / 72 / 69 % at 3 of 5, 81 / 83 / 78 % at way - 1 = 4; 57 / 38 / 65 % at 2 of 10,
    # 64 / 58 / 58 % at 5 of 10, 74 / 81 / 72 % at 9 of 10.
    return max(2, math.ceil(way / 2))


def query_refusal(name: str | None, queries: int, way: int) -> str | None:
    """Why classifier `name` cannot classify `queries` queries of a `way`-way problem together
    (its assumption, then the classifiers that can and the queries it needs), or None."""
    fewest = fewest_queries(name, way)
    if queries >= fewest:
        return None
    choices = INDUCTIVE_CHOICES + tuple(
        other
        for other in QUERY_ASSUMPTIONS
        if other != name and fewest_queries(other, way) <= queries
    )
    offered = f"{', '.join(choices[:-1])} or {choices[-1]}"
    counted = "1 query" if queries == 1 else f"{queries} queries"
    return (
        f"{query_assumption(name, way)}; {counted}: use {offered}, or give {fewest} queries or more"
    )


def _episode(
    name: str,
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
) -> torch.Tensor:
    """Check an episode batch as the heads do, and that it has queries; return labels one-hot."""
    one_hot = support_one_hot(support, support_labels, way, shot)
    check_query(query, support)
    if query.shape[1] < 1:
        raise FewshotError(f"{name} is transductive: it needs at least one query per episode")
    return one_hot


def _neg_sq_distances(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """-|x_i - c_k|^2 [B, n, k] of x [B, n, d] and centres [B, k, d]."""
    norms = x.pow(2).sum(2, keepdim=True) + centres.pow(2).sum(2).unsqueeze(1)
    # |x|^2 - 2 x.c + |c|^2 without the [B, n, k, d] differences, as protonet.
    return -torch.baddbmm(norms, x, centres.transpose(1, 2), alpha=-2.0)


def _sinkhorn(cost: torch.Tensor, lam: float, column_mass: float, tol: float) -> torch.Tensor:
    """The entropic transport plan [B, k, n] of cost [B, k, n] (k classes, n queries): each
    query's assignments scaled to sum to 1, then each class's to column_mass, until the
    queries' sums change by at most tol in an iteration (PT-MAP's code's test), per episode: a
    converged episode stays as it is while the others go on.

    On a CPU the episodes go SINKHORN_CACHE_BYTES of kernel at a time, each group through all
    its iterations: an iteration reads the kernel twice, and a group that stays in cache does
    not wait on memory (20-way episodes: benchmarks/bench_transductive.py).
    """
    if cost.device.type != "cpu":
        return _sinkhorn_episodes(cost, lam, column_mass, tol)
    group = max(1, SINKHORN_CACHE_BYTES // (cost[0].numel() * cost.element_size()))
    return torch.cat([_sinkhorn_episodes(c, lam, column_mass, tol) for c in cost.split(group)])


def _sinkhorn_episodes(
    cost: torch.Tensor, lam: float, column_mass: float, tol: float
) -> torch.Tensor:
    """`_sinkhorn` of these episodes together.

    The plan is kept as its scalings, plan = classes[:, :, None] * kernel * queries[:, None, :]:
    an iteration is two batched products, a row vector [B, 1, .] times the kernel or its
    transposed view (on a CPU several times faster than an elementwise product and a sum, or
    the kernel times a column), and two reciprocals. The test runs once per SINKHORN_BLOCK
    iterations on all of the block's sums at once, and takes each episode's scalings from the
    first iteration that passed it; the host then looks at the episodes (on a GPU, the only
    synchronisation): it stops when none goes on, and drops those done from the batch, whose
    later iterations cost nothing.
    """
    # A query's constant factor cancels at the first scaling (so does the code's division by
    # the total): subtracting each query's smallest cost keeps exp() from underflowing
    # whatever lam, and changes no iterate.
    kernel = torch.exp(-lam * (cost - cost.amin(1, keepdim=True)))
    spread = kernel.sum(1, keepdim=True)  # the class scalings times the kernel [B, 1, n]
    sums = spread  # each query's total assignment, its scaling starting at 1
    final_queries = torch.empty_like(spread)
    final_classes = torch.empty_like(kernel[:, :, :1]).transpose(1, 2)
    going = torch.arange(len(kernel), device=kernel.device)  # the episodes still in the batch
    work = kernel
    for start in range(0, SINKHORN_MAX_ITERS, SINKHORN_BLOCK):
        across = work.transpose(1, 2)
        block = min(SINKHORN_BLOCK, SINKHORN_MAX_ITERS - start)
        # The block's scalings as rows, [T, b, 1, n] and [T, b, 1, k], written in place, and
        # the spreads after the last block's final sums: [T + 1, b, 1, n].
        queries = spread.new_empty(block, *spread.shape)
        classes = spread.new_empty(block, len(work), 1, work.shape[1])
        spreads = spread.new_empty(block + 1, *spread.shape)
        spreads[0] = sums
        for q, c, s in zip(queries, classes, spreads[1:], strict=True):
            # x.reciprocal() * a is what a / x computes for a tensor x: the same rounding.
            torch.reciprocal(spread, out=q)
            torch.bmm(q, across, out=c).reciprocal_().mul_(column_mass)
            spread = torch.bmm(c, work, out=s)
        spread = spread.clone()  # the next block's start; its slot becomes a sum below
        sums = spreads[1:].mul_(queries)  # each query's total assignment per iteration
        changes = (spreads[:-1] - sums).abs_().amax((2, 3))
        if start == 0:
            # The first sums have exp()'s arbitrary scale: no test (the code's never passes).
            changes[0] = float("inf")
        done = ~(changes > tol)  # [T, b]; as the code's test, a NaN change stops
        steps = torch.arange(block, device=kernel.device).unsqueeze(1)
        # The first iteration that passed, else the block's last (the episode goes on).
        at = torch.where(done, steps, block - 1).amin(0)
        rows = torch.arange(len(going), device=kernel.device)
        final_queries[going] = queries[at, rows]
        final_classes[going] = classes[at, rows]
        sums = sums[-1]
        left = (~done.any(0)).nonzero()[:, 0]  # one host sync per block
        if len(left) == 0:
            break
        if len(left) < len(going):
            going, work, spread, sums = going[left], work[left], spread[left], sums[left]
    return final_classes.transpose(1, 2) * kernel * final_queries


__all__ = [
    "QUERY_ASSUMPTIONS",
    "SINKHORN_MAX_ITERS",
    "bd_cspn",
    "fewest_queries",
    "pt_map",
    "query_assumption",
    "query_refusal",
    "tim",
]
