"""The MAML family's test-time steps measured: the shipped Omniglot MAML, first-order MAML,
iMAML and ANIL models (each trained 5-way 1-shot with one inner step) at 5-way 1-shot and
5-shot, with other numbers of gradient steps on each test episode's support (`fewshot eval
--inner-steps`).

Every evaluation is on the same seeded test episodes (Vinyals test classes, seed 0, 15 queries
per class, float32), so each number of steps is paired with the model's own over the episodes.
Then ANIL's steps on validation episodes (the Vinyals validation classes) and the number they
choose; `--apply` writes it into the shipped model's settings. Evaluations are cached under
`evals/` by the checkpoint's hash (a model shipped anew is evaluated anew). Writes results.md
and results.json into this folder (--out).

    python -m experiments.maml_test_steps.study    # from the repository root
    python -m experiments.maml_test_steps.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call

from experiments.cli_runs import (
    config_overrides,
    evaluate,
    markdown_header,
    markdown_row,
    percent,
    write_results,
)
from experiments.omniglot_reproduction.study import MAML_FAMILY, PAPERS
from experiments.smoke import add_study_flags, apply_smoke
from fewshot.datasets import load_split
from fewshot.datasets.batches import images_to_device
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import seeded_episodes
from fewshot.evaluation.stats import ci95
from fewshot.runtime.io import (
    atomic_torch_save,
    atomic_write_json,
    atomic_write_text,
    file_sha256,
    load_checkpoint,
)
from fewshot.training.checkpoint import as_trained, load_trained

HERE = Path(__file__).resolve().parent
MODELS = Path("models/omniglot")  # as typed from the repository root
METHODS = {name: method for method, (name, _, _) in PAPERS.items() if name in MAML_FAMILY}
SHOTS = (1, 5)
CPU = torch.device("cpu")
SMOKE = {"episodes": 2, "steps": [1], "probe_episodes": 2, "probe_steps": 20}


def main(argv: list[str] | None = None) -> None:
    """Evaluate what is missing, write the tables."""
    args = parse_args(argv)
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    flags = [*config_overrides(args.data_root), "--amp", "off"]
    results: dict = {"episodes": args.episodes, "rows": []}
    results["probe"] = {"episodes": args.probe_episodes, "rows": []}
    probe = f"probe{args.probe_episodes}x{args.probe_steps}"
    for name in args.models:
        checkpoint, own, digest = zoo_model(name)
        for shot in SHOTS:
            record = {"method": METHODS[name], "config": checkpoint.stem, "shot": shot}
            record.update(checkpoint_sha256=digest)
            accuracies = {}
            for steps in sorted({*args.steps, own}):
                out = evals / f"{checkpoint.stem}.{digest}.5w{shot}s.{steps}steps.json"
                step_flags = [*flags, "--inner-steps", str(steps)]
                accuracies[steps] = evaluate(
                    str(checkpoint), step_flags, 5, shot, args.episodes, out
                )
            results["rows"].append({**record, "own_steps": own, "steps": summary(accuracies, own)})
            out = evals / f"{checkpoint.stem}.{digest}.5w{shot}s.{probe}.json"
            if not out.is_file():  # cached as the evaluations are
                curves = adaptation_probe(
                    checkpoint, shot, args.probe_episodes, args.probe_steps, args.data_root
                )
                atomic_write_json({"episodes": args.probe_episodes, **curves}, out)
            curves = json.loads(out.read_text())
            del curves["episode_accuracies"]  # in the cached file
            results["probe"]["rows"].append({**record, **curves})
    results["validation"] = [
        validation(name, flags, args.steps, args.episodes, evals) for name in args.validate
    ]
    write_results(results, table(results), Path(args.out))
    if args.apply:
        for row in results["validation"]:
            apply_choice(row["config"], row["chosen_steps"])


def zoo_model(name: str) -> tuple[Path, int, str]:
    """The method's shipped CPU-budget model: its path, its own test-time steps and the prefix
    of its SHA-256 that names its cached evaluations."""
    checkpoint = MODELS / f"{name}_conv4_5way1shot_cpu.pt"
    own = load_trained(checkpoint, CPU)[0].eval_inner_steps
    return checkpoint, own, file_sha256(checkpoint)[:12]


def apply_choice(stem: str, steps: int) -> None:
    """Make `steps` the shipped model's own test-time steps: in its config file and in the
    settings its checkpoint carries (the weights untouched)."""
    path = MODELS / f"{stem}.json"
    config = json.loads(path.read_text())
    config["method_options"]["eval_inner_steps"] = steps
    atomic_write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", path)
    checkpoint = load_checkpoint(MODELS / f"{stem}.pt")
    checkpoint["config"]["method_options"]["eval_inner_steps"] = steps
    atomic_torch_save(checkpoint, MODELS / f"{stem}.pt")
    print(f"{stem}: eval_inner_steps {steps} (the validation's choice)")


def validation(name: str, flags: list[str], steps: list[int], episodes: int, evals: Path) -> dict:
    """The model's accuracy on `episodes` seeded 5-way episodes of the Vinyals validation
    classes (unseen in its training) after each number of steps, at both shots, and the number
    of steps these choose: the best mean over the two shots (the fewest steps on a tie)."""
    checkpoint, own, digest = zoo_model(name)
    accuracies: dict[int, dict[str, list[float]]] = {}
    for count in sorted({*steps, own}):
        accuracies[count] = {}
        for shot in SHOTS:
            out = evals / f"{checkpoint.stem}.{digest}.val5w{shot}s.{count}steps.json"
            step_flags = [*flags, "--split", "val", "--inner-steps", str(count)]
            values = evaluate(str(checkpoint), step_flags, 5, shot, episodes, out)
            accuracies[count][str(shot)] = [float(values.mean()), ci95(values)]
    chosen = max(accuracies, key=lambda k: (sum(a[0] for a in accuracies[k].values()), -k))
    return {
        "method": METHODS[name],
        "config": checkpoint.stem,
        "checkpoint_sha256": digest,
        "own_steps": own,
        "chosen_steps": chosen,
        "steps": {str(k): v for k, v in accuracies.items()},
    }


def summary(accuracies: dict[int, torch.Tensor], own: int) -> dict:
    """Per number of steps: accuracy ± CI, the difference from the `own` steps paired over the
    episodes ± CI, and the episodes under 90 %."""
    table = {}
    for steps, values in accuracies.items():
        difference = values - accuracies[own]
        table[str(steps)] = {
            "accuracy": [float(values.mean()), ci95(values)],
            "difference": [float(difference.mean()), ci95(difference)],
            "below_90": int((values < 0.9).sum()),
        }
    return table


def adaptation_probe(
    checkpoint: Path, shot: int, episodes: int, steps: int, data_root: str | None
) -> dict:
    """The model's test-time adaptation written out on the first `episodes` of the study's
    5-way episodes: gradient descent at its inner_lr on the support cross-entropy of its adapted
    part (ANIL: the classifier, on features of the episode's images embedded in one pass; the
    others: the whole network, BatchNorm on each batch's statistics), plus iMAML's proximal term
    (proximal / 2) |theta - theta_0|^2. The mean inner objective and query accuracy after each
    of 0..`steps` steps, and each episode's accuracy per step (to check against `fewshot eval
    --inner-steps`)."""
    method, config = load_trained(checkpoint, CPU)
    anil = method.variant == "anil"
    module = method.network.classifier if anil else method.network
    init = {name: value.detach() for name, value in module.named_parameters()}
    proximal = method.proximal if method.variant == "imaml" else 0.0
    split = load_split("omniglot", "test", data_root, per_class=shot + 15)
    split = as_trained(config, split, checkpoint)
    support_labels = torch.arange(5).repeat_interleave(shot)
    query_labels = torch.arange(5).repeat_interleave(15)
    objectives, accuracies = [], []
    for batch in seeded_episodes(split, EpisodeShape(5, shot, 15, 8), episodes, 0):
        for episode in images_to_device(split, batch, CPU):  # [way, pool, C, H, W]
            inputs = episode
            if anil:
                with torch.no_grad():
                    features = method.network.backbone(episode.flatten(0, 1))
                inputs = features.unflatten(0, episode.shape[:2])
            support, query = inputs[:, :shot].flatten(0, 1), inputs[:, shot:].flatten(0, 1)
            theta = dict(init)
            objective_curve, accuracy_curve = [], []
            for _ in range(steps + 1):
                theta = {name: value.requires_grad_() for name, value in theta.items()}
                logits = functional_call(module, theta, (support,))
                objective = F.cross_entropy(logits, support_labels)
                for name, value in theta.items():
                    objective = objective + proximal / 2 * ((value - init[name]) ** 2).sum()
                with torch.no_grad():
                    predicted = functional_call(module, theta, (query,)).argmax(dim=1)
                objective_curve.append(float(objective.detach()))
                accuracy_curve.append(float((predicted == query_labels).float().mean()))
                grads = torch.autograd.grad(objective, list(theta.values()))
                theta = {
                    name: (value - method.inner_lr * grad).detach()
                    for (name, value), grad in zip(theta.items(), grads, strict=True)
                }
            objectives.append(objective_curve)
            accuracies.append(accuracy_curve)
    objectives_t, accuracies_t = torch.tensor(objectives), torch.tensor(accuracies)
    return {
        "objective": objectives_t.mean(dim=0).tolist(),
        "accuracy": accuracies_t.mean(dim=0).tolist(),
        "episode_accuracies": accuracies_t.T.tolist(),
    }


def table(results: dict) -> str:
    """The markdown tables of results.json: accuracies, then differences from the own steps."""
    steps = sorted({int(s) for r in results["rows"] for s in r["steps"]})
    columns = [f"{s} step{'s' if s != 1 else ''}" for s in steps]
    captions = {
        "accuracy": f"Omniglot test classes, {results['episodes']} seeded 5-way episodes (seed 0, "
        "15 queries per class), float32: accuracy ± 95% CI (%) after each number of gradient "
        "steps on the episode's support (the model's own steps marked *):",
        "difference": "Difference from the model's own steps, paired over the episodes "
        "(percentage points), and episodes under 90 %:",
    }
    lines = []
    for key, caption in captions.items():
        lines += [
            *([""] if lines else []),
            caption,
            "",
            *markdown_header("method", "shot", *columns),
        ]
        for r in results["rows"]:
            cells = [cell(r, s, key) for s in steps]
            lines.append(markdown_row(r["method"], str(r["shot"]), *cells))
    probe = results["probe"]
    if probe["rows"]:
        last = len(probe["rows"][0]["objective"]) - 1
        shown = [k for k in (0, 1, 2, 3, 5, 10, 15, 20) if k <= last]
        lines += [
            "",
            f"The adaptation written out on the first {probe['episodes']} of these episodes: "
            "the mean inner objective (support cross-entropy, iMAML's with its proximal term) "
            "/ query accuracy (%) after each number of steps:",
            "",
            *markdown_header("method", "shot", *[str(k) for k in shown]),
        ]
        for r in probe["rows"]:
            cells = [f"{r['objective'][k]:.3f} / {100 * r['accuracy'][k]:.1f}" for k in shown]
            lines.append(markdown_row(r["method"], str(r["shot"]), *cells))
    for r in results.get("validation", []):
        counts = sorted(int(k) for k in r["steps"])
        lines += [
            "",
            f"{r['method']} on the Omniglot validation classes (Vinyals split, unseen in its "
            f"training), {results['episodes']} seeded 5-way episodes (seed 0, 15 queries per "
            "class), float32: accuracy ± 95% CI (%) after each number of steps (the model's "
            "own steps marked *, the steps these choose, the best mean over both shots, †):",
            "",
            *markdown_header("shot", *[f"{k} step{'s' if k != 1 else ''}" for k in counts]),
        ]
        for shot in map(str, SHOTS):
            marks = {r["own_steps"]: "*", r["chosen_steps"]: "†"}
            if r["own_steps"] == r["chosen_steps"]:
                marks[r["own_steps"]] = "*†"
            cells = [percent(*r["steps"][str(k)][shot]) + marks.get(k, "") for k in counts]
            lines.append(markdown_row(shot, *cells))
    return "\n".join(lines) + "\n"


def cell(row: dict, steps: int, key: str) -> str:
    """One table cell: the row's accuracy or difference at `steps` (own steps starred; the
    difference cell also says how many episodes fell under 90 %)."""
    entry = row["steps"].get(str(steps))
    if entry is None:
        return ""
    if key == "accuracy":
        return percent(*entry["accuracy"]) + ("*" if steps == row["own_steps"] else "")
    return f"{percent(*entry['difference'], signed=True)} ({entry['below_90']})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per shape")
    parser.add_argument(
        "--steps", type=int, nargs="+", default=[1, 2, 3, 5, 10, 20], help="steps to test"
    )
    parser.add_argument(
        "--models", nargs="+", default=list(METHODS), choices=list(METHODS), help="methods"
    )
    parser.add_argument(
        "--validate",
        nargs="*",
        default=["anil"],
        choices=list(METHODS),
        help="methods whose steps to measure on validation episodes too (ANIL: no paper "
        "protocol at 5 ways)",
    )
    parser.add_argument(
        "--probe-episodes", type=int, default=200, help="episodes of the written-out adaptation"
    )
    parser.add_argument(
        "--probe-steps", type=int, default=20, help="steps of the written-out adaptation"
    )
    parser.add_argument(
        "--apply",
        action="store_true",
        help="write the validation's choice of steps into the shipped models and their configs",
    )
    add_study_flags(parser, HERE, runs=False)
    args = parser.parse_args(argv)
    if args.apply and args.smoke:
        parser.error("--apply changes the shipped models: not with --smoke")
    apply_smoke(args, SMOKE, ())
    return args


if __name__ == "__main__":
    main()
