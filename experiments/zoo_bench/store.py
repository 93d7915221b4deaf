"""The zoo's stored results on omniglot-v1 and cross-domain-v1: each model's per-episode
results, from the studies' recorded evaluations, in `fewshot bench`'s result form
(models/bench/SUITE/MODEL/CELL.json).

The recorded evaluations were made on seeded episodes, before manifests existed; each cell's
manifest is those very episodes (its SHA-256 is the suite's pin, checked by the tests), so a
recorded evaluation is a result on the manifest once it names the manifest's SHA-256. Each
recorded file is checked first: its data set, split, shape, seed, episodes and the data's
fingerprint must be the cell's. The random floor is not recorded by a study: it is evaluated by
`fewshot bench` (`--floor DIR`: that bench's output folder), and copied.

    fewshot bench omniglot-v1 conv4 --classifier centroid --name "random conv4 (floor)" \
        --amp off --no-stored --out runs/floor
    python -m experiments.zoo_bench.store --floor runs/floor
    python -m experiments.zoo_bench.store --smoke --out DIR    # the test suite's run

The cross-domain study's evaluations are each frozen model with nearest centroid and with
logistic regression (the MAML family's on the first 200 of the 600 episodes: ranked where a
bench looks at its first 200, `--limit 200`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from experiments.cross_domain.study import MODELS, SETS
from experiments.cross_domain.study import slug as study_slug
from experiments.smoke import add_smoke_flag, smoke_folder
from fewshot.benchmark.results import STORED, correct_counts, read_results, slug
from fewshot.benchmark.suites import load_suite
from fewshot.runtime.io import atomic_write_json

REPO = Path(__file__).resolve().parents[2]
REPRODUCTION = REPO / "experiments" / "omniglot_reproduction"
PRETRAINING = REPO / "experiments" / "pretraining_omniglot" / "evals"
CROSS_DOMAIN = REPO / "experiments" / "cross_domain" / "evals"
# The pretraining study's rows (its evals/ files LABEL_{way}w{shot}s.json) and their names.
PRETRAINED = {
    "pretrain_+_centroid": "Pretrain + centroid",
    "pretrain_+_centroid_cl2n": "Pretrain + centroid (CL2N)",
    "pretrain_+_logistic_rfs": "Pretrain + logistic (RFS)",
    "pretrain_+_bd_cspn_transductive": "Pretrain + BD-CSPN (transductive)",
    "pretrain_+_pt_map_transductive": "Pretrain + PT-MAP (transductive)",
    "baseline++_+_fine_tuned_cosine": "Baseline++ + fine-tuned cosine",
    "meta_baseline_seed_0": "Meta-Baseline (seed 0)",
}
CELL_KEYS = ("dataset", "split", "way", "shot", "query", "seed")


def omniglot(suite) -> list[tuple[str, str, Path]]:
    """(name, cell, recorded evaluation) of every zoo model with one on omniglot-v1."""
    found = []
    rows = json.loads((REPRODUCTION / "results.json").read_text())["rows"]
    for row in rows:
        if row["shipped"]:
            cell = f"{row['way']}w{row['shot']}s"
            file = f"{row['config']}.{row['sha256'][:12]}.{cell}.json"
            found.append((row["method"], cell, REPRODUCTION / "evals" / file))
    for label, name in PRETRAINED.items():
        for cell in suite.cells:
            path = PRETRAINING / f"{label}_{cell.name}.json"
            if path.is_file():
                found.append((name, cell.name, path))
    return found


def cross_domain(suite) -> list[tuple[str, str, Path]]:
    """(name, cell, recorded evaluation) of every model of the cross-domain study."""
    found = []
    for label in MODELS:
        for cell in suite.cells:
            data = Path(cell.root).name
            for classifier in ("centroid", "logistic"):
                file = f"{study_slug(label)}_{data}_{cell.shot}shot_{classifier}.json"
                if (CROSS_DOMAIN / file).is_file():
                    found.append((f"{label} + {classifier}", cell.name, CROSS_DOMAIN / file))
    assert {Path(cell.root).name for cell in suite.cells} == set(SETS)
    return found


SOURCES = {"omniglot-v1": omniglot, "cross-domain-v1": cross_domain}


def stored_record(suite, name: str, cell_name: str, path: Path) -> dict:
    """A recorded evaluation as a bench result of `name` on the cell, after checking it was
    made on the cell's episodes."""
    cell = suite.cell(cell_name)
    record = json.loads(path.read_text())
    if record["episodes"] > cell.episodes:
        raise SystemExit(f"{path}: {record['episodes']} episodes, cell {cell.name} has fewer")
    for key in CELL_KEYS:
        if record[key] != getattr(cell, key):
            raise SystemExit(
                f"{path}: {key} {record[key]!r}, cell {cell.name} has {getattr(cell, key)!r}"
            )
    accuracies = torch.tensor(record.pop("accuracies"), dtype=torch.float64)
    queries = cell.way * cell.query
    summary = {key: record[key] for key in ("accuracy", "ci95", "episodes", "way", "shot")}
    summary |= {"query": record["query"], "seed": record["seed"]}
    record.update(name=name, suite=suite.id, cell=cell.name, queries=queries, summary=summary)
    record.update(episodes_sha256=cell.sha256, correct=correct_counts(accuracies, queries))
    return record


def main(argv: list[str] | None = None) -> None:
    """Write every recorded evaluation as a stored result, and copy the floor's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor", help="the output folder of the floor's omniglot-v1 bench")
    parser.add_argument("--out", default=str(STORED), help="the stored results' folder")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    # --smoke: every recorded evaluation converted (there is nothing smaller), into --out.
    root = smoke_folder(args.out) if args.smoke else Path(args.out)
    for suite_id, source in SOURCES.items():
        suite, out = load_suite(suite_id), root / suite_id
        fingerprints: dict[str, set] = {}
        for name, cell, path in source(suite):
            record = stored_record(suite, name, cell, path)
            fingerprints.setdefault(cell, set()).add(record["dataset_fingerprint"])
            atomic_write_json(record, out / slug(name) / f"{cell}.json")
        if args.floor and suite_id == "omniglot-v1":
            for result in read_results(Path(args.floor) / "results", suite.id, False):
                fingerprints.setdefault(result.cell, set()).add(result.dataset_fingerprint)
                target = out / slug(result.name) / f"{result.cell}.json"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(result.path, target)
        mixed = [cell for cell, seen in fingerprints.items() if len(seen) != 1]
        if mixed:
            raise SystemExit(f"{suite_id} {mixed[0]}: evaluations of other versions of the data")
        print(f"stored results in {out}")


if __name__ == "__main__":
    main()
