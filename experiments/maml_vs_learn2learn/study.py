"""MAML trained by fewshot and by learn2learn on identical seeded episodes: curves and accuracy.

Both arms go through `fewshot train` with the same settings and seed, so they start from the
same weights and see the same training and validation episodes; they differ only in who
computes the meta-gradient: fewshot's engine (`--method maml`, all episodes adapted at once) or
`l2l.algorithms.MAML` (`clone()` and `adapt()` per episode, registered here as the method
`maml_learn2learn`). Both are tested with `fewshot compare` on the same seeded test episodes
(the paired difference and its 95% interval) and their validation curves overlaid with
`fewshot plot`. Needs learn2learn (the `reuse` extra). Resumable: a finished step is skipped.

    python -m experiments.maml_vs_learn2learn.study    # from the repository root
    python -m experiments.maml_vs_learn2learn.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.cli_runs import fewshot
from experiments.ehg_convergence.layout import MAML_SETTING, metrics
from experiments.smoke import add_smoke_flag, apply_smoke
from fewshot.methods import register_method
from fewshot.methods.adaptation import AdaptationMethod
from fewshot.methods.adaptation_builders import adaptation_builder

# --smoke: 2 epochs of one step, a few episodes.
SMOKE = {
    "epochs": 2, "episodes_per_epoch": 2, "episodes_per_batch": 2, "val_episodes": 2,
    "test_episodes": 4,
}  # fmt: skip


class Learn2LearnMAML(AdaptationMethod):
    """fewshot's MAML whose training meta-gradient is learn2learn's, one episode at a time
    (evaluation is fewshot's per-episode adaptation, the same for both arms)."""

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--episodes-per-epoch", type=int, default=160)
    parser.add_argument("--episodes-per-batch", type=int, default=8)
    parser.add_argument("--val-episodes", type=int, default=300)
    parser.add_argument("--test-episodes", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="training seed of both arms")
    parser.add_argument("--test-seed", type=int, default=2024)
    parser.add_argument("--runs", type=Path, default=Path("runs/maml_vs_learn2learn"))
    parser.add_argument("--out", type=Path, default=Path("experiments/maml_vs_learn2learn"))
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    args.out, args.runs = Path(args.out), Path(args.runs)
    args.data_flags = ["--data-root", args.data_root] if args.data_root else []
    return args


def main(argv: list[str] | None = None) -> None:
    """Train both arms (or finish them), compare them on the test episodes, plot their curves."""
    args = parse_args(argv)
    register_method("maml_learn2learn", build_learn2learn_maml)
    shared = [
        "--dataset", "omniglot", "--backbone", "conv4", *MAML_SETTING,
        "--way", "5", "--shot", "1", "--query", "15", "--val-way", "5", "--val-shot", "1",
        "--val-query", "15", "--val-episodes", str(args.val_episodes),
        "--epochs", str(args.epochs), "--episodes-per-epoch", str(args.episodes_per_epoch),
        "--episodes-per-batch", str(args.episodes_per_batch), "--optimizer", "adam",
        "--lr", "0.001", "--weight-decay", "0", "--lr-schedule", "[]", "--amp", "off",
        "--no-channels-last",
        "--seed", str(args.seed), "--device", "cpu", *args.data_flags,
    ]  # fmt: skip
    folders = {}
    for method in ("maml", "maml_learn2learn"):
        folder = folders[method] = args.runs / method
        if any(row["epoch"] == args.epochs for row in metrics(folder)):
            continue
        if (folder / "last.pt").exists():
            fewshot("train", "--resume", str(folder / "last.pt"))
        else:
            fewshot("train", "--method", method, *shared, "--overwrite", "--out", str(folder))
    args.out.mkdir(parents=True, exist_ok=True)
    compared = args.out / "compare.json"
    if not compared.exists():
        test = ["--way", "5", "--shot", "1", "--query", "15", "--amp", "off", "--device", "cpu"]
        test += ["--episodes", str(args.test_episodes), "--seed", str(args.test_seed)]
        test += args.data_flags
        fewshot("compare", str(folders["maml"]), str(folders["maml_learn2learn"]), *test,
                "--out", str(compared))  # fmt: skip
    curves = args.out / "curves.png"
    if not curves.exists():
        fewshot("plot", *map(str, folders.values()), "--labels", "fewshot", "learn2learn",
                "--out", str(curves))  # fmt: skip


if __name__ == "__main__":
    main()
