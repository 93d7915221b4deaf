"""Metric learners with a learned comparison (Matching Networks in matching.py, Relation
Networks in relation.py): embedding methods whose head is a module.

The backbone embeds an episode's pool once and EHG re-splits index those embeddings; only the
comparison module, in place of a closed-form head, runs once per re-split (its cost, not the
backbone's, grows with U). The module takes the head's arguments (query [B, nq, d], support
[B, ns, d], support labels, way, shot) and returns logits [B, nq, way]; the method's scale
stays at 1 (neither paper has one).
"""

from __future__ import annotations

import torch
from torch import nn

from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.memory import MemoryTerm


class ComparisonMethod(EmbeddingMethod):
    """An embedding method whose head is a learned comparison module (`comparator`)."""

    def __init__(
        self,
        backbone: nn.Module,
        comparator: nn.Module,
        name: str,
        loss: str,
        amp: str = "auto",
        label_smoothing: float = 0.0,
    ):
        super().__init__(backbone, "protonet", amp=amp, label_smoothing=label_smoothing)
        self.comparator = comparator
        # Its bound call, not the module: a second reference would register it twice.
        self.head_name, self.head_fn = name, comparator.__call__
        self.loss = loss
        self.scale.requires_grad_(False)  # the comparison's own output is the logit

    def check_shot(self, shot: int | None) -> None:
        """Refuse episodes of a shot the comparison module cannot read (its `check_shot`;
        None: varied episodes, of unequal shots)."""
        check = getattr(self.comparator, "check_shot", None)
        if check is not None:
            check(shot)

    @property
    def score_name(self) -> str:
        """Relation Networks' scores are the relation module's sigmoids, not probabilities."""
        return "relation score" if self.loss == "mse" else "probability"

    def to_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Probabilities, or the sigmoid relation scores of a model trained on them (MSE)."""
        return torch.sigmoid(logits) if self.loss == "mse" else torch.softmax(logits, dim=-1)

    def head_terms(
        self, episodes: int, way: int, pool: int, shot: int, resplits: int
    ) -> list[MemoryTerm]:
        """The embedding method's head terms, and what the comparison module holds per
        (query, class) pair and re-split (its `pair_bytes` and `pair_hidden_bytes`: Relation
        Networks' pair maps and hidden layer) and per query (its `query_bytes`, if any:
        Matching Networks' full context embeddings)."""
        terms = super().head_terms(episodes, way, pool, shot, resplits)
        lower = "--resplits" if resplits > 1 else "--episodes-per-batch"
        queries = resplits * episodes * way * (pool - shot)
        size = self.comparator.pair_bytes * queries * way
        if size:
            terms.append(MemoryTerm(size, f"the comparison of {queries * way} pairs", lower))
        size = getattr(self.comparator, "pair_hidden_bytes", 0) * queries * way
        if size:
            reads = f"the hidden layer on {queries * way} pairs"
            terms.append(MemoryTerm(size, reads, "--method-options hidden"))
        per_query = getattr(self.comparator, "query_bytes", None)
        size = per_query(way * shot) * queries if per_query else 0
        if size:
            reads = f"the full context embeddings of {queries} queries"
            terms.append(MemoryTerm(size, reads, "--method-options fce_steps"))
        return terms
