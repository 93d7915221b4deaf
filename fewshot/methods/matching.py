"""Matching Networks (Vinyals et al. 2016): softmax attention over the similarities of a
query to the support, with the paper's full context embeddings as an option.

The similarity is an option: the paper's cosine, a cosine times a learned temperature (as
Baseline++ and Meta-Baseline scale theirs), or the negative squared Euclidean distance (the
default). The paper's untempered cosines of ReLU features lie in [0, 1], so its attention can
never be sharp: trained longer it stalls near 86 % on Omniglot 5-way 1-shot
(experiments/matching_similarity measures the three side by side)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fewshot.heads.episode_inputs import check_query, support_one_hot
from fewshot.heads.protonet import squared_distances
from fewshot.methods.comparison import ComparisonMethod
from fewshot.methods.embedding import settings_backbone
from fewshot.runtime.settings import SettingError

SIMILARITIES = ("euclidean", "cosine", "scaled_cosine")


class MatchingHead(nn.Module):
    """Matching Networks' classifier: softmax attention over the similarities of a query to
    every support sample (`similarity`: euclidean, cosine or scaled_cosine, whose temperature
    starts at `temperature` and is learned); the class probabilities are the attention the
    class's samples get, returned as log-probabilities. With `fce` the paper's full context
    embeddings:
    a bidirectional LSTM over the support (g) and an attention LSTM of `fce_steps` reads for
    each query (f; default: as many reads as support samples)."""

    pair_bytes = 0  # nothing per (query, class) pair beyond the attention

    def __init__(
        self,
        dim: int,
        fce: bool = False,
        fce_steps: int | None = None,
        similarity: str = "euclidean",
        temperature: float = 10.0,
    ):
        super().__init__()
        self.fce, self.fce_steps, self.similarity = fce, fce_steps, similarity
        if similarity == "scaled_cosine":
            self.temperature = nn.Parameter(torch.tensor(float(temperature)))
        if fce:
            self.support_lstm = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
            # Input: the query's own embedding and the last read of the support, as the
            # paper's LSTM(f'(x), [h, r], c) with the read fed as input.
            self.query_cell = nn.LSTMCell(2 * dim, dim)

    def query_bytes(self, support: int) -> int:
        """What training holds per query for the full context embeddings' reads of a support
        of `support` samples: per read the LSTM cell's inputs, gates and states and the
        attention (0 without fce)."""
        if not self.fce:
            return 0
        dim = self.query_cell.hidden_size
        return 4 * (self.fce_steps or support) * (9 * dim + support)

    def encode_support(self, support: torch.Tensor) -> torch.Tensor:
        """g(x_i, S) = g'(x_i) + forward and backward LSTM states over the support [B, ns, d]."""
        states, _ = self.support_lstm(support)
        forward, backward = states.chunk(2, dim=-1)
        return support + forward + backward

    def encode_query(self, query: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
        """f(x, S): K reads of the support, h_k = LSTM([f'(x), r_{k-1}], h_{k-1}) + f'(x),
        r_k = softmax(h_k . g(S)) g(S), starting from h_0 = f'(x)."""
        b, nq, d = query.shape
        steps = self.fce_steps or support.shape[1]
        flat = query.reshape(b * nq, d)
        hidden, cell = flat, torch.zeros_like(flat)
        for _ in range(steps):
            attention = torch.softmax(hidden.view(b, nq, d) @ support.transpose(1, 2), dim=-1)
            read = (attention @ support).reshape(b * nq, d)
            hidden, cell = self.query_cell(torch.cat([flat, read], dim=1), (hidden, cell))
            hidden = hidden + flat
        return hidden.view(b, nq, d)

    def similarities(self, query: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
        """The attention's logits [B, nq, ns]: each query's similarity to each support sample."""
        if self.similarity == "euclidean":
            return -squared_distances(query, support)
        cosine = F.normalize(query, dim=-1) @ F.normalize(support, dim=-1).transpose(1, 2)
        return cosine * self.temperature if self.similarity == "scaled_cosine" else cosine

    def forward(
        self,
        query: torch.Tensor,
        support: torch.Tensor,
        support_labels: torch.Tensor,
        way: int,
        shot: int | None,
    ) -> torch.Tensor:
        """log P(class | query) [B, nq, way]; any counts per class (shot None: unequal), the
        attention summing each class's samples, the full context embeddings reading the
        support as one sequence."""
        one_hot = support_one_hot(support, support_labels, way, shot)
        check_query(query, support)
        if self.fce:
            support = self.encode_support(support)
            query = self.encode_query(query, support)
        log_attention = torch.log_softmax(self.similarities(query, support), dim=-1)  # [B, nq, ns]
        # log sum_i a_i [y_i = c]: a log-sum-exp over each class's support samples.
        mask = torch.where(one_hot.bool(), 0.0, float("-inf")).to(log_attention.dtype)
        return torch.logsumexp(log_attention[..., None] + mask[:, None], dim=2)


def build_matching_method(
    settings: dict,
    fce: bool = False,
    fce_steps: int | None = None,
    similarity: str = "euclidean",
    temperature: float = 10.0,
) -> ComparisonMethod:
    """Matching Networks on the settings' backbone (method options: fce, fce_steps,
    similarity, temperature)."""
    if fce_steps is not None and (not fce or fce_steps < 1):
        raise SettingError(
            "method_options", f"fce_steps must be >= 1 with fce true, got {fce_steps}"
        )
    if similarity not in SIMILARITIES:
        raise SettingError(
            "method_options",
            f"similarity must be one of {', '.join(SIMILARITIES)}, got {similarity!r}",
        )
    if not (0 < temperature < float("inf")) or (
        similarity != "scaled_cosine" and temperature != 10
    ):
        raise SettingError(
            "method_options",
            f"temperature must be a positive finite number with similarity scaled_cosine, "
            f"got {temperature}",
        )
    backbone = settings_backbone(settings)
    head = MatchingHead(backbone.out_dim, fce, fce_steps, similarity, temperature)
    return ComparisonMethod(
        backbone, head, "matching", "cross_entropy", settings["amp"], settings["label_smoothing"]
    )
