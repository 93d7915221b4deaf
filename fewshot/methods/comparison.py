"""Metric learners with a learned comparison: Matching Networks (Vinyals et al. 2016) and
Relation Networks (Sung et al. 2018).

Both are embedding methods: the backbone embeds an episode's pool once and EHG re-splits index
those embeddings; only the comparison module, in place of a closed-form head, runs once per
re-split (its cost, not the backbone's, grows with U). The module takes the head's arguments
(query [B, nq, d], support [B, ns, d], support labels, way, shot) and returns logits
[B, nq, way]; the method's scale stays at 1 (neither paper has one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fewshot.heads.episode_inputs import check_query, support_one_hot
from fewshot.methods.embedding import EmbeddingMethod, settings_backbone
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.settings import SettingError

RELATION_LOSSES = ("mse", "cross_entropy")


class MatchingHead(nn.Module):
    """Matching Networks' classifier: softmax attention over the cosine similarities of a
    query to every support sample; the class probabilities are the attention the class's
    samples get, returned as log-probabilities. With `fce` the paper's full context embeddings:
    a bidirectional LSTM over the support (g) and an attention LSTM of `fce_steps` reads for
    each query (f; default: as many reads as support samples)."""

    def __init__(self, dim: int, fce: bool = False, fce_steps: int | None = None):
        super().__init__()
        self.fce, self.fce_steps = fce, fce_steps
        if fce:
            self.support_lstm = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
            # Input: the query's own embedding and the last read of the support, as the
            # paper's LSTM(f'(x), [h, r], c) with the read fed as input.
            self.query_cell = nn.LSTMCell(2 * dim, dim)

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

    def forward(
        self,
        query: torch.Tensor,
        support: torch.Tensor,
        support_labels: torch.Tensor,
        way: int,
        shot: int,
    ) -> torch.Tensor:
        """log P(class | query) [B, nq, way]."""
        one_hot = support_one_hot(support, support_labels, way, shot)
        check_query(query, support)
        if self.fce:
            support = self.encode_support(support)
            query = self.encode_query(query, support)
        similarity = F.normalize(query, dim=-1) @ F.normalize(support, dim=-1).transpose(1, 2)
        log_attention = torch.log_softmax(similarity, dim=-1)  # [B, nq, ns]
        # log sum_i a_i [y_i = c]: a log-sum-exp over each class's support samples.
        mask = torch.where(one_hot.bool(), 0.0, float("-inf")).to(log_attention.dtype)
        return torch.logsumexp(log_attention[..., None] + mask[:, None], dim=2)


def relation_block(in_channels: int, channels: int, side: int) -> tuple[nn.Sequential, int]:
    """conv3x3 -> BatchNorm -> ReLU -> maxpool 2 (no pool on a 1-pixel map); the block and
    the side of its output."""
    pool = side >= 2
    block = nn.Sequential(
        nn.Conv2d(in_channels, channels, 3, padding=1),
        nn.BatchNorm2d(channels),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2) if pool else nn.Identity(),
    )
    return block, side // 2 if pool else side


class RelationHead(nn.Module):
    """Relation Networks' relation module: each class's support feature maps summed over its
    shots, concatenated with a query's map along the channels, two conv blocks and two fully
    connected layers (ReLU, then one output): the relation score before its sigmoid."""

    def __init__(self, feature_map: tuple[int, int, int], channels: int = 64, hidden: int = 8):
        super().__init__()
        self.feature_map = feature_map
        depth, side, _ = feature_map
        first, side = relation_block(2 * depth, channels, side)
        second, side = relation_block(channels, channels, side)
        self.blocks = nn.Sequential(first, second)
        self.score = nn.Sequential(
            nn.Flatten(), nn.Linear(channels * side * side, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(
        self,
        query: torch.Tensor,
        support: torch.Tensor,
        support_labels: torch.Tensor,
        way: int,
        shot: int,
    ) -> torch.Tensor:
        """Relation scores (logits) [B, nq, way] of every query with every class."""
        one_hot = support_one_hot(support, support_labels, way, shot)
        check_query(query, support)
        b, nq, _ = query.shape
        classes = one_hot.transpose(1, 2) @ support  # [B, way, d]: sums over the shots
        pairs = torch.cat(
            [
                classes[:, None].expand(b, nq, way, -1).reshape(-1, *self.feature_map),
                query[:, :, None].expand(b, nq, way, -1).reshape(-1, *self.feature_map),
            ],
            dim=1,
        )
        return self.score(self.blocks(pairs)).view(b, nq, way)


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

    def memory_terms(
        self, episodes: int, way: int, pool: int, shot: int, resplits: int, training: bool
    ) -> list[MemoryTerm]:
        """The embedding method's terms, and for Relation Networks the pairs' maps that the
        relation module holds (three tensors of the pairs' size, per re-split)."""
        terms = super().memory_terms(episodes, way, pool, shot, resplits, training)
        if isinstance(self.comparator, RelationHead):
            pairs = resplits * episodes * way * (pool - shot) * way
            size = 3 * 4 * pairs * 2 * self.backbone.out_dim
            terms.append(MemoryTerm(size, f"the relation module on {pairs} pairs", "--resplits"))
        return terms


def build_matching_method(
    settings: dict, fce: bool = False, fce_steps: int | None = None
) -> ComparisonMethod:
    """Matching Networks on the settings' backbone (method options: fce, fce_steps)."""
    if fce_steps is not None and (not fce or fce_steps < 1):
        raise SettingError(
            "method_options", f"fce_steps must be >= 1 with fce true, got {fce_steps}"
        )
    backbone = settings_backbone(settings)
    head = MatchingHead(backbone.out_dim, fce, fce_steps)
    return ComparisonMethod(
        backbone, head, "matching", "cross_entropy", settings["amp"], settings["label_smoothing"]
    )


def build_relation_method(settings: dict, loss: str = "mse", hidden: int = 8) -> ComparisonMethod:
    """Relation Networks on the settings' backbone (method options: loss mse or
    cross_entropy, hidden); a Conv-4 leaves its last max-pool out unless its options say
    otherwise, so that the relation module compares feature maps."""
    if loss not in RELATION_LOSSES:
        raise SettingError(
            "method_options", f"loss must be one of {', '.join(RELATION_LOSSES)}, got {loss!r}"
        )
    if hidden < 1:
        raise SettingError("method_options", f"hidden must be >= 1, got {hidden}")
    if settings["backbone"] == "conv4":
        options = {"pooled_blocks": 3, **settings["backbone_options"]}
        settings = {**settings, "backbone_options": options}
    backbone = settings_backbone(settings)
    if getattr(backbone, "feature_map", None) is None:
        raise SettingError(
            "backbone_options",
            "must keep a feature map for --method relation (Conv-4 with max-pooling, ResNet-12 "
            "without avg_pool)",
        )
    head = RelationHead(backbone.feature_map, hidden=hidden)
    # Label smoothing is refused for the method (UNUSED_SETTINGS); the MSE has no use for it.
    return ComparisonMethod(backbone, head, "relation", loss, settings["amp"])
