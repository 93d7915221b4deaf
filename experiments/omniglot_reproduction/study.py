"""The Omniglot reproduction table: every shipped model against its paper's number.

Each row is a shipped checkpoint `models/omniglot/<config>.pt` tested on 2000 seeded episodes
of the Vinyals test classes (seed 0, 15 queries per class) at one shape, beside the paper's
number, with the episodes it trained on, its training time and the command that reproduces
it. `--train CONFIG` first trains `models/omniglot/CONFIG.json` to its end in `--runs`
(resuming a run folder that is there) and ships its last checkpoint as weights, settings and
training history (under 1 MB for a Conv-4), the log in `logs/`; `--ship CONFIG` ships a run as
far as it has come (the table then says how many of its epochs it trained). A row whose
checkpoint is not shipped says what it is waiting for (WAITING).

Resumable like every study driver here (experiments/cli_runs.py); evaluations are cached
under `evals/` by the checkpoint's SHA-256. Writes results.md and results.json into this
folder (--out).

    python -m experiments.omniglot_reproduction.study [--train relation_conv4_5way1shot ...]
    python -m experiments.omniglot_reproduction.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
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
from fewshot.evaluation.stats import ci95
from fewshot.runtime.io import atomic_torch_save, atomic_write_text, file_sha256, load_checkpoint

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHAPES = [(5, 1), (5, 5), (20, 1), (20, 5)]


@dataclass(frozen=True)
class Row:
    """One row of the table: a method at one test shape, the configs whose shipped model it
    tests (the first one shipped), and its paper's number."""

    method: str
    way: int
    shot: int
    configs: tuple[str, ...]  # models/omniglot/<config>.json and .pt
    paper: float | None
    source: str


PAPERS = {  # method: (config prefix, numbers at SHAPES, source)
    "ProtoNet": ("protonet", (98.8, 99.7, 96.0, 98.9), "Snell et al. 2017"),
    "Matching Networks": ("matching", (98.1, 98.9, 93.8, 98.5), "Vinyals et al. 2016"),
    "Relation Networks": ("relation", (99.6, 99.8, 97.6, 99.1), "Sung et al. 2018"),
    "MAML": ("maml", (98.7, 99.9, 95.8, 98.9), "Finn et al. 2017"),
    "first-order MAML": ("fomaml", (98.3, 99.2, 89.4, 97.9), "Finn et al. 2017"),
    "iMAML": ("imaml", (99.16, 99.67, 94.46, 98.69), "Rajeswaran et al. 2019, GD"),
    "ANIL": ("anil", (None, None, 96.2, 98.0), "Raghu et al. 2020"),  # 20-way only
}


def rows() -> list[Row]:
    """The table's rows, in the order they are printed: ProtoNet's one train+val model at
    every shape (as Snell et al.), each other method's model per shape; where that one is not
    shipped, the MAML family's CPU-budget 5-way 1-shot models at 5 ways, and for Matching and
    Relation Networks their 1-shot model of the way, else the 5-way model of the shot, else of
    1 shot (the row says what it trained on): a relation module learns how many of its pairs
    match, one in `way`, so the way counts first."""
    table = []
    for method, (name, numbers, source) in PAPERS.items():
        for (w, s), paper in zip(SHAPES, numbers, strict=False):
            configs = (f"{name}_conv4_{w}way{s}shot",)
            if name == "protonet":
                configs = ("protonet_conv4_trainval",)
            elif name in MAML_FAMILY and w == 5:  # its classifier is 5-way: any shot
                configs += (f"{name}_conv4_5way1shot_cpu",)
            elif name in ("matching", "relation"):  # any of their models reads any shape
                others = [f"{name}_conv4_{w}way1shot", f"{name}_conv4_5way{s}shot"]
                configs = tuple(dict.fromkeys([*configs, *others, f"{name}_conv4_5way1shot"]))
            table.append(Row(method, w, s, configs, paper, source))
    return table


MAML_FAMILY = ("maml", "fomaml", "imaml", "anil")
# Why a row has no shipped model of the paper's budget, and what finishes it.
WAITING = {
    name: (
        "the paper's 60,000 meta-iterations of 16-32 episodes take days on this 2-core CPU "
        "(400 took 20-30 minutes: experiments/omniglot_zoo/); on an H200 about 40 minutes "
        "each, `--device cuda`"
    )
    for name in MAML_FAMILY
}


SMOKE = {"episodes": 4, "val_episodes": 2, "epochs": 1, "episodes_per_epoch": 4}


def ship(run: str, target: Path, logs: Path) -> None:
    """A run's last checkpoint as a shipped model: settings, weights and training history only
    (no optimizer or sampler state; the run folder as the config names it, not this machine's),
    and its metrics log beside the study."""
    ckpt = load_checkpoint(Path(run) / "last.pt")
    slim = {key: ckpt[key] for key in ("config", "model", "progress")}
    config = json.loads((REPO / "models" / "omniglot" / f"{target.stem}.json").read_text())
    slim["config"] = {**slim["config"], "out": config["out"]}
    atomic_torch_save(slim, target)
    logs.mkdir(parents=True, exist_ok=True)
    atomic_write_text((Path(run) / "metrics.jsonl").read_text(), logs / f"{target.stem}.jsonl")


def trained(path: Path) -> dict:
    """What a shipped checkpoint says of its training: its episodes' way and shot, how many
    episodes, seconds, precision, and the validation accuracy of its last two epochs (how far
    the curve had come)."""
    ckpt = load_checkpoint(path)
    config, history = ckpt["config"], ckpt["progress"].get("history", [])
    vals = [row["val_acc"] for row in history if "val_acc" in row]
    return {
        "way": config["way"],
        "shot": config["shot"],
        "episodes": ckpt["progress"]["epoch"] * config["episodes_per_epoch"],
        "epochs": ckpt["progress"]["epoch"],
        "planned_epochs": config["epochs"],
        "seconds": sum(row.get("seconds", 0.0) for row in history),
        "precision": history[-1].get("precision") if history else None,
        "val_last": vals[-1] if vals else None,
        "val_previous": vals[-2] if len(vals) > 1 else None,
    }


def main(argv: list[str] | None = None) -> None:
    """Train and ship what --train names, evaluate every shipped row, write the table."""
    args = parse_args(argv)
    zoo, out = Path(args.zoo), Path(args.out)
    sizes = {k: getattr(args, k) for k in ("epochs", "episodes_per_epoch", "val_episodes")}
    for name in args.train:
        config = REPO / "models" / "omniglot" / f"{name}.json"
        run = f"{args.runs}/{name}"
        epochs = args.epochs or json.loads(config.read_text())["epochs"]
        flags = config_overrides(args.data_root, **sizes)
        train("train", str(config), run, epochs, *flags)
        ship(run, zoo / f"{name}.pt", out / "logs")
    for name in args.ship:  # as far as its run has come (resumable: --train finishes it)
        ship(f"{args.runs}/{name}", zoo / f"{name}.pt", out / "logs")
    # Tested in float32 on every machine (--amp auto would test in bf16 where a CPU has it).
    data = [*config_overrides(args.data_root), "--amp", "off"]
    results: dict = {"episodes": args.episodes, "rows": []}
    for row in rows():
        shipped = [c for c in row.configs if (zoo / f"{c}.pt").is_file()]
        config = shipped[0] if shipped else row.configs[0]
        path = zoo / f"{config}.pt"
        record = {**row.__dict__, "config": config, "shipped": bool(shipped)}
        if shipped:
            sha = file_sha256(path)
            cached = out / "evals" / f"{config}.{sha[:12]}.{row.way}w{row.shot}s.json"
            cached.parent.mkdir(parents=True, exist_ok=True)
            if cached.is_file() and json.loads(cached.read_text())["precision"] != "float32":
                cached.unlink()  # an evaluation from before the table was float32's alone
            typed = path.relative_to(REPO) if path.is_relative_to(REPO) else path  # as typed
            acc = evaluate(str(typed), data, row.way, row.shot, args.episodes, cached)
            record |= {
                "accuracy": 100 * float(acc.double().mean()),
                "ci95": 100 * ci95(acc),
                "sha256": sha,
                "trained": trained(path),
            }
        else:
            record["why"] = WAITING.get(config.split("_")[0], "not trained yet")
        results["rows"].append(record)
    write_results(results, table(results), out)


def table(results: dict) -> str:
    """The markdown table of results.json."""
    lines = [
        f"Accuracy ± 95% CI (%) on {results['episodes']} seeded Omniglot test episodes "
        "(Vinyals test classes, seed 0, 15 queries per class).",
        "",
        *markdown_header(
            "method", "shape", "here", "paper", "trained on", "episodes", "time", "reproduce"
        ),
    ]
    for r in results["rows"]:
        paper = f"{r['paper']} ({r['source']})" if r["paper"] is not None else "—"
        shape = f"{r['way']}-way {r['shot']}-shot"
        command = f"`fewshot train --config models/omniglot/{r['config']}.json`"
        if not r["shipped"]:
            cells = ("not shipped", paper, "", "", "", command)
            lines.append(markdown_row(r["method"], shape, *cells))
            continue
        t = r["trained"]
        episodes = f"{t['episodes']:,}"
        if t["epochs"] < t["planned_epochs"]:
            episodes += f" ({t['epochs']} of {t['planned_epochs']} epochs)"
        time = f"{t['seconds'] / 60:.0f} min, {t['precision']}"
        here = percent(r["accuracy"] / 100, r["ci95"] / 100)
        trained_on = f"{t['way']}-way {t['shot']}-shot"
        cells = (here, paper, trained_on, episodes, time, command)
        lines.append(markdown_row(r["method"], shape, *cells))
    missing: dict[str, dict[str, None]] = {}  # why: the configs waiting for it, in order
    for r in results["rows"]:
        if not r["shipped"]:
            missing.setdefault(r["why"], {})[f"`{r['config']}`"] = None
    if missing:
        lines += ["", "Not shipped yet:", ""]
        lines += [f"- {', '.join(configs)}: {why}" for why, configs in missing.items()]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", nargs="*", default=[], help="configs to train and ship")
    parser.add_argument(
        "--ship", nargs="*", default=[], help="configs whose runs to ship as far as they came"
    )
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per row")
    parser.add_argument("--epochs", type=int, help="of the runs (default: the configs')")
    parser.add_argument("--episodes-per-epoch", type=int, help="(default: the configs')")
    parser.add_argument("--val-episodes", type=int, help="of every run (default: the configs')")
    parser.add_argument("--runs", default="runs/omniglot_zoo", help="folder of the run folders")
    parser.add_argument("--zoo", default=str(REPO / "models" / "omniglot"), help="shipped models")
    add_study_flags(parser, HERE, runs=False)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs", "zoo"))
    return args


if __name__ == "__main__":
    main()
