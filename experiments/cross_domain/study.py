"""Cross-domain: the zoo's Omniglot models, frozen, on MNIST, Fashion-MNIST and CIFAR-10.

BSCD-FSL's protocol (5-way, 1 / 5 / 20 shots, 600 seeded episodes, 15 queries) on the test
images of MNIST, Fashion-MNIST and CIFAR-10, written once as folder data sets (one folder per
class, every test image) under --runs, for:

- the zoo's Omniglot models of each method, each frozen: its backbone alone (`fewshot eval
  --backbone conv4 --backbone-weights models/omniglot/X.pt`) with a test-time classifier;
- a narrow ResNet-12 pretrained on Omniglot (`fewshot pretrain`, the P>M>F study's stage P
  config, run into --runs), frozen the same way;
- the floors: a conv4 and that ResNet-12 with a seeded random initialisation (no weights);

each with nearest centroid and logistic regression, paired per episode (logistic − centroid,
and each trained model − its random floor). Every frozen row reads a target set normalised by
that set's own mean and std (`--normalization dataset`, as the table was measured; by default a
backbone lent by a checkpoint takes the checkpoint's, Omniglot's). P>M>F's fine-tuning
(`--classifier pmf`) runs through the two checkpoints with a prototype head, the zoo ProtoNet
and the ResNet-12 (`--checkpoint X --classifier pmf`; --pmf-models), at
5 shots on the first --pmf-episodes episodes, each of --pmf-lrs given (no validation split to
choose it on), paired against the same checkpoint with nearest centroid. The MAML family's rows
(no feature cache: their BatchNorm reads each episode) test the first --maml-episodes.

Resumable: a finished pretraining is skipped (an unfinished one resumed), an evaluation whose
JSON exists is read back (cut to the episodes asked) unless it holds fewer or the weights it
names changed. Writes results.md, results.json and evals/ (--out). The recorded run:

    python -m experiments.cross_domain.study --runs runs --maml-episodes 200 \
        --pmf-episodes 50 --pmf-models "ProtoNet (trainval)"    # from the repository root
    python -m experiments.cross_domain.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from experiments.cli_runs import (
    config_overrides,
    evaluate,
    fewshot,
    markdown_header,
    markdown_row,
    percent,
    train,
    write_results,
)
from experiments.smoke import add_study_flags, apply_smoke
from fewshot.datasets.idx import read_fashion_mnist, read_mnist
from fewshot.evaluation.stats import ci95, paired_ci
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json, file_sha256

HERE = Path(__file__).resolve().parent
PRETRAIN = Path("experiments/pmf_omniglot/pretrain_resnet12.json")
RESNET12 = {"channels": [32, 64, 128, 256], "drop_block_size": 2}  # the config's backbone
SETS = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10"}
ZOO = "models/omniglot"
# Row label -> (backbone, its options, weights: a zoo file, "pretrained" or None for the floor)
STRIDE, POOLED = {"downsample": "stride"}, {"pooled_blocks": 2}  # as the checkpoints' backbones
MODELS = {
    "ProtoNet (trainval)": ("conv4", {}, f"{ZOO}/protonet_conv4_trainval.pt"),
    "Matching Networks 5w1s": ("conv4", {}, f"{ZOO}/matching_conv4_5way1shot.pt"),
    "Relation Networks 5w1s": ("conv4", POOLED, f"{ZOO}/relation_conv4_5way1shot.pt"),
    "MAML 5w1s": ("conv4", STRIDE, f"{ZOO}/maml_conv4_5way1shot_cpu.pt"),
    "first-order MAML 5w1s": ("conv4", STRIDE, f"{ZOO}/fomaml_conv4_5way1shot_cpu.pt"),
    "ANIL 5w1s": ("conv4", STRIDE, f"{ZOO}/anil_conv4_5way1shot_cpu.pt"),
    "iMAML 5w1s": ("conv4", STRIDE, f"{ZOO}/imaml_conv4_5way1shot_cpu.pt"),
    "random conv4 (floor)": ("conv4", {}, None),
    "ResNet-12 pretrained": ("resnet12", RESNET12, "pretrained"),
    "random ResNet-12 (floor)": ("resnet12", RESNET12, None),
}
FLOOR = {"conv4": "random conv4 (floor)", "resnet12": "random ResNet-12 (floor)"}
CLASSIFIERS = ("centroid", "logistic")
EPISODE_STATISTICS = [label for label, (_, options, _) in MODELS.items() if options == STRIDE]
PMF_MODELS = ("ProtoNet (trainval)", "ResNet-12 pretrained")  # checkpoints with a prototype head
# --smoke: a few images a class, 1 and 2 shots, 2 queries, a few episodes, one fine-tuning step.
SMOKE = {
    "per_class": 4,
    "shots": [2],
    "query": 2,
    "episodes": 3,
    "maml_episodes": 2,
    "pmf_shot": 2,
    "pmf_episodes": 2,
    "pmf_steps": 1,
    "epochs": 1,
    "val_episodes": 2,
}


def slug(text: str) -> str:
    """A name for a file: lower-case words joined by '_'."""
    return "_".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def read_set(source: Path, name: str) -> tuple[list[np.ndarray], list[int], list[str]]:
    """One data set's test images (uint8 arrays), labels and class names, as distributed in
    `source` (IDX files; CIFAR-10 as class folders of JPEGs in a tar.gz)."""
    if name != "cifar10":
        split = (read_mnist if name == "mnist" else read_fashion_mnist)(source, "test")
        return list(split.images[:, 0].numpy()), split.labels.tolist(), split.class_names
    images, labels, classes = [], [], []
    with tarfile.open(source / "cifar10_jpeg" / "test.tar.gz") as tar:
        members = sorted((m for m in tar if m.isfile()), key=lambda m: m.name)
        for member in members:
            label = member.name.split("/")[-2]
            if label not in classes:
                classes.append(label)
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            images.append(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
            labels.append(classes.index(label))
    return images, labels, classes


def write_folders(source: Path, data: Path, per_class: int | None) -> dict[str, Path]:
    """Each set's test images as a folder data set, DATA/NAME/test/<class>/<n>.png (the first
    `per_class` of each class, or all), written once (in a temporary folder renamed when
    complete, so that a stopped run leaves nothing half-written); the data roots."""
    roots = {}
    for name in SETS:
        roots[name] = root = data / name
        if root.is_dir():
            continue
        partial = data / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        images, labels, classes = read_set(source, name)
        kept = dict.fromkeys(range(len(classes)), 0)
        for n, (image, label) in enumerate(zip(images, labels, strict=True)):
            if per_class is not None and kept[label] >= per_class:
                continue
            kept[label] += 1
            folder = partial / "test" / slug(classes[label])  # Fashion's "t-shirt/top"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{n:05d}.png")
        print(f"{name}: {sum(kept.values())} test images of {len(classes)} classes", flush=True)
        partial.rename(root)
    return roots


def frozen_eval(
    model: tuple[str, dict, str | None], data: list[str], shot: int, episodes: int, out: Path
) -> torch.Tensor:
    """Per-episode accuracies of a frozen backbone (backbone, options, weights; weights None:
    its seeded random initialisation) on the first `episodes` seeded episodes, cached in `out`
    (a record of more episodes is read back cut: the same episodes come first; made again when
    it holds fewer, or tested another content than the weights file now there)."""
    backbone, options, weights = model
    record = json.loads(out.read_text()) if out.is_file() else {}
    if (
        record.get("episodes", 0) < episodes
        or (weights and record.get("backbone_weights_sha256") != file_sha256(weights))
    ):  # fmt: skip
        given = ["--backbone-weights", weights] if weights else []
        fewshot("eval", "--backbone", backbone, "--backbone-options", json.dumps(options), *given,
                *data, "--normalization", "dataset", "--way", "5", "--shot", str(shot),
                "--episodes", str(episodes),
                "--seed", "0", "--episodes-per-batch", "200", "--per-episode", "--out", str(out),
                "--overwrite")  # fmt: skip
        record = json.loads(out.read_text())
    return torch.tensor(record["accuracies"][:episodes])


def test_flags(root: Path, query: int) -> list[str]:
    """The evaluation flags of a folder data set's test split (float32), read as the Omniglot
    models' 1x28x28 images; way, shot and episodes are given apart."""
    # The floors (no weights) read a folder at its images' own geometry: CIFAR-10 is read as
    # every row reads it, the Omniglot models' 1x28x28.
    geometry = ["--channels", "1", "--resize", "28"] if root.name == "cifar10" else []
    return ["--dataset", "folder", "--data-root", str(root), "--split", "test", *geometry,
            "--query", str(query), "--amp", "off"]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Write the data sets, pretrain what is missing, evaluate every row, write the tables."""
    args = parse_args(argv)
    try:
        roots = write_folders(
            Path(args.source), Path(args.runs) / "cross_domain_data", args.per_class
        )
    except (FewshotError, OSError) as e:  # a source that is not there: one line, exit 2
        print(f"cross_domain: error: --source {args.source}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.data_only:  # the data of the cross-domain-v1 suite (fewshot bench --data-root RUNS)
        return
    rows = [m for m in MODELS if not args.models or m in args.models]
    pretrained = f"{args.runs}/omniglot_pmf_pretrain_resnet12"
    if "ResNet-12 pretrained" in rows:
        sizes = {"epochs": args.epochs, "val_episodes": args.val_episodes}
        train("pretrain", str(PRETRAIN), pretrained, args.epochs or 4,
              *config_overrides(args.data_root, **sizes))  # fmt: skip
    weights = {label: f"{pretrained}/best.pt" if w == "pretrained" else w
               for label, (_, _, w) in MODELS.items()}  # fmt: skip
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    acc: dict = {}
    data = {name: test_flags(root, args.query) for name, root in roots.items()}
    # The MAML family's rows last: their BatchNorm reads each episode, so no feature cache.
    for label in sorted(rows, key=lambda label: label in EPISODE_STATISTICS):
        backbone, options, _ = MODELS[label]
        episodes = args.maml_episodes if label in EPISODE_STATISTICS else args.episodes
        for name, shot, classifier in itertools.product(roots, args.shots, CLASSIFIERS):
            out = evals / f"{slug(label)}_{name}_{shot}shot_{classifier}.json"
            acc[label, name, shot, classifier] = frozen_eval(
                (backbone, options, weights[label]),
                [*data[name], "--classifier", classifier], shot, episodes, out,
            )  # fmt: skip
    # P>M>F's fine-tuning through the checkpoint (a prototype head), against its centroid.
    for label, name, lr in itertools.product(pmf_rows(args, rows), roots, [None, *args.pmf_lrs]):
        flags = ["--classifier", "centroid"]
        if lr is not None:
            pmf = json.dumps({"steps": args.pmf_steps, "lr": lr})
            flags = ["--classifier", "pmf", "--classifier-options", pmf]
        stem = f"{slug(label)}_{name}_{args.pmf_shot}shot_checkpoint"
        acc[label, name, "checkpoint", lr] = evaluate(
            weights[label], [*data[name], *flags], 5, args.pmf_shot, args.pmf_episodes,
            evals / f"{stem}_{'centroid' if lr is None else f'pmf_lr{lr:g}'}.json", 1,
        )  # fmt: skip
    relative_roots(evals)
    results = summary(acc, rows, args)
    write_results(results, table(results), Path(args.out))


def pmf_rows(args: argparse.Namespace, rows: list[str]) -> list[str]:
    """The rows fine-tuned (none without lrs)."""
    return [m for m in args.pmf_models if m in rows] if args.pmf_lrs else []


def relative_roots(evals: Path) -> None:
    """The data roots the evaluations record (absolute paths) made relative to the repository
    (the working folder) where they lie in it, else DATA/NAME: no machine's path recorded."""
    for path in evals.glob("*.json"):
        record = json.loads(path.read_text())
        root = Path(record.get("data_root") or "")
        if root.is_absolute():
            inside = root.is_relative_to(Path.cwd())
            record["data_root"] = str(
                root.relative_to(Path.cwd()) if inside else f"DATA/{root.name}"
            )
            atomic_write_json(record, path)


def summary(acc: dict, rows: list[str], args: argparse.Namespace) -> dict:
    """Accuracies ± CI and the paired differences, in percent, of the evaluations `acc`."""

    def cell(a: torch.Tensor) -> dict:
        return {"accuracy": 100 * float(a.double().mean()), "ci95": 100 * ci95(a)}

    def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
        d = paired_ci(a, b)
        return {"mean": 100 * d.mean, "ci95": 100 * d.ci95, "p_value": d.p_value}

    pmf = {"shot": args.pmf_shot, "episodes": args.pmf_episodes, "steps": args.pmf_steps,
           "lrs": args.pmf_lrs}  # fmt: skip
    results: dict = {
        **{key: vars(args)[key] for key in ("episodes", "maml_episodes", "query", "shots")},
        "per_class": args.per_class,
        "pmf": pmf,
        "rows": {},
        "pmf_rows": {},
    }
    for label in rows:
        floor = FLOOR[MODELS[label][0]]
        for name in SETS:
            for shot in args.shots:
                a = {c: acc[label, name, shot, c] for c in CLASSIFIERS}
                entry = {c: cell(a[c]) for c in CLASSIFIERS}
                entry["logistic − centroid"] = diff(a["centroid"], a["logistic"])
                for c in CLASSIFIERS if floor in rows and floor != label else ():
                    # the floor's first episodes: the MAML family's rows test fewer
                    entry[f"{c} − floor"] = diff(acc[floor, name, shot, c][: len(a[c])], a[c])
                results["rows"].setdefault(label, {}).setdefault(name, {})[str(shot)] = entry
            if label not in pmf_rows(args, rows):
                continue
            centroid = acc[label, name, "checkpoint", None]
            frozen = acc[label, name, args.pmf_shot, "centroid"][: len(centroid)]
            entry = {"centroid": cell(centroid), "checkpoint − frozen": diff(frozen, centroid)}
            for lr in args.pmf_lrs:
                tuned = acc[label, name, "checkpoint", lr]
                entry[f"pmf lr {lr:g}"] = cell(tuned)
                entry[f"pmf lr {lr:g} − centroid"] = diff(centroid, tuned)
            results["pmf_rows"].setdefault(label, {})[name] = entry
    return results


def table(results: dict) -> str:
    """The markdown tables of results.json."""
    shots = results["shots"]
    lines = [
        f"Accuracy ± 95% CI (%), 5-way, {results['episodes']} seeded episodes (seed 0; the "
        f"MAML family's rows: the first {results['maml_episodes']}), "
        f"{results['query']} queries a class; each backbone frozen. Below each model, paired "
        "per episode: the model − its random floor (same classifier).",
    ]
    for name, title in SETS.items():
        columns = [f"{shot}-shot {c}" for shot in shots for c in CLASSIFIERS]
        lines += ["", f"**{title}**", "", *markdown_header("model", *columns)]
        for label, sets in results["rows"].items():
            cells = sets[name]
            lines.append(markdown_row(label, *(
                percent(cells[str(s)][c]["accuracy"] / 100, cells[str(s)][c]["ci95"] / 100)
                for s in shots for c in CLASSIFIERS)))  # fmt: skip
            if f"{CLASSIFIERS[0]} − floor" in cells[str(shots[0])]:
                floors = [cells[str(s)][f"{c} − floor"] for s in shots for c in CLASSIFIERS]
                lines.append(markdown_row("&nbsp;&nbsp;− floor", *map(signed, floors)))
    keys = [(name, shot) for name in SETS for shot in shots]
    lines += ["", "Logistic − centroid, paired per episode (points):", "",
              *markdown_header("model", *(f"{SETS[n]} {s}-shot" for n, s in keys))]  # fmt: skip
    for label, sets in results["rows"].items():
        lines.append(markdown_row(label, *(
            signed(sets[n][str(s)]["logistic − centroid"]) for n, s in keys)))  # fmt: skip
    if not results["pmf_rows"]:
        return "\n".join(lines) + "\n"
    pmf = results["pmf"]
    lrs = [f"{lr:g}" for lr in pmf["lrs"]]
    lines += [
        "",
        f"P>M>F's fine-tuning (`--classifier pmf`, {pmf['steps']} steps at a given lr) against "
        f"nearest centroid, both through the checkpoint, 5-way {pmf['shot']}-shot, the first "
        f"{pmf['episodes']} of the episodes above; last column: the checkpoint's centroid − the "
        "frozen backbone's on the same episodes (the two normalise differently).",
        "",
        *markdown_header("model", "data set", "centroid",
                         *(f"pmf lr {lr} − centroid" for lr in lrs), "checkpoint − frozen"),
    ]  # fmt: skip
    for label, sets in results["pmf_rows"].items():
        for name, c in sets.items():
            lines.append(markdown_row(
                label, SETS[name],
                percent(c["centroid"]["accuracy"] / 100, c["centroid"]["ci95"] / 100),
                *(signed(c[f"pmf lr {lr} − centroid"]) for lr in lrs),
                signed(c["checkpoint − frozen"])))  # fmt: skip
    return "\n".join(lines) + "\n"


def signed(d: dict) -> str:
    """A paired difference in points, '+0.31 ± 0.08'."""
    return percent(d["mean"] / 100, d["ci95"] / 100, True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="../shared/data",
                        help="MNIST and Fashion-MNIST IDX files, CIFAR-10 JPEGs (mnist/, "
                        "fashion_mnist/, cifar10_jpeg/test.tar.gz)")  # fmt: skip
    parser.add_argument("--per-class", type=int, help="test images kept a class (default: all)")
    parser.add_argument(
        "--data-only", action="store_true", help="write the data folders under --runs and stop"
    )
    parser.add_argument("--models", nargs="+", choices=list(MODELS), help="rows (default: all)")
    parser.add_argument("--shots", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--query", type=int, default=15, help="queries a class")
    parser.add_argument("--episodes", type=int, default=600, help="test episodes")
    parser.add_argument(
        "--maml-episodes",
        type=int,
        default=600,
        help="test episodes of the MAML family's rows (the first of --episodes)",
    )
    parser.add_argument(
        "--pmf-models",
        nargs="*",
        choices=PMF_MODELS,
        default=list(PMF_MODELS),
        help="rows fine-tuned",
    )
    parser.add_argument("--pmf-shot", type=int, default=5, help="fine-tuning's shot")
    parser.add_argument("--pmf-episodes", type=int, default=100, help="fine-tuning's episodes")
    parser.add_argument("--pmf-steps", type=int, default=20, help="fine-tuning steps")
    parser.add_argument("--pmf-lrs", type=float, nargs="*", default=[1e-4, 1e-3],
                        help="fine-tuning lrs, each a row")  # fmt: skip
    parser.add_argument("--epochs", type=int, help="of the pretraining (default: the config's)")
    parser.add_argument("--val-episodes", type=int, help="of the pretraining (config's)")
    add_study_flags(parser, HERE)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    return args


if __name__ == "__main__":
    main()
