"""The studies of experiments/ that are library commands rather than sweeps (`fewshot eval` of
shipped models under several options, `fewshot compare`, `fewshot train`): each README's tables
recomputed from the recorded JSON results of those commands, evaluating and training nothing,
and the little code the studies keep run on small data."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from fewshot.evaluation.stats import ci95, paired_ci
from fewshot.runtime.io import file_sha256, load_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
MODELS = REPO / "models" / "omniglot"


def load(path: Path) -> dict:
    """A JSON file's content."""
    return json.loads(path.read_text())


def readme(study: str) -> str:
    """A study's README."""
    return (EXPERIMENTS / study / "README.md").read_text()


def accuracies(path: Path) -> torch.Tensor:
    """A recorded evaluation's per-episode accuracies, as `fewshot eval` computed them."""
    return torch.tensor(load(path)["accuracies"])


def percent(mean: float, half: float, signed: bool = False) -> str:
    """'98.75 ± 0.12' (or '+0.31 ± 0.08') from fractions."""
    return f"{100 * mean:{'+' if signed else ''}.2f} ± {100 * half:.2f}"


def accuracy(values: torch.Tensor) -> str:
    """Per-episode accuracies as a table's cell: mean ± 95% CI (%)."""
    return percent(float(values.mean()), ci95(values))


def difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """b − a paired over the episodes, as a table's cell."""
    return percent(float((b - a).mean()), ci95(b - a), signed=True)


def tables(text: str, header: str) -> list[list[str]]:
    """The rows of every Markdown table whose header line is `header`, in order."""
    lines = [*text.splitlines(), ""]
    starts = [i + 2 for i, line in enumerate(lines) if line == header]
    return [lines[i : lines.index("", i)] for i in starts]


METHODS = {"protonet": "ProtoNet", "matching": "Matching Networks", "relation": "Relation Networks"}


def test_batch_norm_protocol_tables_are_its_evaluations():
    evals, text = EXPERIMENTS / "batch_norm_protocol" / "evals", readme("batch_norm_protocol")
    runs = sorted(evals.glob("*.running.json"))
    header = "| method | shape | queries | model | running | transductive | difference | paper |"
    assert len(tables(text, header)[0]) == len(runs) == 13
    for path in runs:
        model = path.name.split(".")[0]
        running = load(path)
        own = load(path.with_name(path.name.replace("running", "transductive")))
        assert (running["batch_norm"], own["batch_norm"]) == ("running", "transductive")
        for key in ("checkpoint_sha256", "way", "shot", "query", "episodes", "seed", "precision"):
            assert running[key] == own[key], key  # the same model on the same episodes
        a, b = torch.tensor(running["accuracies"]), torch.tensor(own["accuracies"])
        shape = f"{running['way']}-way {running['shot']}-shot"
        cells = [METHODS[model.split("_")[0]], shape, str(running["query"]), f"`{model}`"]
        cells += [accuracy(a), accuracy(b), difference(a, b)]
        assert "| " + " | ".join(cells) + " |" in text
    header = "| shape | model | running | backbone only | difference | transductive |"
    (rows,) = tables(text, header)
    assert len(rows) == 2
    for path in sorted(evals.glob("*.backbone_only.json")):
        alone = load(path)
        running = load(path.with_name(path.name.replace("backbone_only", "running")))
        assert alone["checkpoint_sha256"] == running["checkpoint_sha256"]
        a, b = torch.tensor(running["accuracies"]), torch.tensor(alone["accuracies"])
        own = accuracies(path.with_name(path.name.replace("backbone_only", "transductive")))
        cells = [f"{alone['way']}-way {alone['shot']}-shot", f"`{path.name.split('.')[0]}`"]
        cells += [accuracy(a), accuracy(b), difference(a, b), accuracy(own)]
        assert "| " + " | ".join(cells) + " |" in rows


STEPS = (1, 2, 3, 5, 10, 20)


def steps_header(*first: str) -> str:
    """A steps table's header line."""
    return "| " + " | ".join([*first, *(f"{s} step{'s' if s > 1 else ''}" for s in STEPS)]) + " |"


def test_maml_test_steps_tables_are_its_evaluations_of_the_shipped_models():
    evals, text = EXPERIMENTS / "maml_test_steps" / "evals", readme("maml_test_steps")
    names = {"maml": "MAML", "fomaml": "first-order MAML", "imaml": "iMAML", "anil": "ANIL"}
    rows = {"accuracy": [], "difference": [], "probe": []}
    for model, name in names.items():
        checkpoint = MODELS / f"{model}_conv4_5way1shot_cpu.pt"
        config = load_checkpoint(checkpoint)["config"]["method_options"]
        own = config.get("eval_inner_steps", config["inner_steps"])  # iMAML: its training's
        stem = f"{checkpoint.stem}.{file_sha256(checkpoint)[:12]}"  # the shipped model's
        for shot in (1, 5):
            found = {s: evals / f"{stem}.5w{shot}s.{s}steps.json" for s in STEPS}
            assert all(load(path)["inner_steps"] == s for s, path in found.items())
            values = {s: accuracies(path) for s, path in found.items()}
            cells = [accuracy(values[s]) + ("*" if s == own else "") for s in STEPS]
            rows["accuracy"].append(f"| {name} | {shot} | " + " | ".join(cells) + " |")
            below = {s: int((values[s] < 0.9).sum()) for s in STEPS}
            cells = [f"{difference(values[own], values[s])} ({below[s]})" for s in STEPS]
            rows["difference"].append(f"| {name} | {shot} | " + " | ".join(cells) + " |")
            # The adaptation written out: its curves, and its episodes fewshot eval's.
            probe = load(evals / f"{stem}.5w{shot}s.probe200x20.json")
            for s, path in found.items():
                evaluated = load(path)["accuracies"][: probe["episodes"]]
                assert probe["episode_accuracies"][s] == pytest.approx(evaluated, abs=1e-6)
            cells = [f"{probe['objective'][k]:.3f} / {100 * probe['accuracy'][k]:.1f}"
                     for k in (0, 1, 2, 3, 5, 10, 15, 20)]  # fmt: skip
            rows["probe"].append(f"| {name} | {shot} | " + " | ".join(cells) + " |")
    probe = "| method | shot | 0 | 1 | 2 | 3 | 5 | 10 | 15 | 20 |"
    assert tables(text, steps_header("method", "shot")) == [rows["accuracy"], rows["difference"]]
    assert tables(text, probe) == [rows["probe"]]


def test_the_shipped_anil_takes_the_test_steps_its_validation_episodes_chose():
    evals, text = EXPERIMENTS / "maml_test_steps" / "evals", readme("maml_test_steps")
    checkpoint = MODELS / "anil_conv4_5way1shot_cpu.pt"
    stem = f"{checkpoint.stem}.{file_sha256(checkpoint)[:12]}"
    paths = {(s, k): evals / f"{stem}.val5w{k}s.{s}steps.json" for s in STEPS for k in (1, 5)}
    assert all(load(path)["split"] == "val" for path in paths.values())
    values = {key: accuracies(path) for key, path in paths.items()}
    # The best mean over both shots, the fewest steps on a tie.
    chosen = max(STEPS, key=lambda s: (sum(float(values[s, k].mean()) for k in (1, 5)), -s))
    shipped = load(MODELS / "anil_conv4_5way1shot_cpu.json")["method_options"]
    options = load_checkpoint(checkpoint)["config"]["method_options"]
    assert chosen == shipped["eval_inner_steps"] == options["eval_inner_steps"] == 20
    rows = [
        f"| {shot} | "
        + " | ".join(accuracy(values[s, shot]) + ("*†" if s == chosen else "") for s in STEPS)
        + " |"
        for shot in (1, 5)
    ]
    assert tables(text, steps_header("shot")) == [rows]


def split_figures(root: Path) -> list[str]:
    """A data root's Omniglot split as the table gives it: characters trained on / tested on,
    the test alphabets, and the test characters of an alphabet trained on."""
    lists = root / "omniglot" / "splits" / "vinyals"

    def characters(split: str) -> set[tuple[str, ...]]:
        return {tuple(name.split("/")[:2]) for name in (lists / f"{split}.txt").read_text().split()}

    trainval, test = characters("trainval"), characters("test")
    seen = {a for a, _ in trainval}
    return [
        f"{len(trainval)} / {len(test)}",
        str(len({a for a, _ in test})),
        str(sum(a in seen for a, _ in test)),
    ]


def test_relation_character_split_table_is_its_split_and_evaluations(
    tmp_path, omniglot_test, omniglot_val
):
    # omniglot_test and omniglot_val: the suite's Omniglot files decoded once for every test.
    from experiments.relation_character_split.split import character_split
    from fewshot.datasets import REPO_DATA, load_split

    character_split(REPO_DATA, tmp_path, seed=1)
    lists = {
        split: (tmp_path / "omniglot" / "splits" / "vinyals" / f"{split}.txt").read_text().split()
        for split in ("train", "val", "trainval", "test")
    }
    assert lists["train"] + lists["val"] == lists["trainval"]
    with open(REPO_DATA / "omniglot" / "omniglot_index.csv", newline="") as f:
        index = {(r["alphabet"], r["character"]) for r in csv.DictReader(f)}
    named = [tuple(name.split("/")[:2]) for name in lists["trainval"] + lists["test"]]
    assert sorted(named) == sorted(c for c in index for _ in range(4))  # each rotated 4 ways
    study = "relation_character_split"
    evals, text = EXPERIMENTS / study / "evals", readme(study)
    random_test = load(next(evals.glob("random.*.5w1s.json")))
    # The very test images the random-split model was tested on.
    split = load_split("omniglot", "test", tmp_path)
    assert split.fingerprint() == random_test["dataset_fingerprint"]
    for name, root in (("random characters", tmp_path), ("Vinyals", REPO_DATA)):
        stem = name.split()[0].lower()
        (running,) = evals.glob(f"{stem}.*.5w1s.json")
        own = running.with_name(running.name.replace(".json", ".transductive.json"))
        assert (load(running)["transductive"], load(own)["transductive"]) == (False, True)
        cells = [name, *split_figures(root), accuracy(accuracies(running))]
        cells += [accuracy(accuracies(own)), f"`{load(running)['checkpoint']}`"]
        assert "| " + " | ".join(cells) + " |" in text


def test_maml_vs_learn2learn_comparison_is_its_recorded_fewshot_compare():
    compared = load(EXPERIMENTS / "maml_vs_learn2learn" / "compare.json")
    a, b = (torch.tensor(compared[arm]["accuracies"]) for arm in "ab")
    difference = paired_ci(a, b)
    assert difference.mean == pytest.approx(compared["difference"]["mean"], abs=1e-12)
    assert difference.ci95 == pytest.approx(compared["difference"]["ci95"], abs=1e-12)
    assert difference.p_value == pytest.approx(compared["difference"]["p_value"], rel=1e-6)
    text = readme("maml_vs_learn2learn")
    for arm, label in (("a", "fewshot (`--method maml`)"), ("b", "learn2learn")):
        shown = f"{compared[arm]['accuracy']:.2f} ± {compared[arm]['ci95']:.2f} %"
        assert f"| {label}" in text and f"| {shown} |" in text
    assert f"{100 * difference.mean:+.2f} ± {100 * difference.ci95:.2f} points" in text


def test_maml_trained_by_learn2learn_takes_fewshots_first_step(
    tmp_path, tiny_omniglot_root, omniglot_test, omniglot_val, monkeypatch
):
    # omniglot_test and omniglot_val: the suite's Omniglot files decoded once for every test.
    pytest.importorskip("learn2learn")
    from experiments.maml_vs_learn2learn.l2l_maml import main
    from fewshot import methods
    from fewshot.evaluation.metrics import read_metrics

    for registry in (methods.METHODS, methods.TRAINING_DEFAULTS, methods.UNUSED_SETTINGS):
        monkeypatch.setitem(registry, "maml_learn2learn", None)  # the registration undone after
    flags = [
        "--dataset", "omniglot", "--data-root", str(tiny_omniglot_root), "--backbone", "conv4",
        "--backbone-options", '{"downsample": "stride"}', "--method-options",
        '{"inner_steps": 1, "inner_lr": 0.4, "eval_inner_steps": 3}', "--query", "5",
        "--val-query", "5", "--val-episodes", "2", "--epochs", "1", "--episodes-per-epoch", "2",
        "--episodes-per-batch", "2", "--optimizer", "adam", "--lr", "0.001", "--lr-schedule",
        "[]", "--amp", "off", "--no-channels-last", "--device", "cpu",
    ]  # fmt: skip
    losses = {}
    for method in ("maml", "maml_learn2learn"):
        assert main(["train", "--method", method, *flags, "--out", str(tmp_path / method)]) == 0
        losses[method] = read_metrics(tmp_path / method)[0].train_loss
    assert losses["maml_learn2learn"] == pytest.approx(losses["maml"], abs=1e-5)


def test_resnet12_rehearsal_tables_are_its_runs_logs():
    import yaml

    from fewshot.evaluation.metrics import read_metrics
    from fewshot.training.settings import read_config_file

    study = EXPERIMENTS / "resnet12_rehearsal"
    spec, text = yaml.safe_load((study / "spec.yaml").read_text()), readme("resnet12_rehearsal")
    assert spec["overrides"] == {
        "data_root": "runs/rehearsal/data", "epochs": 3, "val_episodes": 200, "device": "cpu"
    }  # fmt: skip
    for name, variant in spec["matrix"]["model"].items():
        assert variant["config"] == f"models/miniimagenet/{name}.json"
        per_step = read_config_file(variant["config"])["episodes_per_batch"]
        steps = variant["episodes_per_epoch"] // per_step  # per epoch
        rows = read_metrics(study / f"{name}.metrics.jsonl")
        first, last = rows[0], rows[-1]
        cells = [name, str(len(rows) * variant["episodes_per_epoch"]), last.precision]
        cells += [f"{first.train_loss:.3f} → {last.train_loss:.3f}"]
        cells += [f"{first.train_acc:.1f} → {last.train_acc:.1f}"]
        cells += [f"{first.val_acc:.1f} → {last.val_acc:.1f}"]
        cells += [f"{sum(r.seconds for r in rows) / (len(rows) * steps):.1f}"]
        assert "| " + " | ".join(cells) + " | " in text  # then the recorded time and memory
        epochs = [
            f"| {r.epoch} | {r.lr:g} | {r.train_loss:.3f} | {r.train_acc:.1f} | "
            f"{r.val_acc:.1f} ± {r.val_ci95:.1f} | {r.seconds:.0f} | {r.seconds / steps:.1f} |"
            for r in rows
        ]
        assert epochs in tables(text, "| epoch | lr | loss | train acc (%) | val acc (%) | s in "
                                "steps | s per step |")  # fmt: skip
    defaults = [
        f"| {r.epoch} | {r.train_loss:.3f} | {r.train_acc:.1f} % | {r.val_acc:.2f} ± "
        f"{r.val_ci95:.2f} % |"
        for r in read_metrics(study / "resnet12_defaults_omniglot.metrics.jsonl")
    ]
    header = "| epoch (50 episodes) | training loss | training accuracy | validation, 500 episodes"
    assert tables(text, header + " 5-way 1-shot |") == [defaults]


def test_the_rehearsal_data_is_a_miniimagenet_data_root(tmp_path):
    from experiments.resnet12_rehearsal.rehearsal import main
    from fewshot.datasets import load_split

    main(["--data", str(tmp_path), "--per-class", "2"])
    for split, classes in (("train", 64), ("val", 16), ("test", 20)):
        data = load_split("miniimagenet", split, tmp_path)
        assert len(data.class_names) == classes and data.images.shape[1:] == (3, 84, 84)
        assert len(data.labels) == 2 * classes


def test_pmf_omniglot_paired_differences_are_its_evaluations():
    study, text = EXPERIMENTS / "pmf_omniglot", " ".join(readme("pmf_omniglot").split())

    def tested(folder: str, run: str) -> Path:
        return study / folder / "evals" / run / "5w10s.json"

    heads = [tested("p", "seed=0"), tested("pm", "arm=u1,seed=0"), tested("pm", "arm=u5,seed=0")]
    tuned = [tested("pf", "seed=0"), tested("pmf", "arm=u1,seed=0"), tested("pmf", "arm=u5,seed=0")]
    rows = ["P (no meta stage)", "P>M, U = 1", "P>M, U = 5"]
    for row, head, fine in zip(rows, heads, tuned, strict=True):
        a, b = accuracies(head), accuracies(fine)
        assert f"| {row} | {accuracy(a)} | {accuracy(b)} | {load(fine)['pmf_lr']:g} |" in text
        assert difference(a, b) == "+0.00 ± 0.00"  # fine-tuning − head: lr 0 chosen
    for arms in (heads, tuned):
        p, u1, u5 = map(accuracies, arms)
        assert (difference(p, u1), difference(u1, u5)) == ("+0.05 ± 0.09", "+0.00 ± 0.00")
    assert "U = 1 − P +0.05 ± 0.09 points (head and fine-tuned alike); U = 5 − U = 1 +0.00" in text
