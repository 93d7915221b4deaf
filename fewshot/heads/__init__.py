"""Few-shot classification heads: batched (query, support, labels, way, shot) -> logits.

The contract: head(query [B, nq, d], support [B, ns, d], support_labels [B, ns], way, shot,
**options) -> logits [B, nq, way]. An integer `shot`: every episode holds each class 0..way-1
exactly `shot` times (ns = way * shot). `shot=None`: unequal shots (Meta-Dataset's varied
episodes), each class at least once in any counts, which may differ between the episodes of a
batch (ns is their common sum); the heads then use each class's own count.

Another package's head joins by an entry point of the group `fewshot.heads` naming such a
function (`--head NAME`); once registered it is a test-time classifier too (CLASSIFIERS), its
logits checked at every call.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch

from fewshot.heads.classifiers import centroid, cosine, finetune, logistic
from fewshot.heads.protonet import protonet
from fewshot.heads.ridge import ridge
from fewshot.heads.svm import svm
from fewshot.heads.transductive import (
    QUERY_ASSUMPTIONS,
    bd_cspn,
    pt_map,
    query_assumption,
    query_refusal,
    tim,
)
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.plugins import RegistryNames, require_signature
from fewshot.runtime.shapes import describe_tensor

Head = Callable[..., torch.Tensor]

# The trainable heads: differentiable in the support and query features.
HEADS: dict[str, Head] = {"protonet": protonet, "ridge": ridge, "svm": svm, "cosine": cosine}
# Every classifier of frozen features at test time: the heads and those that only evaluate.
CLASSIFIERS: dict[str, Head] = {
    **HEADS,
    "centroid": centroid,
    "logistic": logistic,
    "finetune": finetune,
    "bd-cspn": bd_cspn,
    "tim": tim,
    "pt-map": pt_map,
}
# The options that regularise each head's problem, with the ranges they usually take
# (MetaOptNet: ridge lam 50, SVM C 0.1 with a dual ridge of 1), widened: outside them, a value
# is named as the likely cause of a diverged training.
REGULARISATION: dict[str, dict[str, tuple[float, float]]] = {
    "ridge": {"lam": (1e-2, 1e4)},
    "svm": {"C": (1e-3, 1e2), "dual_ridge": (1e-3, 1e2)},
}
# The classifiers that also use each episode's unlabelled queries (a separate protocol: results
# say so), each with what it assumes of them.
TRANSDUCTIVE: frozenset[str] = frozenset(QUERY_ASSUMPTIONS)


# The options that count a classifier's iterations: its check runs one.
ITERATIONS = ("steps", "max_iter")


def check_head(name: str, way: int, shot: int | None, options: dict) -> None:
    """Run a head or test-time classifier once on a tiny episode like this shape: its own
    checks (one-line FewshotErrors) refuse options and shapes it cannot take, before any data
    is read.

    The episode is at most 2-way (the heads' only limit on the shape: SVM and logistic need
    two classes) and 1-shot, so its cost does not grow with the settings: checking a
    million-way run must not allocate a million-way episode before the data has ruled that
    way out. Unequal shots (shot None) are checked on one image per class, as shot None. A
    classifier that iterates runs one iteration (when its count is valid), and CL2N's
    base-class centre stands in as zeros.
    """
    way, per_class = min(way, 2), 1 if shot is None else min(shot, 1)
    samples = way * per_class
    support = torch.eye(samples).unsqueeze(0)  # independent features: any kernel is regular
    labels = torch.arange(way).repeat_interleave(per_class).unsqueeze(0)
    classifier = CLASSIFIERS[name]
    defaults = inspect.signature(classifier).parameters
    quick = {}
    for key in ITERATIONS:
        count = options.get(key, defaults[key].default) if key in defaults else None
        if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
            quick[key] = 1
    if options.get("cl2n") is True and "center" not in options:
        quick["center"] = torch.zeros(samples)
    shot = None if shot is None else per_class  # unequal shots: the heads' own checks for them
    classifier(support[:, :1], support, labels, way, shot, **{**options, **quick})


def _adopt_head(name: str, plugin: object) -> None:
    """Register a plug-in head, trainable and a test-time classifier; TypeError unless it is a
    function of (query, support, support_labels, way, shot)."""
    if isinstance(plugin, type):  # a class takes the episode as its constructor's arguments
        raise TypeError(f"must name a head function, not the class {plugin.__qualname__}")
    episode = ("query", "support", "support_labels", "way", "shot")
    require_signature(
        plugin,
        "a head function (query, support, support_labels, way, shot, **options), its "
        "options with defaults",
        *episode,
    )
    HEADS[name] = CLASSIFIERS[name] = _checked(name, plugin)


def _checked(name: str, head: Head) -> Head:
    """Plug-in head `name` with its logits checked at every call (their shape and dtype: no
    synchronisation), so that the first episode it classifies, where the settings run it
    (`check_head`) or in training, refuses logits of another shape or class count in one
    line naming it and what it returned, before a wrong loss or accuracy is computed."""

    @functools.wraps(head)  # its signature, which the options are checked against
    def checked(
        query: torch.Tensor,
        support: torch.Tensor,
        support_labels: torch.Tensor,
        way: int,
        shot: int | None,
        **options: object,
    ) -> torch.Tensor:
        logits = head(query, support, support_labels, way, shot, **options)
        want = (*query.shape[:2], way)
        if isinstance(logits, torch.Tensor) and logits.is_floating_point() and logits.shape == want:
            return logits
        raise FewshotError(
            f"{_NAMES.label(name)} returned {describe_tensor(logits)} for {want[0]} episode(s) "
            f"of {want[1]} queries and {way} classes: a head returns float logits "
            f"[B, nq, way] = {list(want)}"
        )

    return checked


# A plug-in head is also a classifier: it may take no classifier's name either.
_NAMES = RegistryNames("fewshot.heads", "head", HEADS.keys(), _adopt_head, taken=CLASSIFIERS.keys())


def head_names() -> RegistryNames:
    """The trainable heads' names (the settings' choices): `name in head_names()` also finds
    and registers a plug-in head (entry point group `fewshot.heads`)."""
    return _NAMES


def get_head(name: str) -> Head:
    """Return the head registered under name (a plug-in's registered first)."""
    if name not in _NAMES:
        raise FewshotError(f"unknown head {name!r}; choose one of {', '.join(sorted(HEADS))}")
    return HEADS[name]


__all__ = [
    "CLASSIFIERS",
    "HEADS",
    "REGULARISATION",
    "TRANSDUCTIVE",
    "Head",
    "bd_cspn",
    "centroid",
    "check_head",
    "cosine",
    "finetune",
    "get_head",
    "head_names",
    "logistic",
    "protonet",
    "pt_map",
    "query_assumption",
    "query_refusal",
    "ridge",
    "svm",
    "tim",
]
