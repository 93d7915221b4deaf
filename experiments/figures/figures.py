"""The results pages' figures, drawn from result files the studies already wrote (nothing is
trained or evaluated here): the Omniglot reproduction table as a chart, EHG's paired gain per
method, and the validation curves of the shipped Omniglot models.

    python -m experiments.figures.figures          # into experiments/figures/, copied to docs/img/
    python -m experiments.figures.figures --smoke  # the same drawing, into runs/smoke/figures
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.smoke import add_smoke_flag, smoke_folder

EXPERIMENTS = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent
DOCS = EXPERIMENTS.parent / "docs" / "img"  # where docs/results.md finds them
REPRODUCTION = EXPERIMENTS / "omniglot_reproduction" / "results.json"
SHAPES = [(5, 1), (5, 5), (20, 1), (20, 5)]
# Curves of the shipped models: the ProtoNet's log is in the zoo's folder, the others' in the
# reproduction study's logs/.
ZOO_LOG = EXPERIMENTS / "omniglot_zoo" / "{config}.metrics.jsonl"
REPRODUCTION_LOG = EXPERIMENTS / "omniglot_reproduction" / "logs" / "{config}.jsonl"
PNG = {"dpi": 110, "metadata": {"Software": None}}  # no library version in the file


def load(path: Path) -> dict:
    """A JSON file's content."""
    return json.loads(path.read_text())


def reproduction_chart(out: Path) -> Path:
    """Here (accuracy ± 95% CI) against the paper's number, one panel per test shape."""
    rows = load(REPRODUCTION)["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, grid = plt.subplots(2, 2, figsize=(8, 6.2), sharey=True)
    axes = grid.flatten()
    for ax, (way, shot) in zip(axes, SHAPES, strict=True):
        at = {r["method"]: r for r in rows if (r["way"], r["shot"]) == (way, shot)}
        for y, method in enumerate(methods):
            r = at[method]
            if r["shipped"]:
                ax.errorbar(r["accuracy"], y, xerr=r["ci95"], fmt="o", color="C0", capsize=3)
            if r["paper"] is not None:
                ax.plot(r["paper"], y, marker="D", mfc="none", color="C3", linestyle="")
        ax.set_title(f"{way}-way {shot}-shot")
        ax.set_xlabel("accuracy (%)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(methods)), methods)
    axes[0].invert_yaxis()  # the axes share it
    axes[0].plot([], [], "o", color="C0", label="here, ± 95% CI")
    axes[0].plot([], [], "D", mfc="none", color="C3", label="paper")
    fig.legend(loc="lower center", ncol=2, frameon=False)
    fig.suptitle("Omniglot reproduction: 2000 seeded test episodes (no dot: no model yet)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path = out / "reproduction.png"
    fig.savefig(path, **PNG)
    plt.close(fig)
    return path


def budget(record: dict) -> int:
    """The training episodes of every model of an EHG study."""
    return record["settings"]["epochs"] * record["settings"]["episodes_per_epoch"]


def ehg_gains() -> list[tuple[str, str, float, float]]:
    """(label, study, U5 - U1 mean, its t interval) in accuracy points, paired across 5
    training seeds, from the EHG studies' results.json."""
    gains = []
    record = load(EXPERIMENTS / "ehg_seeds" / "results.json")
    seeds, study = record["summary"], f"{budget(record)} episodes (ehg_seeds)"
    for head, name in (("protonet", "ProtoNet"), ("ridge", "ridge"), ("svm", "SVM")):
        for shape, way in (("5w1s", "5-way"), ("20w1s", "20-way")):
            d = seeds[head][shape]["U5-U1 seeds"]
            gains.append((f"{name}, {way}", study, d["mean"], d["ci95"]))
    record = load(EXPERIMENTS / "ehg_convergence" / "results.json")
    plateau, study = record["methods"], f"{budget(record)} episodes, the plateau (ehg_convergence)"
    for method, name in (("protonet", "ProtoNet"), ("ridge", "ridge")):
        for shape, way in (("5w1s", "5-way"), ("20w1s", "20-way")):
            d = plateau[method]["tests"][f"U5-U1 {shape}"]["across_seeds"]
            gains.append((f"{name}, {way}", study, d["mean"], d["ci95"]))
    metric = load(EXPERIMENTS / "metric_omniglot" / "results.json")["ehg"]
    for method, name in (("matching", "Matching Networks"), ("relation", "Relation Networks")):
        d = metric[method]["difference"]  # fractions
        label = f"{name}, 5-way"  # its configs cut to 800 episodes (its README)
        gains.append((label, "800 episodes (metric_omniglot)", 100 * d["mean"], 100 * d["ci95"]))
    record = load(EXPERIMENTS / "ehg_adaptation" / "results.json")
    adaptation, study = record["methods"], f"{budget(record)} episodes (ehg_adaptation)"
    for method, name in (("maml", "MAML"), ("anil", "ANIL")):
        d = adaptation[method]["tests"]["U5-U1 5w1s"]["across_seeds"]
        gains.append((f"{name}, 5-way", study, d["mean"], d["ci95"]))
    return gains


def ehg_chart(out: Path) -> Path:
    """EHG's paired gain (U = 5 against U = 1) per method and study, with its interval."""
    gains = ehg_gains()
    studies = list(dict.fromkeys(g[1] for g in gains))
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(gains) + 1.4))
    for y, (_, study, mean, ci) in enumerate(gains):
        color = f"C{studies.index(study)}"
        ax.errorbar(mean, y, xerr=ci, fmt="o", color=color, capsize=3)
    for i, study in enumerate(studies):
        ax.plot([], [], "o", color=f"C{i}", label=study)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(gains)), [g[0] for g in gains])
    ax.invert_yaxis()
    ax.set_xlabel("U5 − U1 test accuracy, points (mean over 5 seeds ± t interval)")
    ax.set_title("EHG's gain, paired seed by seed (Omniglot, 1-shot test episodes)")
    ax.grid(axis="x", alpha=0.3)
    fig.legend(loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    path = out / "ehg_gain.png"
    fig.savefig(path, **PNG)
    plt.close(fig)
    return path


def zoo_logs() -> dict[str, list[dict]]:
    """The metrics rows of every shipped model of the reproduction table, by config."""
    configs = dict.fromkeys(r["config"] for r in load(REPRODUCTION)["rows"] if r["shipped"])
    logs = {}
    for config in configs:
        path = ZOO_LOG if config == "protonet_conv4_trainval" else REPRODUCTION_LOG
        text = Path(str(path).format(config=config)).read_text()
        logs[config] = [json.loads(line) for line in text.splitlines() if line.strip()]
    return logs


def zoo_chart(out: Path) -> Path:
    """Validation accuracy of the shipped Omniglot models against their training time."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for config, rows in zoo_logs().items():
        hours, total = [], 0.0
        for row in rows:
            total += row["seconds"]
            hours.append(total / 3600)
        ax.plot(hours, [row["val_acc"] for row in rows], marker=".", label=config)
    ax.set_xlabel("training time (hours of a 2-core CPU)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_ylim(80, 100)
    ax.set_title(
        "The shipped Omniglot models: validation accuracy after each epoch (its own episodes)"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    path = out / "zoo_curves.png"
    fig.savefig(path, **PNG)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The driver's flags: --out, --docs and --smoke."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(OUT), help="folder of the figures")
    parser.add_argument("--docs", default=str(DOCS), help="the site's copy (smoke: OUT/docs)")
    add_smoke_flag(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = smoke_folder(args.out) if args.smoke else Path(args.out)
    docs = out / "docs" if args.smoke else Path(args.docs)
    out.mkdir(parents=True, exist_ok=True)
    docs.mkdir(parents=True, exist_ok=True)
    for draw in (reproduction_chart, ehg_chart, zoo_chart):
        path = draw(out)
        shutil.copyfile(path, docs / path.name)
        print(f"{path} (and {docs / path.name})")


if __name__ == "__main__":
    main()
