"""Methods that adapt parameters to every episode by gradient steps on its support set: MAML,
first-order MAML, ANIL and iMAML.

Their meta-gradients come from the hypergradient engine (`fewshot.hpo.hypergrad`) with the
initialisation as the outer variable: MAML is RHG through the K inner steps, first-order MAML
is RHG without the second-order terms, ANIL is MAML on the linear classifier over embeddings
computed once per episode, iMAML is AID-CG on the proximally regularised inner problem.

All U*B problems of a step (B episodes, U re-splits each) adapt at once: the adapted parameters
carry a leading problem axis and `torch.func.vmap` runs `functional_call` per problem. BatchNorm
always normalises with the statistics of the batch it sees, per problem (transductive, as in
MAML and learn2learn): the network keeps no running statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, replace_all_batch_norm_modules_, vmap

from fewshot.backbones import build_backbone
from fewshot.backbones.footprint import activation_elements
from fewshot.hpo.hypergrad import Bilevel, aid_cg, rhg
from fewshot.hpo.trees import Tree, tree_detach, tree_flatten
from fewshot.methods.base import Method, check_episodes
from fewshot.methods.resplit import resplit_episodes
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.precision import autocast_dtype
from fewshot.runtime.settings import SettingError

VARIANTS = ("maml", "fomaml", "anil", "imaml")
# The MAML paper's meta-optimisation, which these methods train with unless told otherwise;
# contiguous tensors, since BatchNorm under vmap refuses channels_last on CUDA.
MAML_TRAINING = {
    "optimizer": "adam",
    "lr": 1e-3,
    "weight_decay": 0.0,
    "lr_schedule": [],
    "channels_last": False,
}


def unused_settings(variant: str) -> frozenset[str]:
    """The training settings a variant never reads: the embedding heads' and --init (a
    pretrained backbone is for embedding methods) and, for the
    variants that adapt every layer under vmap, channels_last (BatchNorm inside vmap cannot
    query a channels_last tensor on CUDA; ANIL runs its backbone outside vmap)."""
    unused = {"head", "head_options", "eval_head_options", "label_smoothing", "init"}
    return frozenset(unused if variant == "anil" else unused | {"channels_last"})


class Network(nn.Module):
    """The adapted network: a backbone and a linear classifier with one output per class."""

    def __init__(self, backbone: nn.Module, way: int):
        super().__init__()
        self.backbone = backbone
        self.classifier = nn.Linear(backbone.out_dim, way)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits [N, way] of images [N, C, H, W]."""
        return self.classifier(self.backbone(images))


def _split(inputs: torch.Tensor, resplits: torch.Tensor | None, shot: int):
    """Support [E, way*shot, ...] and query [E, way*Q, ...] of the U*B problems of inputs
    [B, way, pool, ...], with their labels [way*shot] and [way*Q]."""
    b, way, pool = inputs.shape[:3]
    rest = inputs.shape[3:]
    query, support, support_labels, query_labels = resplit_episodes(
        inputs.reshape(b, way, pool, -1), resplits, shot
    )
    return (
        support.reshape(*support.shape[:2], *rest),
        query.reshape(*query.shape[:2], *rest),
        support_labels[0],
        query_labels[0],
    )


class AdaptationMethod(Method):
    """MAML, first-order MAML, ANIL or iMAML (`variant`) on a backbone with a `way`-class head."""

    def __init__(
        self,
        backbone: nn.Module,
        way: int,
        variant: str,
        inner_steps: int,
        inner_lr: float,
        eval_inner_steps: int | None = None,
        proximal: float = 1.0,
        solver_steps: int = 5,
        amp: str = "auto",
    ):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        replace_all_batch_norm_modules_(backbone)  # batch statistics always (transductive)
        self.network = Network(backbone, way)
        self.way, self.variant, self.amp = way, variant, amp
        self.inner_steps, self.inner_lr, self.proximal = inner_steps, inner_lr, proximal
        self.eval_inner_steps = inner_steps if eval_inner_steps is None else eval_inner_steps
        self.solver_steps = solver_steps
        # Whether the last training step's support loss was finite at the initialisation.
        self.start_finite: torch.Tensor | bool = True

    def adapted(self) -> nn.Module:
        """The module whose parameters adapt per episode: the classifier for ANIL."""
        return self.network.classifier if self.variant == "anil" else self.network

    def check_way(self, way: int) -> None:
        """Refuse episodes of another way than the classifier's."""
        if way != self.way:
            raise FewshotError(
                f"{self.variant} was trained {self.way}-way: its classifier has {self.way} "
                f"outputs, so its episodes must be {self.way}-way, got {way}"
            )

    def _run(self, network: Callable, inputs: torch.Tensor) -> torch.Tensor:
        """`network(inputs)` under the method's autocast (`amp` resolved on the device), its
        output back in the inputs' dtype."""
        dtype = autocast_dtype(self.amp, inputs.device.type)
        if dtype is None:
            return network(inputs)
        with torch.autocast(inputs.device.type, dtype=dtype):
            return network(inputs).to(inputs.dtype)

    def _logits(self, theta: dict, inputs: torch.Tensor) -> torch.Tensor:
        """Float32 logits [E, n, way] of each problem's inputs [E, n, ...] under its theta."""
        module = self.adapted()
        per_problem = vmap(lambda p, x: functional_call(module, p, (x,)))
        return self._run(lambda x: per_problem(theta, x), inputs)

    def _problem(self, problems: int, record: dict) -> Bilevel:
        """The bilevel problem of `problems` episodes: the inner loss is the sum of their
        support losses (each problem's gradient is its own), the outer their mean query loss.
        `record["accuracy"]` gets the query accuracy of each problem at the adapted weights."""

        def data(lam: Tree, batch: tuple, key: str) -> tuple[torch.Tensor, torch.Tensor]:
            inputs, labels = batch
            return (lam[key] if inputs is None else inputs), labels  # ANIL: differentiable

        def inner(theta: dict, lam: dict, batch: tuple) -> torch.Tensor:
            inputs, labels = data(lam, batch, "support")
            logits = self._logits(theta, inputs)
            loss = F.cross_entropy(
                logits.flatten(0, 1), labels.repeat(problems), reduction="sum"
            ) / len(labels)
            if self.variant == "imaml":
                for name, value in theta.items():
                    loss = loss + self.proximal / 2 * ((value - lam["init"][name]) ** 2).sum()
            record.setdefault("start_loss", loss.detach())  # at the initialisation
            return loss

        def outer(theta: dict, lam: dict, batch: tuple) -> torch.Tensor:
            inputs, labels = data(lam, batch, "query")
            logits = self._logits(theta, inputs)
            record["accuracy"] = (logits.argmax(-1) == labels).float().mean(-1).detach()
            return F.cross_entropy(logits.flatten(0, 1), labels.repeat(problems))

        return Bilevel(inner, outer, self.inner_lr)

    def _episodes(self, images: torch.Tensor, resplits: torch.Tensor | None, shot: int):
        """lam (the initialisation, and ANIL's embeddings), the train and validation data."""
        lam: dict = {"init": dict(self.adapted().named_parameters())}
        if self.variant == "anil":
            # Each episode's pool in one backbone pass (its BatchNorm statistics, as learn2learn's
            # ANIL), shared by the episode's U re-splits. A loop: on a CPU, 1.8-2.4x faster than
            # vmap or one pass over the whole batch (measured on Conv-4, 32 episodes).
            b, way, pool = images.shape[:3]
            backbone = self.network.backbone
            features = self._run(
                lambda x: torch.stack([backbone(e) for e in x]), images.flatten(1, 2)
            )
            support, query, ys, yq = _split(features.view(b, way, pool, -1), resplits, shot)
            lam.update(support=support, query=query)
            return lam, (None, ys), (None, yq), len(support)
        support, query, ys, yq = _split(images, resplits, shot)
        return lam, (support, ys), (query, yq), len(support)

    @staticmethod
    def _start(problems: int):
        """theta0 as a function of lam: the initialisation, one copy per problem."""
        return lambda lam: {k: v.expand(problems, *v.shape) for k, v in lam["init"].items()}

    def forward(
        self, images: torch.Tensor, resplits: torch.Tensor | None, shot: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A loss whose gradient is the meta-gradient of the mean query loss of the U*B
        problems (its value is that loss), and the query accuracy of each problem."""
        lam, train, val, problems = self._episodes(images, resplits, shot)
        record: dict = {}
        problem = self._problem(problems, record)
        start = self._start(problems)
        if self.variant == "imaml":
            steps, solver = self.inner_steps, self.solver_steps
            result = aid_cg(problem, start, lam, train, val, steps, solver, per_problem=True)
        else:
            first_order = self.variant == "fomaml"
            result = rhg(problem, start, lam, train, val, self.inner_steps, first_order=first_order)
        # Read only if the step diverges (no synchronisation here).
        self.start_finite = torch.isfinite(record["start_loss"])
        # Linear in the parameters (and ANIL's embeddings): backward() puts the meta-gradient
        # in .grad, through the embeddings into the backbone, scaled like any loss by AMP.
        pairs = zip(tree_flatten(lam)[0], tree_flatten(result.grad)[0], strict=True)
        surrogate = sum((x * g).sum() for x, g in pairs if x.requires_grad)
        loss = surrogate - surrogate.detach() + result.outer_loss
        return loss, record["accuracy"]

    def memory_terms(
        self, episodes: int, way: int, pool: int, shot: int, resplits: int, training: bool
    ) -> list[MemoryTerm]:
        """The backbone's activations: ANIL's once per episode; the others' per problem and
        per kept inner step (second-order MAML keeps every step's support pass for the
        backward through the adaptation)."""
        total, _ = activation_elements(self.network.backbone)
        device = next(self.parameters()).device
        element = 4 if autocast_dtype(self.amp, device.type) is None else 2
        if self.variant == "anil":
            images = episodes * way * pool
            return [
                MemoryTerm(
                    images * total * element,
                    f"the backbone on {images} images",
                    "--episodes-per-batch",
                )
            ]
        kept = self.inner_steps if training and self.variant == "maml" else 1
        problems = resplits * episodes
        images = problems * way * (shot * kept + pool - shot)
        what = f"{problems} problems' activations over {kept} kept inner step(s)"
        lower = "--method-options inner_steps" if kept > 1 else "--episodes-per-batch"
        return [MemoryTerm(images * total * element, what, lower)]

    def divergence_advice(self) -> str:
        """The inner adaptation when it started from a finite loss (the initialisation was
        sound, the steps from it were not), else the meta-training."""
        if not bool(self.start_finite):
            return super().divergence_advice()
        return (
            f"the inner adaptation diverged: lower --method-options inner_lr (now "
            f"{self.inner_lr}) or inner_steps (now {self.inner_steps})"
        )

    def accuracy(self, images: torch.Tensor, shot: int) -> torch.Tensor:
        """Query accuracy of each test episode after `eval_inner_steps` steps on its support."""
        check_episodes("AdaptationMethod.accuracy", images, shot, self.network.backbone)
        self.check_way(images.shape[1])
        with torch.no_grad():
            lam, train, val, problems = self._episodes(images, None, shot)
        lam = tree_detach(lam)
        record: dict = {}
        problem = self._problem(problems, record)
        theta = problem.descend(self._start(problems), lam, train, self.eval_inner_steps)
        with torch.no_grad():
            problem.outer_loss(theta, lam, val)
        return record["accuracy"]


def adaptation_builder(variant: str):
    """The registry builder of one variant; its keyword options are the method's settings."""

    def check(settings: dict, inner_steps: int, inner_lr: float, eval_inner_steps) -> None:
        """The settings this method cannot run with, refused before any data is read."""
        if inner_steps < 1:
            raise SettingError("method_options", f"inner_steps must be >= 1, got {inner_steps}")
        if eval_inner_steps is not None and eval_inner_steps < 0:
            raise SettingError(
                "method_options", f"eval_inner_steps must be >= 0, got {eval_inner_steps}"
            )
        if not inner_lr > 0:
            raise SettingError("method_options", f"inner_lr must be > 0, got {inner_lr}")
        if variant != "anil" and settings["backbone"] != "conv4":
            raise SettingError(
                "backbone",
                f"must be conv4 for {variant}, which adapts every layer per episode (anil "
                f"adapts the classifier alone and takes any backbone), got {settings['backbone']}",
            )
        if settings.get("val_way", settings["way"]) != settings["way"]:
            raise SettingError(
                "val_way",
                f"must equal way ({settings['way']}) for {variant}: its classifier has one "
                f"output per class, got {settings['val_way']}",
            )

    def network(settings: dict) -> nn.Module:
        return build_backbone(
            settings["backbone"],
            settings["in_channels"],
            settings["image_size"],
            **settings["backbone_options"],
        )

    if variant == "imaml":

        def build_imaml(
            settings: dict,
            *,
            inner_steps: int = 5,
            inner_lr: float = 0.1,
            eval_inner_steps: int | None = None,
            proximal: float = 1.0,
            solver_steps: int = 5,
        ) -> AdaptationMethod:
            """iMAML: K steps on the support loss + proximal/2 |theta - init|^2, AID-CG."""
            check(settings, inner_steps, inner_lr, eval_inner_steps)
            if not proximal > 0:
                raise SettingError("method_options", f"proximal must be > 0, got {proximal}")
            if solver_steps < 1:
                raise SettingError(
                    "method_options", f"solver_steps must be >= 1, got {solver_steps}"
                )
            return AdaptationMethod(
                network(settings), settings["way"], variant, inner_steps, inner_lr,
                eval_inner_steps, proximal, solver_steps, settings["amp"],
            )  # fmt: skip

        return build_imaml

    def build(
        settings: dict,
        *,
        inner_steps: int = 1,
        inner_lr: float = 0.4,
        eval_inner_steps: int | None = None,
    ) -> AdaptationMethod:
        """MAML, first-order MAML or ANIL with K inner SGD steps of size inner_lr."""
        check(settings, inner_steps, inner_lr, eval_inner_steps)
        return AdaptationMethod(
            network(settings), settings["way"], variant, inner_steps, inner_lr,
            eval_inner_steps, amp=settings["amp"],
        )  # fmt: skip

    return build
