"""Methods that adapt parameters to every episode by gradient steps on its support set: MAML,
first-order MAML, ANIL and iMAML.

Their meta-gradients come from the hypergradient engine (`fewshot.hpo.hypergrad`) with the
initialisation as the outer variable: MAML is RHG through the K inner steps, first-order MAML
is RHG without the second-order terms, ANIL is MAML on the linear classifier over embeddings
computed once per episode, iMAML is AID-CG on the proximally regularised inner problem (its
steps on that problem, the paper's, or on the support loss alone then one step back towards
the initialisation, its authors' code's: the `inner_loop` option).

All U*B problems of a step (B episodes, U re-splits each) adapt together: the adapted
parameters carry a leading problem axis and `functional_call` runs per problem, under
`torch.func.vmap` or in a loop, the episodes in chunks side by side in threads or not
(`fewshot.methods.batching`: the `batching` option, resolved per device). BatchNorm always
normalises with the statistics of the batch it sees, per problem (transductive, as in MAML and
learn2learn): the network keeps no running statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, replace_all_batch_norm_modules_, vmap

from fewshot.backbones.conv4 import Conv4
from fewshot.backbones.footprint import activation_elements
from fewshot.hpo.hypergrad import Bilevel, aid_cg, rhg
from fewshot.hpo.trees import Tree, tree_detach, tree_flatten, tree_map
from fewshot.methods.base import Method, check_episodes, class_labels, describe_scales
from fewshot.methods.batching import (
    check_batching,
    chunk_count,
    concurrently,
    replica,
    resolve_batching,
)
from fewshot.methods.maml_family import (
    USUAL_INNER,
    VARIANTS,
    Network,
    check_inner_loop,
    split_problems,
)
from fewshot.methods.resplit import Shot, embed_varied, query_accuracy
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.precision import autocast_dtype, precision_name


@dataclass(frozen=True)
class _Part:
    """One chunk of episodes' share of a training step: its meta-gradient as (tensor, gradient)
    pairs, its mean query loss, the query accuracy of its problems [U, b] and whether its
    support loss was finite at the initialisation."""

    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    outer_loss: float
    accuracy: torch.Tensor
    start_finite: torch.Tensor


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
        batching: str = "auto",
        solver_proximal: float | None = None,
        inner_loop: str = "proximal",
    ):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        check_inner_loop(inner_loop)
        check_batching(batching)
        replace_all_batch_norm_modules_(backbone)  # batch statistics always (transductive)
        self.network = Network(backbone, way)
        self.way, self.variant, self.amp = way, variant, amp
        self.inner_steps, self.inner_lr, self.proximal = inner_steps, inner_lr, proximal
        self.eval_inner_steps = inner_steps if eval_inner_steps is None else eval_inner_steps
        self.solver_steps, self.batching = solver_steps, batching
        # iMAML's meta-gradient is (I + H / solver_proximal)^-1 grad L_query: the paper's
        # lambda = proximal unless damped (see build_imaml).
        self.solver_proximal = proximal if solver_proximal is None else solver_proximal
        self.inner_loop = inner_loop
        # Whether the last training step's support loss was finite at the initialisation.
        self.start_finite: torch.Tensor | bool = True

    @property
    def backbone(self) -> nn.Module:
        """The network's backbone (what `predict` checks images against)."""
        return self.network.backbone

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

    def _logits(
        self, module: nn.Module, vmapped: bool, theta: dict, inputs: torch.Tensor
    ) -> torch.Tensor:
        """Float32 logits [E, n, way] of each problem's inputs [E, n, ...] under its theta, by
        `module` (the adapted one, or a replica of it), under vmap or one problem at a time."""

        def one(weights: dict, x: torch.Tensor) -> torch.Tensor:
            return functional_call(module, weights, (x,))

        def per_problem(x: torch.Tensor) -> torch.Tensor:
            if vmapped:
                return vmap(one)(theta, x)
            weights = zip(*(value.unbind() for value in theta.values()), strict=True)
            return torch.stack(
                [one(dict(zip(theta, w, strict=True)), e) for w, e in zip(weights, x, strict=True)]
            )

        return self._run(per_problem, inputs)

    def _problem(
        self, problems: int, record: dict, module: nn.Module, vmapped: bool, proximal: bool = True
    ) -> Bilevel:
        """The bilevel problem of `problems` episodes: the inner loss is the sum of their
        support losses (each problem's gradient is its own; iMAML's with its proximal term
        unless `proximal` is False), the outer their mean query loss.
        `record["accuracy"]` gets the query accuracy of each problem at the adapted weights,
        `record["logits"]` their logits.
        `module` and `vmapped` as in `_logits`."""

        def data(lam: Tree, batch: tuple, key: str) -> tuple[torch.Tensor, torch.Tensor]:
            inputs, labels = batch
            return (lam[key] if inputs is None else inputs), labels  # ANIL: differentiable

        def inner(theta: dict, lam: dict, batch: tuple) -> torch.Tensor:
            inputs, labels = data(lam, batch, "support")
            logits = self._logits(module, vmapped, theta, inputs)
            loss = F.cross_entropy(
                logits.flatten(0, 1), labels.repeat(problems), reduction="sum"
            ) / len(labels)
            if self.variant == "imaml" and proximal:
                for name, value in theta.items():
                    loss = loss + self.proximal / 2 * ((value - lam["init"][name]) ** 2).sum()
            record.setdefault("start_loss", loss.detach())  # at the initialisation
            return loss

        def outer(theta: dict, lam: dict, batch: tuple) -> torch.Tensor:
            inputs, labels = data(lam, batch, "query")
            logits = self._logits(module, vmapped, theta, inputs)
            record["logits"] = logits.detach()
            record["accuracy"] = query_accuracy(record["logits"], labels)
            return F.cross_entropy(logits.flatten(0, 1), labels.repeat(problems))

        return Bilevel(inner, outer, self.inner_lr)

    def _inputs(self, images: torch.Tensor, shot: Shot) -> torch.Tensor:
        """What the problems adapt on: the images (`split_problems` takes a varied episode's real
        ones, so the network never sees its padding), or for ANIL the embeddings
        [B, way, pool, d] of each episode's pool in one backbone pass (its BatchNorm
        statistics, as learn2learn's ANIL; a varied episode's real images alone), shared by the
        episode's U re-splits. In the calling thread (so that a backbone drawing random numbers,
        DropBlock, draws them in one order) unless `_embeds_in_threads`."""
        if self.variant != "anil":
            return images
        if not isinstance(shot, int):
            return embed_varied(lambda x: self._run(self.network.backbone, x), images, shot)
        # A loop: on a CPU, 1.8-2.4x faster than vmap or one pass over the whole batch
        # (measured on Conv-4, 32 episodes).
        b, way, pool = images.shape[:3]
        backbone = self.network.backbone
        features = self._run(lambda x: torch.stack([backbone(e) for e in x]), images.flatten(1, 2))
        return features.view(b, way, pool, -1)

    def _episodes(self, inputs: torch.Tensor, resplits: torch.Tensor | None, shot: Shot):
        """lam (the initialisation, and ANIL's embeddings), the train and validation data of
        the problems of `inputs` (see `_inputs`)."""
        lam: dict = {"init": dict(self.adapted().named_parameters())}
        support, query, ys, yq = split_problems(inputs, resplits, shot)
        if self.variant == "anil":  # differentiable: the meta-gradient reaches the backbone
            lam.update(support=support, query=query)
            return lam, (None, ys), (None, yq), len(support)
        return lam, (support, ys), (query, yq), len(support)

    @staticmethod
    def _start(problems: int):
        """theta0 as a function of lam: the initialisation, one copy per problem."""
        return lambda lam: {k: v.expand(problems, *v.shape) for k, v in lam["init"].items()}

    def _adapted_weights(
        self,
        problems: int,
        record: dict,
        module: nn.Module,
        vmapped: bool,
        lam: Tree,
        train: tuple,
        steps: int,
        training: bool,
    ) -> dict:
        """The weights (detached) that `steps` inner steps adapt from the initialisation
        (`_problem`'s arguments first): for iMAML with `inner_loop` pull_back, steps on the
        support loss alone, then in `training` one step on the proximal term, theta - lr
        lambda (theta - init)."""
        pull_back = self.variant == "imaml" and self.inner_loop == "pull_back"
        problem = self._problem(problems, record, module, vmapped, proximal=not pull_back)
        theta = problem.descend(self._start(problems), lam, train, steps)
        if not (pull_back and training):
            return theta
        pull = self.inner_lr * self.proximal
        return {k: v - pull * (v - lam["init"][k].detach()) for k, v in theta.items()}

    def _module(self, threaded: bool) -> nn.Module:
        """The adapted module, or in a thread of its own a replica of it."""
        return replica(self.adapted()) if threaded else self.adapted()

    def _chunks(
        self, images: torch.Tensor, resplits: torch.Tensor | None, shot: Shot
    ) -> tuple[str, list[torch.Tensor], list[torch.Tensor | None]]:
        """The `batching` resolved on the images' device, and the episodes' inputs (`_inputs`;
        their images where `_embeds_in_threads`) and re-splits in as many chunks as it runs
        side by side (one for a varied episode, B = 1: every batching takes it, threads as the
        loop)."""
        batching = resolve_batching(self.batching, images.device.type)
        count = chunk_count(batching, len(images))
        chunks = list(images.tensor_split(count))
        if not self._embeds_in_threads(count > 1):
            # Each chunk's own pass: its autograd graph shares nothing with another thread's.
            chunks = [self._inputs(chunk, shot) for chunk in chunks]
        splits = [None] * count if resplits is None else list(resplits.tensor_split(count, 1))
        return batching, chunks, splits

    def _embeds_in_threads(self, threaded: bool) -> bool:
        """Whether ANIL's chunks, run in threads, embed their images each in its own thread
        (the backbone's forward then runs on every core, not on one): only for a backbone
        whose forward draws no random numbers and counts nothing (Conv-4), so that the order
        in which the threads run it changes nothing."""
        return threaded and self.variant == "anil" and isinstance(self.network.backbone, Conv4)

    def _meta_gradient(
        self,
        inputs: torch.Tensor,
        resplits: torch.Tensor | None,
        shot: Shot,
        batching: str,
        threaded: bool,
    ) -> _Part:
        """The meta-gradient of one chunk's problems. `threaded`: in a thread of its own, with
        its own replica of the adapted module, and ANIL's embedding gradients carried into the
        backbone here (the caller's backward would run every chunk's in one thread), its images
        embedded here too where `_embeds_in_threads`."""
        if self._embeds_in_threads(threaded):
            inputs = self._inputs(inputs, shot)
        lam, train, val, problems = self._episodes(inputs, resplits, shot)
        record: dict = {}
        module, vmapped = self._module(threaded), batching == "vmap"
        problem = self._problem(problems, record, module, vmapped)
        if self.variant == "imaml":
            # Adapted first, so aid_cg takes no step: its system is the proximal problem's at
            # the adapted weights, whichever loop reached them.
            steps = self.inner_steps
            theta = self._adapted_weights(
                problems, record, module, vmapped, lam, train, steps, True
            )
            mu, damping = self.solver_proximal, self.solver_proximal - self.proximal
            result = aid_cg(
                problem, theta, lam, train, val, 0, self.solver_steps, per_problem=True,
                damping=damping,
            )  # fmt: skip
            if damping:  # proximal (H + mu I)^-1 g, rescaled to (I + H / mu)^-1 g
                grad = tree_map(lambda g: g * (mu / self.proximal), result.grad)
                result = replace(result, grad=grad)
        else:
            first_order = self.variant == "fomaml"
            start = self._start(problems)
            result = rhg(problem, start, lam, train, val, self.inner_steps, first_order=first_order)
        leaves = zip(tree_flatten(lam)[0], tree_flatten(result.grad)[0], strict=True)
        pairs = [(x, g) for x, g in leaves if x.requires_grad]
        if threaded and self.variant == "anil":
            params = [p for p in self.parameters() if p.requires_grad]
            xs, gs = zip(*pairs, strict=True)
            grads = torch.autograd.grad(xs, params, gs, allow_unused=True)
            pairs = [(p, g) for p, g in zip(params, grads, strict=True) if g is not None]
        u = 1 if resplits is None else len(resplits)
        finite = torch.isfinite(record["start_loss"])
        return _Part(pairs, result.outer_loss, record["accuracy"].view(u, -1), finite)

    def forward(
        self, images: torch.Tensor, resplits: torch.Tensor | None, shot: Shot
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A loss whose gradient is the meta-gradient of the mean query loss of the U*B
        problems (its value is that loss), and the query accuracy of each problem."""
        self.check_way(images.shape[1])  # varied episodes draw their way: one line, not a crash
        batching, inputs, splits = self._chunks(images, resplits, shot)
        threaded = len(inputs) > 1

        def part(i: int) -> _Part:
            return self._meta_gradient(inputs[i], splits[i], shot, batching, threaded)

        parts = concurrently(part, len(inputs))
        # Read only if the step diverges (no synchronisation here).
        self.start_finite = torch.stack([p.start_finite for p in parts]).all()
        # The chunks' meta-gradients weighted by their share of the problems, one term per
        # tensor, in chunk order (the same sums every run).
        weights = [len(x) / len(images) for x in inputs]
        terms: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for weight, p in zip(weights, parts, strict=True):
            for x, g in p.pairs:
                before = terms[id(x)][1] if id(x) in terms else 0
                terms[id(x)] = (x, before + weight * g)
        # Linear in the parameters (and ANIL's embeddings): backward() puts the meta-gradient
        # in .grad (through the embeddings into the backbone unless a chunk did that already),
        # scaled like any loss by AMP.
        surrogate = sum((x * g).sum() for x, g in terms.values())
        outer = sum(w * p.outer_loss for w, p in zip(weights, parts, strict=True))
        loss = surrogate - surrogate.detach() + outer
        return loss, torch.cat([p.accuracy for p in parts], 1).flatten()

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
        sound, the steps from it were not), else the meta-training. The inner adaptation's
        message names every setting that scales it with its value, and the one at fault where
        that is known: a value outside its usual range, or iMAML's inner_lr x proximal >= 2
        (the support loss is convex in the classifier, so the inner Hessian has an eigenvalue
        >= proximal, along which every step then grows the distance to the minimum)."""
        if not bool(self.start_finite):
            return super().divergence_advice()
        values = {"inner_lr": self.inner_lr, "inner_steps": self.inner_steps}
        if self.variant == "imaml":
            values["proximal"] = self.proximal
        scales, unusual = describe_scales("--method-options", values, USUAL_INNER)
        faults = [f"lower {' or '.join(unusual)}"] if unusual else []
        product = self.inner_lr * self.proximal
        if self.variant == "imaml" and product >= 2:
            faults.append(
                f"inner_lr x proximal = {product:g} must be below 2 for the inner steps to converge"
            )
        advice = "; ".join(faults) or "lower one of them"
        return f"the inner adaptation diverged; its scale is set by {scales}: {advice}"

    def accuracy(self, images: torch.Tensor, shot: Shot) -> torch.Tensor:
        """Query accuracy of each test episode after `eval_inner_steps` steps on its support."""
        check_episodes("AdaptationMethod.accuracy", images, shot, self.network.backbone)
        self.check_way(images.shape[1])
        with torch.no_grad():
            batching, inputs, _ = self._chunks(images, None, shot)
        threaded = len(inputs) > 1

        def part(i: int) -> torch.Tensor:
            chunk = inputs[i]
            if self._embeds_in_threads(threaded):
                with torch.no_grad():
                    chunk = self._inputs(chunk, shot)
            lam, train, val, problems = self._episodes(chunk, None, shot)
            lam = tree_detach(lam)
            record: dict = {}
            module, vmapped = self._module(threaded), batching == "vmap"
            steps = self.eval_inner_steps
            theta = self._adapted_weights(
                problems, record, module, vmapped, lam, train, steps, False
            )
            with torch.no_grad():
                self._problem(problems, record, module, vmapped).outer_loss(theta, lam, val)
            self._check_scores(record["logits"], chunk, self.variant == "anil")
            return record["accuracy"]

        return torch.cat(concurrently(part, len(inputs)))

    # predict's BatchNorm: the statistics of all the queries at once (True, as in training and
    # the MAML paper), or of the support and one query (False, Nichol et al. 2018).
    transductive = True

    def scores(
        self,
        support: torch.Tensor,
        shots: list[int],
        query: torch.Tensor,
        batch: int,
        episode: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Adapt to the support ([N, C, H, W] in class order, `shots[c]` of class c;
        `eval_inner_steps` steps), then classify
        the queries: all in one batch when `transductive` (as the episodes of training and
        evaluation; ANIL embeds support and queries in one pass, as it trains), else each in
        one batch with the support images alone, so that its probabilities do not depend on the
        other queries (`batch` such batches per vmap call)."""
        flat, labels = support, class_labels(shots, support.device)
        module, anil = self.adapted(), self.variant == "anil"
        if anil and self.transductive:
            features = self._run(self.backbone, torch.cat([flat, query]))
            inputs, query = features[: len(flat)], features[len(flat) :]
        else:
            inputs = self._run(self.backbone, flat) if anil else flat
        lam = tree_detach({"init": dict(module.named_parameters())})
        with torch.enable_grad():
            train, steps = (inputs[None], labels), self.eval_inner_steps
            theta = self._adapted_weights(1, {}, module, False, lam, train, steps, False)
        weights = {name: value[0] for name, value in theta.items()}
        if self.transductive:
            logits = self._run(lambda x: functional_call(module, weights, (x,)), query)
            self._check_scores(logits, query, anil)
            return torch.softmax(logits.float(), dim=-1)

        def with_support(x: torch.Tensor) -> torch.Tensor:
            """Logits of the last of the images [ns + 1, C, H, W] (a query after the support)."""
            if anil:
                return functional_call(module, weights, (self.backbone(x)[-1:],))[0]
            return functional_call(module, weights, (x,))[-1]

        logits = []
        for chunk in query.split(batch):
            batches = torch.cat([flat.expand(len(chunk), *flat.shape), chunk[:, None]], dim=1)
            logits.append(self._run(vmap(with_support), batches))
            self._check_scores(logits[-1], chunk, False)
        return torch.softmax(torch.cat(logits).float(), dim=-1)

    def _check_scores(self, logits: torch.Tensor, inputs: torch.Tensor, embedded: bool) -> None:
        """`check_scores` of test logits from `inputs`: images [..., C, H, W], or features
        [..., d] if `embedded` (ANIL's); when their scale is not the cause, the inner
        adaptation is (and the autocast's range, where the network runs in one)."""

        def features() -> torch.Tensor:
            if embedded:
                return inputs
            with torch.no_grad():
                return self._run(self.backbone, inputs.reshape(-1, *inputs.shape[-3:]))

        precision = precision_name(self.amp, logits.device.type)
        amp = "" if precision == "float32" else f", or --amp off: it adapts in {precision}"
        diverged = f"the inner adaptation diverged on them (fewer --inner-steps{amp})"
        self.check_scores(logits, features, diverged)
