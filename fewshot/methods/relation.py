"""Relation Networks (Sung et al. 2018): a relation module scores each query against each
class's support maps combined over its shots; trained with mean squared error on one-hot
targets.

The paper sums a class's maps, so its model reads one shot count only (a 5-shot sum is five
times anything a 1-shot model saw: 41 % on 5-shot episodes); the mean, the default here, keeps
a class map on one scale for every shot, so one model serves 1 and 5 shots and varied
episodes of unequal shots, which a sum refuses (`combine`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fewshot.heads.episode_inputs import check_query, class_counts, support_one_hot
from fewshot.methods.comparison import ComparisonMethod
from fewshot.methods.embedding import settings_backbone
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import SettingError

RELATION_LOSSES = ("mse", "cross_entropy")
COMBINES = ("mean", "sum")


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
    """Relation Networks' relation module: each class's support feature maps combined over its
    shots (`combine`: mean or the paper's sum), concatenated with a query's map along the
    channels, two conv blocks and two fully connected layers (ReLU, then one output): the
    relation score before its sigmoid."""

    def __init__(
        self,
        feature_map: tuple[int, int, int],
        channels: int = 64,
        hidden: int = 8,
        combine: str = "mean",
        shot: int | None = None,
    ):
        super().__init__()
        self.feature_map, self.combine = feature_map, combine
        # The shot a sum was trained on: the only one whose class maps are on its scale.
        self.shot = shot if combine == "sum" else None
        depth, side, _ = feature_map
        # What training holds per (query, class) pair, about three times each: its first
        # block's maps, and its hidden layer (a memory term of its own: `hidden` sizes it).
        self.pair_bytes = 3 * 4 * channels * side * side
        self.pair_hidden_bytes = 3 * 4 * hidden
        first, side = relation_block(2 * depth, channels, side)
        second, side = relation_block(channels, channels, side)
        self.blocks = nn.Sequential(first, second)
        self.score = nn.Sequential(
            nn.Flatten(), nn.Linear(channels * side * side, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def check_shot(self, shot: int | None) -> None:
        """Refuse episodes of a shot the module cannot read (None: varied episodes, of unequal
        shots): a sum of another number of shots than it was trained on is on another scale
        (any shot reads right with the mean)."""
        if self.combine == "sum" and shot is None:
            raise FewshotError(
                "relation with --method-options combine 'sum' reads episodes of one shot, not "
                "varied episodes: a class map sums its shots, so classes of unequal shots are "
                "on unequal scales (combine 'mean' reads them)"
            )
        if self.shot is not None and shot != self.shot:
            raise FewshotError(
                f"relation was trained with method_options combine 'sum' on {self.shot}-shot "
                f"episodes, so its episodes must be {self.shot}-shot, got {shot}: a class map "
                f"sums its shots, {shot / self.shot:g} times the scale it learned (combine "
                "'mean' reads any shot)"
            )

    def forward(
        self,
        query: torch.Tensor,
        support: torch.Tensor,
        support_labels: torch.Tensor,
        way: int,
        shot: int | None,
    ) -> torch.Tensor:
        """Relation scores (logits) [B, nq, way] of every query with every class (shot None:
        unequal shots, read by the mean alone)."""
        one_hot = support_one_hot(support, support_labels, way, shot)
        check_query(query, support)
        b, nq, _ = query.shape
        classes = one_hot.transpose(1, 2) @ support  # [B, way, d]: sums over the shots
        if self.combine == "mean":
            classes = classes / class_counts(one_hot, shot)
        elif shot is None:
            self.check_shot(shot)  # refuses: a sum's classes of unequal shots differ in scale
        # The first conv of a (class, query) pair's concatenated maps is the sum of its
        # halves' convs: each map is convolved once (way + nq per episode, not way * nq).
        conv = self.blocks[0][0]
        depth = self.feature_map[0]
        on_class = F.conv2d(
            classes.reshape(-1, *self.feature_map), conv.weight[:, :depth], conv.bias, padding=1
        )
        on_query = F.conv2d(query.reshape(-1, *self.feature_map), conv.weight[:, depth:], padding=1)
        pairs = on_query.unflatten(0, (b, nq, 1)) + on_class.unflatten(0, (b, 1, way))
        hidden = self.blocks[1](self.blocks[0][1:](pairs.flatten(0, 2)))
        return self.score(hidden).view(b, nq, way)


def build_relation_method(
    settings: dict, loss: str = "mse", hidden: int = 8, combine: str = "mean"
) -> ComparisonMethod:
    """Relation Networks on the settings' backbone (method options: loss mse or
    cross_entropy, hidden, combine mean or sum); a Conv-4 leaves its last max-pool out unless
    its options say otherwise, so that the relation module compares feature maps."""
    if loss not in RELATION_LOSSES:
        raise SettingError(
            "method_options", f"loss must be one of {', '.join(RELATION_LOSSES)}, got {loss!r}"
        )
    if combine not in COMBINES:
        raise SettingError(
            "method_options", f"combine must be one of {', '.join(COMBINES)}, got {combine!r}"
        )
    if hidden < 1:
        raise SettingError("method_options", f"hidden must be >= 1, got {hidden}")
    if settings["backbone"] == "conv4":
        options = {"pooled_blocks": 3, **settings["backbone_options"]}
        settings = {**settings, "backbone_options": options}
    backbone = settings_backbone(settings)
    if not hasattr(backbone, "feature_map"):  # a plug-in's or a library's pooled features
        raise SettingError(
            "backbone",
            f"{settings['backbone']} returns vectors [N, {backbone.out_dim}], and --method "
            "relation compares feature maps: use conv4 or resnet12, or a backbone with a "
            "feature_map attribute, the (channels, height, width) its flat features come from",
        )
    if backbone.feature_map is None:  # its options pooled the map away
        raise SettingError(
            "backbone_options",
            "must keep a feature map for --method relation (Conv-4 with max-pooling, ResNet-12 "
            "without avg_pool)",
        )
    if combine == "sum" and settings["val_shot"] != settings["shot"]:
        raise SettingError(
            "val_shot",
            f"must be --shot ({settings['shot']}) with method_options combine 'sum' (a sum of "
            f"another number of shots is on another scale), got {settings['val_shot']}",
        )
    head = RelationHead(backbone.feature_map, hidden=hidden, combine=combine, shot=settings["shot"])
    # Label smoothing is refused for the method (UNUSED_SETTINGS); the MSE has no use for it.
    return ComparisonMethod(backbone, head, "relation", loss, settings["amp"])
