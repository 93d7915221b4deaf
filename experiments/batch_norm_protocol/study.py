"""BatchNorm's statistics at test time, a protocol difference measured: the shipped Omniglot
ProtoNet, Matching and Relation Networks models with their trained (running) statistics, as
this library evaluates them, and with each episode's own (`--batch-norm transductive`: the
support's, then the queries'), as Relation Networks' code evaluates (it never leaves training
mode) and the MAML family always does.

Every row of the reproduction table (experiments/omniglot_reproduction/) for these methods, the
same shipped model at the same shape, tested on the same 2000 seeded episodes (seed 0, 15
queries per class) both ways; the difference paired over the episodes. Then Relation Networks'
5-way 1-shot model on the test episodes of its authors' code too: one query per class.

Resumable like every study driver here (experiments/cli_runs.py): evaluations are cached under
`evals/`. Writes results.md and results.json into this folder (--out).

    python -m experiments.batch_norm_protocol.study    # from the repository root
    python -m experiments.batch_norm_protocol.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from experiments.cli_runs import (
    config_overrides,
    evaluate,
    markdown_header,
    markdown_row,
    percent,
    write_results,
)
from experiments.omniglot_reproduction.study import rows
from experiments.smoke import add_study_flags, apply_smoke
from fewshot.datasets import load_split
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.evaluation.stats import ci95
from fewshot.runtime.io import atomic_write_json, file_sha256
from fewshot.training.checkpoint import as_trained, load_trained

HERE = Path(__file__).resolve().parent
MODELS = HERE.parents[1] / "models" / "omniglot"
METHODS = ("ProtoNet", "Matching Networks", "Relation Networks")
MODES = ("running", "transductive")
# Relation Networks' authors' test episodes: 5-way 1-shot, one query per class.
AUTHORS = ("Relation Networks", 5, 1, 1)
# Relation Networks' shapes where the backbone alone takes each episode's statistics too (the
# relation module keeping its trained ones): which part's statistics move the result.
BACKBONE_ONLY = [(5, 1), (20, 1)]
CPU = torch.device("cpu")
SMOKE = {"episodes": 2}


def main(argv: list[str] | None = None) -> None:
    """Evaluate what is missing, write the tables."""
    args = parse_args(argv)
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    data = config_overrides(args.data_root)
    results: dict = {"episodes": args.episodes, "ways": args.ways, "rows": []}
    for row in rows():
        if row.method not in METHODS or row.way not in args.ways:
            continue
        config = next(c for c in row.configs if (MODELS / f"{c}.pt").is_file())
        queries = [15, 1] if (row.method, row.way, row.shot, 1) == AUTHORS else [15]
        for query in queries:
            record = {"method": row.method, "way": row.way, "shot": row.shot, "query": query}
            record.update(config=config, paper=row.paper, source=row.source)
            for mode in MODES:
                name = f"{config}.{row.way}w{row.shot}s{query}q.{mode}.json"
                flags = [*data, "--query", str(query), "--batch-norm", mode, "--amp", "off"]
                checkpoint = f"models/omniglot/{config}.pt"  # as typed from the repository root
                accuracies = evaluate(
                    checkpoint, flags, row.way, row.shot, args.episodes, evals / name
                )
                record[mode] = [float(accuracies.mean()), ci95(accuracies)]
                record[f"{mode}_accuracies"] = accuracies
            difference = record.pop("transductive_accuracies") - record.pop("running_accuracies")
            record["difference"] = [float(difference.mean()), ci95(difference)]
            results["rows"].append(record)
    results["backbone_only"] = []
    for way, shot in BACKBONE_ONLY if 20 in args.ways else []:
        (config,) = {
            r["config"]
            for r in results["rows"]
            if (r["method"], r["way"], r["shot"], r["query"])
            == ("Relation Networks", way, shot, 15)
        }  # the row's own model, paired with its running statistics
        out = evals / f"{config}.{way}w{shot}s15q.backbone_only.json"
        accuracies = backbone_only(config, way, shot, args.episodes, args.data_root, out)
        record = {"way": way, "shot": shot, "config": config}
        record["backbone_only"] = [float(accuracies.mean()), ci95(accuracies)]
        running = json.loads((evals / f"{config}.{way}w{shot}s15q.running.json").read_text())
        difference = accuracies - torch.tensor(running["accuracies"])
        record["difference"] = [float(difference.mean()), ci95(difference)]
        results["backbone_only"].append(record)
    write_results(results, table(results), Path(args.out))


def backbone_only(
    config: str, way: int, shot: int, episodes: int, data_root: str | None, out: Path
) -> torch.Tensor:
    """Per-episode accuracies of the shipped model `config` on the study's episodes (15
    queries, seed 0, float32) with its backbone on each episode's own statistics and its
    relation module on the trained ones, cached in `out`."""
    if not out.is_file():
        checkpoint = MODELS / f"{config}.pt"
        method, settings = load_trained(checkpoint, CPU)
        method.amp = "off"
        method.use_episode_statistics(backbone_only=True)
        split = load_split("omniglot", "test", data_root, per_class=shot + 15)
        split = as_trained(settings, split, checkpoint)
        shape = EpisodeShape(way, shot, 15, 8)
        accuracies = episode_accuracies(method, split, shape, episodes, 0, CPU, progress=True)
        record = {"checkpoint": f"models/omniglot/{config}.pt", "way": way, "shot": shot}
        record.update(checkpoint_sha256=file_sha256(checkpoint), episodes=episodes, seed=0)
        atomic_write_json({**record, "accuracies": accuracies.tolist()}, out)
    return torch.tensor(json.loads(out.read_text())["accuracies"])


def table(results: dict) -> str:
    """The markdown table of results.json."""
    lines = [
        f"Omniglot test classes, {results['episodes']} seeded episodes (seed 0), float32: "
        "accuracy ± 95% CI (%) with BatchNorm's trained statistics (running) and with each "
        "episode's own (transductive); their difference paired over the episodes.",
        "",
        *markdown_header(
            "method", "shape", "queries", "model", "running", "transductive", "difference", "paper"
        ),
    ]
    for r in results["rows"]:
        paper = "—" if r["paper"] is None else f"{r['paper']} ({r['source']})"
        lines.append(
            markdown_row(
                r["method"],
                f"{r['way']}-way {r['shot']}-shot",
                str(r["query"]),
                f"`{r['config']}`",
                percent(*r["running"]),
                percent(*r["transductive"]),
                percent(*r["difference"], signed=True),
                paper,
            )
        )
    if results["backbone_only"]:
        lines += [
            "",
            "Relation Networks with the backbone alone on each episode's statistics (the "
            "relation module on its trained ones), and its difference from the running "
            "statistics paired over the episodes:",
            "",
            *markdown_header(
                "shape", "model", "running", "backbone only", "difference", "transductive"
            ),
        ]
    for r in results["backbone_only"]:
        [row] = [x for x in results["rows"] if (x["config"], x["way"], x["shot"], x["query"])
                 == (r["config"], r["way"], r["shot"], 15)]  # fmt: skip
        lines.append(
            markdown_row(
                f"{r['way']}-way {r['shot']}-shot",
                f"`{r['config']}`",
                percent(*row["running"]),
                percent(*r["backbone_only"]),
                percent(*r["difference"], signed=True),
                percent(*row["transductive"]),
            )
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per shape")
    parser.add_argument(
        "--ways", type=int, nargs="+", default=[5, 20], help="the rows' ways to evaluate"
    )
    add_study_flags(parser, HERE, runs=False)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ())
    return args


if __name__ == "__main__":
    main()
