"""The registry builders of the MAML family: their settings checked, `AdaptationMethod` built."""

from __future__ import annotations

from torch import nn

from fewshot.backbones import build_backbone
from fewshot.methods.adaptation import AdaptationMethod
from fewshot.methods.batching import check_batching
from fewshot.methods.maml_family import check_inner_loop
from fewshot.runtime.settings import SettingError


def adaptation_builder(variant: str):
    """The registry builder of one variant; its keyword options are the method's settings."""

    def check(
        settings: dict, inner_steps: int, inner_lr: float, eval_inner_steps, batching: str
    ) -> None:
        """The settings this method cannot run with, refused before any data is read."""
        try:
            check_batching(batching)
        except ValueError as e:
            raise SettingError("method_options", str(e)) from None
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
            batching: str = "auto",
            solver_proximal: float | None = None,
            inner_loop: str = "proximal",
        ) -> AdaptationMethod:
            """iMAML: K steps on the support loss + proximal/2 |theta - init|^2, AID-CG;
            `batching` as in `fewshot.methods.batching`. The meta-gradient solves
            (I + H / solver_proximal) x = grad L_query with `solver_steps` CG steps, H the
            support loss's Hessian at the adapted weights; solver_proximal defaults to
            proximal (the paper's formula). A larger one damps the system: the iMAML authors'
            code (imaml_dev) solves (2 I + H / (lambda + 10)) x = g, i.e. solver_proximal
            = 2 (proximal + 10) = 24 at lambda = 2, with which its Omniglot results were run.
            Undamped, the system is far from positive definite on a freshly initialised Conv-4
            (support-Hessian eigenvalues of -95 to +95 in the BatchNorm-normalised conv weights,
            lambda 2) and its CG solution is no descent direction: the model does not learn
            (experiments/omniglot_zoo/README.md). `inner_loop` (INNER_LOOPS): the paper's
            steps on the proximal problem, or its authors' code's (pull_back)."""
            check(settings, inner_steps, inner_lr, eval_inner_steps, batching)
            if not proximal > 0:
                raise SettingError("method_options", f"proximal must be > 0, got {proximal}")
            if solver_steps < 1:
                raise SettingError(
                    "method_options", f"solver_steps must be >= 1, got {solver_steps}"
                )
            if solver_proximal is not None and not solver_proximal > 0:
                raise SettingError(
                    "method_options", f"solver_proximal must be > 0, got {solver_proximal}"
                )
            try:
                check_inner_loop(inner_loop)
            except ValueError as e:
                raise SettingError("method_options", str(e)) from None
            return AdaptationMethod(
                network(settings), settings["way"], variant, inner_steps, inner_lr,
                eval_inner_steps, proximal, solver_steps, settings["amp"], batching,
                solver_proximal, inner_loop,
            )  # fmt: skip

        return build_imaml

    def build(
        settings: dict,
        *,
        inner_steps: int = 1,
        inner_lr: float = 0.4,
        eval_inner_steps: int | None = None,
        batching: str = "auto",
    ) -> AdaptationMethod:
        """MAML, first-order MAML or ANIL with K inner SGD steps of size inner_lr; `batching`
        as in `fewshot.methods.batching`."""
        check(settings, inner_steps, inner_lr, eval_inner_steps, batching)
        return AdaptationMethod(
            network(settings), settings["way"], variant, inner_steps, inner_lr,
            eval_inner_steps, amp=settings["amp"], batching=batching,
        )  # fmt: skip

    return build
