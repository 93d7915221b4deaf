"""Per-parameter regularization of image classifiers (paper Table 7-5), ours beside the paper's.

Reads OUT/imgreg_{dataset}_{model}_{method}_seed{S}.json as written by
`fewshot hpo image-regularization`; with --run it first runs every missing (dataset, model,
method, seed) cell with the command's defaults (equal inner-step budgets: OEHG with U = 5 and
T = 1000, RHG / T-RHG K = 128 with T = 47). Writes OUT/image_table.md and OUT/image_table.json:
test accuracy and loss, mean over the seeds found, "ours (paper)"; cells without a result show "-".

Run from the repository root; --out defaults to this study's folder, whose per-run JSON files
the committed table was made from:

    OMP_NUM_THREADS=1 python -m experiments.hpo_image_regularization.table --seeds 0,1,2 \
        [--out DIR --run --data-root DIR --datasets mnist --models sr --methods rhg,trhg,oehg]
    python -m experiments.hpo_image_regularization.table --smoke --out DIR --data-root DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from experiments.hpo_cells import (
    SMOKE_METHOD_FLAGS,
    Cell,
    add_cell_arguments,
    apply_smoke,
    run_missing,
    selection,
    write_table,
)
from fewshot.hpo.tasks.image_regularization import result_stem

METHOD_NAMES = {"rhg": "RHG", "trhg": "T-RHG", "oehg": "OEHG"}
# Paper Table 7-5: (test accuracy %, test loss) for RHG, T-RHG, OEHG.
PAPER = {
    ("mnist", "sr"): ((87.15, 0.5587), (84.37, 0.7911), (90.73, 0.3256)),
    ("mnist", "mlp"): ((87.49, 0.5001), (87.84, 0.5865), (93.40, 0.2310)),
    ("fashion-mnist", "sr"): ((79.23, 0.6767), (75.30, 0.8184), (84.26, 0.4599)),
    ("fashion-mnist", "mlp"): ((79.23, 0.6356), (79.04, 0.6535), (85.03, 0.4374)),
    ("cifar10", "sr"): ((31.76, 1.9497), (32.59, 1.9686), (38.88, 1.7693)),
    ("cifar10", "mlp"): ((35.02, 1.9024), (35.60, 1.8475), (39.96, 1.7297)),
}


def _path(out: Path, dataset: str, model: str, method: str, seed: int) -> Path:
    return out / f"{result_stem(dataset, model, method, seed)}.json"


def _cell(values: list[float], paper: float, digits: int) -> str:
    ours = f"{statistics.mean(values):.{digits}f}" if values else "-"
    return f"{ours} ({paper:.{digits}f})"


def main(argv: list[str] | None = None) -> None:
    """Optionally run the missing cells, then write the Markdown and JSON tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cell_arguments(
        parser, "experiments/hpo_image_regularization", "mnist,fashion-mnist,cifar10"
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args(argv)
    apply_smoke(args)
    out = Path(args.out)
    datasets, models, methods, seeds = selection(args)
    if args.run:

        def extra(cell: Cell) -> list[str]:
            """The device, and under --smoke two outer steps of the method's smallest size."""
            smoke = ["--outer-steps", "2", *SMOKE_METHOD_FLAGS[cell[2]]] if args.smoke else []
            return ["--device", args.device, *smoke]

        run_missing("image-regularization", args, lambda cell: _path(out, *cell), extra)

    names = [METHOD_NAMES[m] for m in methods]
    lines = ["| dataset | model | metric | " + " | ".join(names) + " |"]
    lines.append("|---" * (3 + len(methods)) + "|")
    table = {}
    for dataset in datasets:
        for model in models:
            accuracy, loss = [], []
            for method in methods:
                runs = [
                    json.loads(p.read_text())
                    for s in seeds
                    if (p := _path(out, dataset, model, method, s)).is_file()
                ]
                paper_acc, paper_loss = PAPER[dataset, model][list(METHOD_NAMES).index(method)]
                accuracy.append(_cell([r["test_accuracy"] for r in runs], paper_acc, 2))
                loss.append(_cell([r["test_loss"] for r in runs], paper_loss, 4))
                table[f"{dataset}/{model}/{method}"] = {
                    "test_accuracy": [r["test_accuracy"] for r in runs],
                    "test_loss": [r["test_loss"] for r in runs],
                    "seconds": [r["seconds"] for r in runs],
                    "device": [r["settings"]["device"] for r in runs],
                }
            lines.append(f"| {dataset} | {model.upper()} | acc % | " + " | ".join(accuracy) + " |")
            lines.append(f"| {dataset} | {model.upper()} | loss | " + " | ".join(loss) + " |")
    write_table(out, "image_table", lines, table)


if __name__ == "__main__":
    main()
