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
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.smoke import add_smoke_flag, smoke_folder

EXPERIMENTS = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent
DOCS = EXPERIMENTS.parent / "docs" / "img"  # where docs/results.md finds them
PAPERS = EXPERIMENTS / "omniglot_reproduction" / "papers.yaml"  # methods, their papers' numbers
STORED = EXPERIMENTS.parent / "models" / "bench" / "omniglot-v1"  # the zoo's stored results
SHAPES = [(5, 1), (5, 5), (20, 1), (20, 5)]
# Curves of the shipped models: the ProtoNet's log is in the zoo's folder, the others' in the
# reproduction study's logs/.
ZOO_LOG = EXPERIMENTS / "omniglot_zoo" / "{config}.metrics.jsonl"
REPRODUCTION_LOG = EXPERIMENTS / "omniglot_reproduction" / "logs" / "{config}.jsonl"
PNG = {"dpi": 110, "metadata": {"Software": None}}  # no library version in the file


def load(path: Path) -> dict:
    """A JSON file's content."""
    return json.loads(path.read_text())


def reproduction() -> tuple[dict, dict]:
    """The papers' numbers by method, and the zoo's stored result of each (method, cell)."""
    papers = yaml.safe_load(PAPERS.read_text())
    stored = {}
    for path in sorted(STORED.glob("*/*.json")):
        record = load(path)
        stored[record["name"], record["cell"]] = record
    return papers, stored


def reproduction_chart(out: Path) -> Path:
    """Here (accuracy ± 95% CI) against the paper's number, one panel per test shape."""
    papers, stored = reproduction()
    methods = list(papers)
    fig, grid = plt.subplots(2, 2, figsize=(8, 6.2), sharey=True)
    axes = grid.flatten()
    for ax, (way, shot) in zip(axes, SHAPES, strict=True):
        cell = f"{way}w{shot}s"
        for y, method in enumerate(methods):
            here = stored.get((method, cell))
            if here is not None:
                ax.errorbar(here["accuracy"], y, xerr=here["ci95"], fmt="o", color="C0", capsize=3)
            if papers[method][cell] is not None:
                ax.plot(papers[method][cell], y, marker="D", mfc="none", color="C3", linestyle="")
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


# The EHG studies (sweep specs) and each one's training episodes per run, from their READMEs.
EHG_STUDIES = {
    "ehg_seeds": "400 episodes",
    "ehg_convergence": "4000 episodes, the plateau",
    "metric_omniglot": "800 episodes",
    "ehg_adaptation": "800 episodes",
}
NAMES = {"protonet": "ProtoNet", "svm": "SVM", "matching": "Matching Networks"}
NAMES |= {"relation": "Relation Networks", "maml": "MAML", "anil": "ANIL"}


def ehg_gains() -> list[tuple[str, str, float, float]]:
    """(label, study, U5 - U1 mean, its t interval) in accuracy points, paired across 5
    training seeds, from the EHG studies' sweep reports."""
    gains = []
    for study, budget in EHG_STUDIES.items():
        for c in load(EXPERIMENTS / study / "report.json")["comparisons"]:
            if (c["a"], c["b"]) == ("resplits=1", "resplits=5"):
                method = c["group"][0].split("=")[1]
                label = f"{NAMES.get(method, method)}, {c['cell'].split('w')[0]}-way"
                gains.append((label, f"{budget} ({study})", c["difference"], c["difference_ci95"]))
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
    papers, stored = reproduction()
    cells = [f"{way}w{shot}s" for way, shot in SHAPES]
    shipped = [stored[m, c] for m in papers for c in cells if (m, c) in stored]
    configs = dict.fromkeys(Path(record["checkpoint"]).stem for record in shipped)
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
