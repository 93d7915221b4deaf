"""fewshot with MAML trained by learn2learn: the method `maml_learn2learn`, `--method maml`'s
network and options with the training meta-gradient of `l2l.algorithms.MAML` (`clone()` and
`adapt()` per episode) in place of fewshot's; its evaluation is fewshot's. Any fewshot command,
with the method registered (a run trained with it is read with it too; needs learn2learn:
pip install -e .[reuse]):

    python -m experiments.maml_vs_learn2learn.l2l_maml train --method maml_learn2learn ...
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from fewshot.cli.main import main as fewshot_main
from fewshot.methods import register_method
from fewshot.methods.adaptation import AdaptationMethod
from fewshot.methods.adaptation_builders import adaptation_builder


class Learn2LearnMAML(AdaptationMethod):
    """fewshot's MAML whose training meta-gradient is learn2learn's, one episode at a time."""

    def forward(self, images, resplits, shot):
        """Mean query loss after each episode's adaptation by learn2learn, and its accuracies."""
        import learn2learn as l2l

        if resplits is not None:
            raise ValueError("the learn2learn arm trains without EHG (--resplits 1)")
        learner = l2l.algorithms.MAML(self.network, lr=self.inner_lr)
        way, pool = images.shape[1:3]
        support_labels = torch.arange(way).repeat_interleave(shot)
        query_labels = torch.arange(way).repeat_interleave(pool - shot)
        losses, accuracies = [], []
        for episode in images:
            clone = learner.clone()
            for _ in range(self.inner_steps):
                support = clone(episode[:, :shot].flatten(0, 1))
                clone.adapt(F.cross_entropy(support, support_labels))
            logits = clone(episode[:, shot:].flatten(0, 1))
            losses.append(F.cross_entropy(logits, query_labels))
            accuracies.append((logits.argmax(-1) == query_labels).float().mean().detach())
        return torch.stack(losses).mean(), torch.stack(accuracies)


def build_learn2learn_maml(
    settings: dict, *, inner_steps: int = 1, inner_lr: float = 0.4, eval_inner_steps: int = 3
) -> Learn2LearnMAML:
    """fewshot's MAML with its options checked as for `--method maml`, trained by learn2learn."""
    options = {"inner_steps": inner_steps, "inner_lr": inner_lr}
    method = adaptation_builder("maml")(settings, **options, eval_inner_steps=eval_inner_steps)
    method.__class__ = Learn2LearnMAML  # same modules and parameters, another forward
    return method


def main(argv: list[str] | None = None) -> int:
    """Run the fewshot command `argv` (default: the command line) with the method registered."""
    register_method("maml_learn2learn", build_learn2learn_maml)
    return fewshot_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
