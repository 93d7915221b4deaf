"""Relation Networks on the Omniglot split of its authors' code against the Vinyals split.

The Relation Networks authors' code (LearningToCompare_FSL, omniglot/task_generator.py) splits
Omniglot's 1623 characters at random, 1200 to train on and 423 to test, so nearly every test
character's alphabet is one it trained on; the Vinyals split this library tests every row on
keeps 12 of its 13 test alphabets out of training. This driver makes a random character split
of the same sizes (seeded: the authors' own order depends on their file listing), writes it as
a data root beside the repository's drawings, trains the shipped 5-way 1-shot config
(`models/omniglot/relation_conv4_5way1shot.json`) on its 1200 characters, and tests the model
on 2000 seeded episodes of its 423 (rotations as classes, 15 queries, float32, as every row of
the reproduction table; again with each episode's own BatchNorm statistics, as the authors'
code tests). The shipped model, trained the same way on the Vinyals split, is tested beside it
on the Vinyals test classes. Different test classes: the two are compared by their own
intervals, not paired.

Resumable like every study driver here (experiments/cli_runs.py). Writes results.md and
results.json into this folder (--out).

    python -m experiments.relation_character_split.study    # from the repository root
    python -m experiments.relation_character_split.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path

from experiments.cli_runs import (
    config_overrides,
    evaluate,
    markdown_header,
    markdown_row,
    percent,
    train,
    write_results,
)
from experiments.smoke import add_study_flags, apply_smoke
from fewshot.datasets import resolve_data_root
from fewshot.evaluation.stats import ci95
from fewshot.runtime.io import atomic_write_text, file_sha256, load_checkpoint

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONFIG = REPO / "models" / "omniglot" / "relation_conv4_5way1shot.json"
SHIPPED = REPO / "models" / "omniglot" / "relation_conv4_5way1shot.pt"
# The authors' sizes: 1200 of the 1623 characters to train on; here the last 172 of those
# (the Vinyals validation size) track progress, as the Vinyals val split does for the config.
TEST_SHARE, VAL_SHARE = 423 / 1623, 172 / 1200
ROTATIONS = ("rot000", "rot090", "rot180", "rot270")
# BatchNorm with the statistics learned in training, as every row of the table, and with each
# episode's own, as the authors' code tests (../batch_norm_protocol/).
TESTS = (
    ("test", [], ".json"),
    ("test_transductive", ["--batch-norm", "transductive"], ".transductive.json"),
)
SMOKE = {"epochs": 1, "episodes_per_epoch": 4, "val_episodes": 2, "episodes": 2}


def character_split(source: Path, target: Path, seed: int) -> None:
    """A data root `target` with Omniglot's drawings linked from `source` and split lists of a
    random character split (each character with its four rotations as classes, as the Vinyals
    lists are written)."""
    with open(source / "omniglot" / "omniglot_index.csv", newline="") as f:
        characters = sorted({(r["alphabet"], r["character"]) for r in csv.DictReader(f)})
    random.Random(seed).shuffle(characters)
    test_count = max(2, round(TEST_SHARE * len(characters)))
    trainval, test = characters[: len(characters) - test_count], characters[-test_count:]
    val_count = max(2, round(VAL_SHARE * len(trainval)))
    lists = {
        "train": trainval[: len(trainval) - val_count],
        "val": trainval[-val_count:],
        "trainval": trainval,
        "test": test,
    }
    # The reader takes its lists from splits/vinyals/: here they hold the random split.
    folder = target / "omniglot"
    (folder / "splits" / "vinyals").mkdir(parents=True, exist_ok=True)
    for name in ("omniglot_index.csv", "images_background.npz", "images_evaluation.npz"):
        link = folder / name
        if not link.exists() and (source / "omniglot" / name).exists():
            link.symlink_to((source / "omniglot" / name).resolve())
    for split, chars in lists.items():
        names = [f"{a}/{c}/{rot}" for a, c in chars for rot in ROTATIONS]
        atomic_write_text("\n".join(names) + "\n", folder / "splits" / "vinyals" / f"{split}.txt")


def split_figures(root: Path) -> dict:
    """The sizes of the Omniglot split lists of data root `root` and how many test characters
    belong to an alphabet trained on."""
    lists = root / "omniglot" / "splits" / "vinyals"

    def characters(split: str) -> set[tuple[str, ...]]:
        return {tuple(name.split("/")[:2]) for name in (lists / f"{split}.txt").read_text().split()}

    trainval, test = characters("trainval"), characters("test")
    seen = {a for a, _ in trainval}
    return {
        "train_characters": len(trainval),
        "test_characters": len(test),
        "test_alphabets": len({a for a, _ in test}),
        "test_characters_of_seen_alphabets": sum(a in seen for a, _ in test),
    }


def main(argv: list[str] | None = None) -> None:
    """Write the split, train on it, evaluate both models, write the table."""
    args = parse_args(argv)
    source = resolve_data_root(args.data_root)
    out = Path(args.out)
    evals = out / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    split_root = Path(args.runs) / "relation_character_split" / "data"
    character_split(source, split_root, args.seed)
    run = f"{args.runs}/relation_character_split/run"
    epochs = args.epochs or json.loads(CONFIG.read_text())["epochs"]
    sizes = {k: getattr(args, k) for k in ("epochs", "episodes_per_epoch", "val_episodes")}
    train("train", str(CONFIG), run, epochs, *config_overrides(str(split_root), **sizes))
    history = load_checkpoint(Path(run) / "last.pt")["progress"]["history"]
    # Tested in float32 on every machine, as the reproduction table.
    arms = (
        ("random characters", f"{run}/last.pt", str(split_root), split_figures(split_root)),
        ("Vinyals", str(SHIPPED.relative_to(REPO)), args.data_root, split_figures(source)),
    )
    results: dict = {"episodes": args.episodes, "arms": []}
    for name, checkpoint, root, figures in arms:
        flags = [*config_overrides(root), "--amp", "off"]
        # Named by the checkpoint's hash: a model shipped later is tested anew.
        cached = f"{name.split()[0].lower()}.{file_sha256(checkpoint)[:12]}.5w1s"
        arm = {"split": name, "checkpoint": checkpoint, **figures}
        for key, extra, suffix in TESTS:
            acc = evaluate(
                checkpoint, flags + extra, 5, 1, args.episodes, evals / (cached + suffix)
            )
            arm[key] = [float(acc.double().mean()), ci95(acc)]
        results["arms"].append(arm)
    results["arms"][0] |= {
        "seed": args.seed,
        "val_acc": [row["val_acc"] for row in history],
        "seconds": sum(row["seconds"] for row in history),
    }
    write_results(results, table(results), out)


def table(results: dict) -> str:
    """The markdown table of results.json."""
    columns = (
        "split", "characters train / test", "test alphabets",
        "test characters of alphabets trained on", "test", "test, each episode's BatchNorm "
        "statistics", "model",
    )  # fmt: skip
    lines = [
        f"Relation Networks, Omniglot 5-way 1-shot, `{CONFIG.name}` trained on each split's "
        f"training characters, tested on {results['episodes']} seeded episodes of its test "
        "characters (rotations as classes, 15 queries per class, float32): accuracy ± 95% CI (%).",
        "",
        *markdown_header(*columns),
    ]
    for arm in results["arms"]:
        lines.append(
            markdown_row(
                arm["split"],
                f"{arm['train_characters']} / {arm['test_characters']}",
                str(arm["test_alphabets"]),
                str(arm["test_characters_of_seen_alphabets"]),
                percent(*arm["test"]),
                percent(*arm["test_transductive"]),
                f"`{arm['checkpoint']}`",
            )
        )
    first = results["arms"][0]
    curve = " / ".join(f"{v:.1f}" for v in first["val_acc"])
    lines += [
        "",
        f"Random-split model: validation accuracy per epoch {curve}; "
        f"{first['seconds'] / 60:.0f} minutes of training steps.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="of the random character split")
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per model")
    parser.add_argument("--epochs", type=int, help="of the run (default: the config's)")
    parser.add_argument("--episodes-per-epoch", type=int, help="(default: the config's)")
    parser.add_argument("--val-episodes", type=int, help="(default: the config's)")
    add_study_flags(parser, HERE)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    return args


if __name__ == "__main__":
    main()
