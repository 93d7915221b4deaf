"""Every study driver in experiments/ runs end to end in its --smoke mode (seconds, on small data),
writes its outputs into the folder the test gives it, and leaves the recorded results alone."""

from __future__ import annotations

import csv
import hashlib
import importlib
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from datafiles import jpeg, write_digits, write_tar

from experiments.smoke import OMNIGLOT_CLASSES, omniglot_root, smoke_folder
from fewshot.datasets import load_split
from fewshot.runtime.io import file_sha256, load_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
NUMBER = r"[-+]?\d+\.\d+"


def load(path: Path) -> dict:
    """A JSON file's content."""
    return json.loads(path.read_text())


def recorded_files() -> dict[str, str]:
    """Every file under experiments/ (no bytecode) and the SHA-256 of its bytes."""
    return {
        str(path.relative_to(EXPERIMENTS)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(EXPERIMENTS.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def correct_percent(counts: list[int], queries: int) -> float:
    """Mean accuracy in percent from per-episode counts of correct queries."""
    return 100 * sum(counts) / (len(counts) * queries)


def check_ehg_seeds(out: Path, printed: str) -> None:
    record = load(out / "results.json")
    models = record["models"]
    assert len(models) == 4  # one head, U = 1 and 5, two seeds
    five = record["summary"]["protonet"]["5w1s"]
    for u in (1, 5):
        accuracies = [m["test"]["5w1s"]["accuracy"] for m in models if m["U"] == u]
        assert five[f"U{u}"]["mean"] == pytest.approx(statistics.mean(accuracies))
        for m in models:
            test = m["test"]["5w1s"]
            assert test["accuracy"] == pytest.approx(correct_percent(test["correct"], 75))
    means = [five[f"U{u}"]["mean"] for u in (1, 5)]
    assert five["U5-U1 seeds"]["mean"] == pytest.approx(means[1] - means[0])
    assert "## Paired differences (percentage points)" in (out / "results.md").read_text()


def check_bf16(out: Path, printed: str) -> None:
    record = load(out / "results.json")
    assert set(record["trainval"]["shapes"]) == {"5w1s", "5w5s", "20w1s", "20w5s"}
    for entry in record["trainval"]["shapes"].values():
        a, b = entry["float32 run, float32 test"][0], entry["bf16 run, bf16 test"][0]
        assert entry["whole pipeline"]["mean"] == pytest.approx(b - a, abs=1e-6)
    ridge = record["heads"]["ridge"]["5w1s"]
    assert len(ridge["float32"][2]) == len(ridge["bf16"][2]) == 2  # one accuracy per seed
    assert "## 2. Ridge and SVM heads" in (out / "results.md").read_text()


def check_convergence(method: str) -> Callable[[Path, str], None]:
    """The check of ehg_convergence's results for `method`."""

    def check(out: Path, printed: str) -> None:
        tests = load(out / "results.json")["methods"][method]["tests"]["U5-U1 5w1s"]
        for u in ("U1", "U5"):
            for seed, accuracy in zip(tests["seeds"], tests[u]["accuracies"], strict=True):
                assert accuracy == pytest.approx(
                    correct_percent(tests["correct"][f"{u} seed {seed}"], 75), abs=1e-4
                )
        means = [statistics.mean(tests[u]["accuracies"]) for u in ("U1", "U5")]
        assert tests["across_seeds"]["mean"] == pytest.approx(means[1] - means[0], abs=1e-4)
        assert tests["per_episode"]["seed"] == 0
        assert (out / f"curves_{method}.png").stat().st_size > 0

    return check


def check_variance(out: Path, printed: str) -> None:
    record = load(out / "ehg_variance.json")
    sigma2, m = record["sigma2"], record["args"]["pool_splits"]
    assert [row["U"] for row in record["rows"]] == [1, 2]
    for row in record["rows"]:
        u = row["U"]  # sampling U of M splits without replacement
        assert row["expected"] == pytest.approx(sigma2 / u * (m - u) / (m - 1))
        assert row["variance"] > 0


def check_fewshot_table(out: Path, printed: str) -> None:
    result = load(out / "runs" / "miniimagenet" / "protonet_conv4_1shot_ehg5" / "test.json")
    cell = f"{result['accuracy']:.2f} ± {result['ci95']:.2f} (52.71 ± 0.69)"
    assert f"| ProtoNet(+EHG) | {cell} |" in (out / "table.md").read_text()


def check_cleaning(out: Path, printed: str) -> None:
    table = load(out / "cleaning_table.json")
    for model in ("sr", "mlp"):
        for method in ("rhg", "trhg", "oehg"):
            run = load(out / f"cleaning_mnist_{model}_{method}_seed0.json")
            assert table[f"mnist/{model}/{method}"]["test_accuracy"] == [run["test_accuracy"]]
            assert table[f"mnist/{model}/{method}"]["f1"] == [run["f1"]]
    assert re.search(rf"\| OEHG \| {NUMBER} \(89\.20\) \|", (out / "cleaning_table.md").read_text())


def check_image_regularization(out: Path, printed: str) -> None:
    table = load(out / "image_table.json")
    assert len(table) == 6  # SR and MLP, three methods, one seed
    run = load(out / "imgreg_mnist_sr_oehg_seed0.json")
    assert table["mnist/sr/oehg"]["test_loss"] == [run["test_loss"]]
    assert "| mnist | SR | acc % |" in (out / "image_table.md").read_text()


def check_ground_truth(out: Path, printed: str) -> None:
    runs = load(out / "ground_truth.json")["runs"]
    assert [r["splits"] for r in runs] == [1, 2]
    for r in runs:
        assert len(r["estimate"]) == len(r["ground_truth"]) == 2  # two outer steps
        assert all(lam > 0 for lam in r["estimate"] + r["ground_truth"])
    assert (out / "ground_truth.png").stat().st_size > 0


def check_lambda_oracle(out: Path, printed: str) -> None:
    means = dict(re.findall(rf"^ *(.+?): ({NUMBER}) \+- {NUMBER} % \(mean over 2", printed, re.M))
    assert set(means) == {"test oracle", "validation, U=2", "validation, U=1"}
    # The oracle picks the best test accuracy in every seed: no choice beats it on average.
    assert all(float(means["test oracle"]) >= float(v) for v in means.values())


def check_regularization(out: Path, printed: str) -> None:
    rows = load(out / "table.json")["rows"]
    assert len(rows) == 5 + 5 + 4 + 3  # lasso, ridge on pyrim; logistic, svm on heart
    for row in rows:
        run = load(out / "runs" / f"{row['dataset']}_{row['model']}_{row['method']}_seed0.json")
        assert row["test_loss"] == pytest.approx(run["test_loss"])
    text = (out / "table.md").read_text()
    assert all(f"### {model}" in text for model in ("lasso", "ridge", "logistic", "svm"))


def check_maml_vs_learn2learn(out: Path, printed: str) -> None:
    compared = load(out / "compare.json")
    a, b = (compared[arm]["accuracies"] for arm in "ab")
    assert compared["difference"]["mean"] == pytest.approx(statistics.mean(b) - statistics.mean(a))
    assert (out / "curves.png").stat().st_size > 0


def check_metric(out: Path, printed: str) -> None:
    record = load(out / "results.json")
    for method in ("matching", "relation"):
        assert len(record["zoo"][method]) == 4  # 5/20-way, 1/5-shot
        ehg = record["ehg"][method]
        assert len(ehg["u1"]) == len(ehg["u5"]) == len(ehg["seconds_u5"]) == 2
        mean = statistics.mean(ehg["u5"]) - statistics.mean(ehg["u1"])
        assert 100 * ehg["difference"]["mean"] == pytest.approx(mean, abs=1e-4)
    assert "EHG, 4 training episodes, 2 seeds" in (out / "results.md").read_text()


def check_matching_similarity(out: Path, printed: str) -> None:
    arms = load(out / "results.json")["arms"]
    assert set(arms) == {"cosine", "scaled_cosine", "euclidean", "euclidean_fce"}
    text = (out / "results.md").read_text()
    for arm, record in arms.items():
        assert len(record["accuracy"]) == 2
        for seed, accuracy in enumerate(record["accuracy"]):
            evaluation = load(out / "evals" / f"{arm}_seed{seed}.json")
            assert 100 * accuracy == pytest.approx(evaluation["accuracy"], abs=1e-4)
        assert f"| {arm} | `" in text


def check_maml_test_steps(out: Path, printed: str) -> None:
    rows = load(out / "results.json")["rows"]
    assert [(r["config"].split("_")[0], r["shot"]) for r in rows] == [
        (name, shot) for name in ("maml", "fomaml", "imaml", "anil") for shot in (1, 5)
    ]
    for r in rows:
        assert r["steps"][str(r["own_steps"])]["difference"] == [0.0, 0.0]
        for steps, entry in r["steps"].items():
            name = f"{r['config']}.{r['checkpoint_sha256']}.5w{r['shot']}s.{steps}steps.json"
            evaluation = load(out / "evals" / name)
            assert evaluation["inner_steps"] == int(steps) and evaluation["shot"] == r["shot"]
            assert 100 * entry["accuracy"][0] == pytest.approx(evaluation["accuracy"], abs=1e-4)
    assert "| ANIL | 5 |" in (out / "results.md").read_text()
    # The adaptation written out gives each episode the accuracy fewshot eval gives it.
    probes = load(out / "results.json")["probe"]["rows"]
    assert [(p["config"], p["shot"]) for p in probes] == [(r["config"], r["shot"]) for r in rows]
    for r in rows:
        name = f"{r['config']}.{r['checkpoint_sha256']}.5w{r['shot']}s"
        written_out = load(out / "evals" / f"{name}.probe2x20.json")["episode_accuracies"]
        for steps in r["steps"]:
            evaluated = load(out / "evals" / f"{name}.{steps}steps.json")["accuracies"]
            assert written_out[int(steps)] == pytest.approx(evaluated, abs=1e-6)
    # ANIL's steps measured on validation episodes, and the best mean over both shots chosen.
    (validated,) = load(out / "results.json")["validation"]
    assert validated["config"] == "anil_conv4_5way1shot_cpu"
    means = {int(k): sum(a[0] for a in v.values()) for k, v in validated["steps"].items()}
    assert sorted(means) == [1, validated["own_steps"]]
    assert means[validated["chosen_steps"]] == max(means.values())
    for steps, shots in validated["steps"].items():
        for shot, (accuracy, _) in shots.items():
            name = f"{validated['config']}.{validated['checkpoint_sha256']}.val5w{shot}s"
            evaluation = load(out / "evals" / f"{name}.{steps}steps.json")
            assert (evaluation["split"], evaluation["inner_steps"]) == ("val", int(steps))
            assert 100 * accuracy == pytest.approx(evaluation["accuracy"], abs=1e-4)
    assert "ANIL on the Omniglot validation classes" in (out / "results.md").read_text()


def check_imaml_inner_loop(out: Path, printed: str) -> None:
    arms = load(out / "results.json")["arms"]
    assert [(a["inner_loop"], a["inner_steps"]) for a in arms] == [
        ("proximal", 5),
        ("pull_back", 16),
        ("pull_back", 5),
    ]
    first = load(out / "evals" / "proximal5.5w1s.json")["accuracies"]
    for arm in arms:
        name = f"{arm['inner_loop']}{arm['inner_steps']}"
        options = load(out / "runs" / "imaml_inner_loop" / name / "config.json")["method_options"]
        assert (options["inner_loop"], options["inner_steps"]) == (
            arm["inner_loop"],
            arm["inner_steps"],
        )
        evaluation = load(out / "evals" / f"{name}.5w1s.json")
        assert evaluation["method_options"] == options  # tested with its own loop and steps
        assert 100 * arm["test"][0] == pytest.approx(evaluation["accuracy"], abs=1e-4)
        if "minus_proximal" in arm:
            b = evaluation["accuracies"]
            expected = sum(y - x for x, y in zip(first, b, strict=True)) / len(b)
            assert arm["minus_proximal"]["mean"] == pytest.approx(expected, abs=1e-9)
    assert "minus_proximal" not in arms[0] and "| pull_back | 16 |" in printed


def check_relation_character_split(out: Path, printed: str) -> None:
    random_arm, vinyals = load(out / "results.json")["arms"]
    assert (random_arm["split"], vinyals["split"]) == ("random characters", "Vinyals")
    folder = out / "runs" / "relation_character_split" / "data" / "omniglot"
    lists = {
        split: (folder / "splits" / "vinyals" / f"{split}.txt").read_text().split()
        for split in ("train", "val", "trainval", "test")
    }
    assert lists["train"] + lists["val"] == lists["trainval"]

    def characters(names: list[str]) -> list[tuple[str, ...]]:
        return list(dict.fromkeys(tuple(name.split("/")[:2]) for name in names))

    trainval, test = characters(lists["trainval"]), characters(lists["test"])
    # Every character of the data once, each with its four rotations as classes.
    with open(folder / "omniglot_index.csv", newline="") as f:
        index = {(r["alphabet"], r["character"]) for r in csv.DictReader(f)}
    assert sorted(trainval + test) == sorted(index)
    assert len(lists["test"]) == 4 * len(test) and len(lists["trainval"]) == 4 * len(trainval)
    seen = {a for a, _ in trainval}
    assert random_arm["test_characters_of_seen_alphabets"] == sum(a in seen for a, _ in test)
    assert (random_arm["train_characters"], random_arm["test_characters"]) == (
        len(trainval),
        len(test),
    )
    for arm in (random_arm, vinyals):
        name = arm["split"].split()[0].lower()
        for key, suffix in (("test", ""), ("test_transductive", ".transductive")):
            (path,) = (out / "evals").glob(f"{name}.*.5w1s{suffix}.json")
            evaluation = load(path)
            assert (
                evaluation["transductive"] == bool(suffix) and evaluation["precision"] == "float32"
            )
            assert 100 * arm[key][0] == pytest.approx(evaluation["accuracy"], abs=1e-4)
    random_eval = load(next((out / "evals").glob("random.*")))
    assert random_eval["checkpoint"] == random_arm["checkpoint"]
    assert vinyals["checkpoint"] == "models/omniglot/relation_conv4_5way1shot.pt"
    assert "| random characters | " in printed and len(random_arm["val_acc"]) == 1


def check_imaml_inner_steps(out: Path, printed: str) -> None:
    results = load(out / "results.json")
    arms = results["arms"]
    assert [a["inner_steps"] for a in arms] == [5, 16]
    for arm in arms:
        config = load(
            out / "runs" / "imaml_inner_steps" / f"steps{arm['inner_steps']}" / "config.json"
        )
        assert config["method_options"]["inner_steps"] == arm["inner_steps"]
        assert config["method"] == "imaml" and config["epochs"] == 1
        for steps, (accuracy, _) in arm["test"].items():
            evaluation = load(
                out / "evals" / f"trained{arm['inner_steps']}.tested{steps}.5w1s.json"
            )
            assert evaluation["inner_steps"] == int(steps)
            assert 100 * accuracy == pytest.approx(evaluation["accuracy"], abs=1e-4)
    a = load(out / "evals" / "trained5.tested5.5w1s.json")["accuracies"]
    b = load(out / "evals" / "trained16.tested16.5w1s.json")["accuracies"]
    expected = sum(y - x for x, y in zip(a, b, strict=True)) / len(a)
    assert results["sixteen_minus_five"]["mean"] == pytest.approx(expected, abs=1e-9)
    assert "| 16 steps |" in (out / "results.md").read_text()


def check_batch_norm_protocol(out: Path, printed: str) -> None:
    rows = load(out / "results.json")["rows"]
    assert [r["method"] for r in rows].count("ProtoNet") == 4
    assert [
        (r["way"], r["shot"], r["query"]) for r in rows if r["method"] == "Relation Networks"
    ] == [
        (5, 1, 15),
        (5, 1, 1),
        (5, 5, 15),
        (20, 1, 15),
        (20, 5, 15),
    ]
    for r in rows:
        name = f"{r['config']}.{r['way']}w{r['shot']}s{r['query']}q"
        running = load(out / "evals" / f"{name}.running.json")
        own = load(out / "evals" / f"{name}.transductive.json")
        assert own["batch_norm"] == "transductive" and own["transductive"] and not own["cache"]
        assert not running["transductive"] and running["query"] == own["query"] == r["query"]
        assert 100 * r["running"][0] == pytest.approx(running["accuracy"], abs=1e-4)
        paired = torch.tensor(own["accuracies"]) - torch.tensor(running["accuracies"])
        assert r["difference"][0] == pytest.approx(float(paired.mean()), abs=1e-6)
    text = (out / "results.md").read_text()
    assert "| Relation Networks | 5-way 1-shot | 1 | `relation_conv4_5way1shot` |" in text
    backbone = load(out / "results.json")["backbone_only"]
    assert [(r["way"], r["shot"]) for r in backbone] == [(5, 1), (20, 1)]
    for r in backbone:
        name = f"{r['config']}.{r['way']}w{r['shot']}s15q.backbone_only.json"
        accuracies = torch.tensor(load(out / "evals" / name)["accuracies"])
        assert len(accuracies) == 2
        assert r["backbone_only"][0] == pytest.approx(float(accuracies.mean()))
        running = load(out / "evals" / name.replace("backbone_only", "running"))["accuracies"]
        paired = float((accuracies - torch.tensor(running)).mean())
        assert r["difference"][0] == pytest.approx(paired, abs=1e-6)
    # The backbone-only arm tests each row's own model (the 20-way one where it is shipped).
    relation = {
        (r["way"], r["shot"], r["query"]): r["config"] for r in rows if "Rel" in r["method"]
    }
    assert [r["config"] for r in backbone] == [relation[5, 1, 15], relation[20, 1, 15]]
    assert f"| 20-way 1-shot | `{relation[20, 1, 15]}` | " in text


def check_omniglot_reproduction(out: Path, printed: str) -> None:
    rows = load(out / "results.json")["rows"]
    shipped = [(r["config"], r["way"], r["shot"]) for r in rows if r["shipped"]]
    # The 5-shot model, and in the 20-way 5-shot row for want of a 20-way one.
    assert shipped == [("relation_conv4_5way5shot", 5, 5), ("relation_conv4_5way5shot", 20, 5)]
    row = next(r for r in rows if r["shipped"])
    checkpoint = torch.load(out / "zoo" / "relation_conv4_5way5shot.pt", weights_only=True)
    assert set(checkpoint) == {"config", "model", "progress"}  # no optimizer state shipped
    assert row["trained"]["episodes"] == 4 and row["trained"]["epochs"] == 1
    assert (row["trained"]["way"], row["trained"]["shot"]) == (5, 5)
    evaluation = load(out / "evals" / f"relation_conv4_5way5shot.{row['sha256'][:12]}.5w5s.json")
    assert row["accuracy"] == pytest.approx(evaluation["accuracy"], abs=1e-4)
    assert (out / "logs" / "relation_conv4_5way5shot.jsonl").is_file()
    text = (out / "results.md").read_text()
    assert "| Relation Networks | 20-way 5-shot | " in text and "| 5-way 5-shot | 4 | " in text
    assert all(r["why"] for r in rows if not r["shipped"])


def check_omniglot_ehg(out: Path, printed: str) -> None:
    rows = load(out / "ehg_experiment.json")["rows"]
    assert [(r["head"], r["U"]) for r in rows] == [
        (h, u) for h in ("protonet", "ridge") for u in (1, 5)
    ]
    text = (out / "ehg_experiment.md").read_text()
    for r in rows:
        assert f"| {r['head']} | {r['U']} | {r['5w1s'][0]:.2f} ± {r['5w1s'][1]:.2f} |" in text


def check_pretraining(out: Path, printed: str) -> None:
    record = load(out / "results.json")
    assert len(record["rows"]) == 8
    assert set(record["rows"]["pretrain + PT-MAP (transductive)"]) == {
        "5-way 1-shot",
        "5-way 5-shot",
    }
    for label, cells in record["rows"].items():
        zoo = record["rows"]["ProtoNet, meta-trained (zoo)"]
        for key, cell in cells.items():
            difference = cell["accuracy"] - zoo[key]["accuracy"]
            assert cell["minus_protonet"] == pytest.approx(difference, abs=1e-4), label
    assert len(record["ehg"]["20-way 5-shot"]["u5"]) == 2


def check_cross_domain(out: Path, printed: str) -> None:
    record = load(out / "results.json")
    rows = record["rows"]
    assert len(rows) == 10  # seven zoo models, the pretrained ResNet-12, two floors
    assert all(set(sets) == {"mnist", "fashion_mnist", "cifar10"} for sets in rows.values())
    for label, sets in rows.items():
        for name, cells in sets.items():
            cell = cells["2"]
            gain = cell["logistic"]["accuracy"] - cell["centroid"]["accuracy"]
            assert cell["logistic − centroid"]["mean"] == pytest.approx(gain, abs=1e-4)
            stem = "_".join(re.findall(r"[a-z0-9]+", label.lower())) + f"_{name}_2shot"
            evaluation = load(out / "evals" / f"{stem}_centroid.json")
            assert evaluation["stage"] == "frozen"
            assert evaluation["episodes"] in (record["episodes"], record["maml_episodes"])
            assert cell["centroid"]["accuracy"] == pytest.approx(evaluation["accuracy"], abs=1e-4)
            assert not Path(evaluation["data_root"]).is_absolute()  # no machine's path
            assert ("centroid − floor" in cell) == ("floor" not in label)
    assert set(record["pmf_rows"]) == {"ProtoNet (trainval)", "ResNet-12 pretrained"}
    tuned = load(out / "evals" / "protonet_trainval_cifar10_2shot_checkpoint_pmf_lr0.001.json")
    assert tuned["classifier"] == "pmf" and tuned["pmf_lr"] == 1e-3
    images = list((out / "runs" / "cross_domain_data" / "cifar10" / "test").glob("*/*.png"))
    assert len(images) == 10 * 4  # every class cut to its first 4 images
    assert "**Fashion-MNIST**" in (out / "results.md").read_text()


def check_pmf(out: Path, printed: str) -> None:
    record = load(out / "results.json")
    rows = record["rows"]
    p_only = "none (stage P frozen)"
    assert set(rows) == {
        p_only,
        "U = 1",
        "U = 5",
        f"U = 1 − {p_only}",
        "U = 5 − U = 1",
        "timm:resnet10t from scratch (no stage P), U = 1",
    }
    for arm in (p_only, "U = 1", "U = 5"):
        head, tuned = rows[arm]["ProtoNet head"], rows[arm]["P>M>F fine-tuning"]
        gain = tuned["accuracy"] - head["accuracy"]
        assert rows[arm]["fine-tuning − head"]["mean"] == pytest.approx(gain, abs=1e-4)
        assert rows[arm]["lr chosen"] in (0.0, 1e-4, 1e-3, 1e-2)
    ehg = rows["U = 5 − U = 1"]["ProtoNet head"]["mean"]
    difference = (
        rows["U = 5"]["ProtoNet head"]["accuracy"] - rows["U = 1"]["ProtoNet head"]["accuracy"]
    )
    assert ehg == pytest.approx(difference, abs=1e-4)
    evals = load(out / "evals" / "u5_pmf.json")
    assert evals["varied"] is True and evals["classifier"] == "pmf" and "pmf_lr" in evals
    assert evals["precision"] == "float32"  # on any CPU: the table does not follow native bf16
    frozen = load(out / "evals" / "p_only_pmf.json")  # P>F: stage P's backbone, frozen
    assert frozen["stage"] == "frozen" and frozen["backbone"] == "resnet12"
    pretrained = out / "runs" / "omniglot_pmf_pretrain_resnet12" / "last.pt"
    assert frozen["backbone_weights_sha256"] == file_sha256(pretrained)


def check_rehearsal(out: Path, printed: str) -> None:
    record = load(out / "runs" / "protonet_resnet12_1shot.run.json")
    assert record["status"] == 0 and record["peak_bytes"] > 0
    rows = [json.loads(line) for line in (out / "protonet_resnet12_1shot.metrics.jsonl").open()]
    assert [r["epoch"] for r in rows] == [1]
    assert re.search(
        r"^\| protonet_resnet12_1shot \| 2 \| ", (out / "results.md").read_text(), re.M
    )


def check_svm_solver(out: Path, printed: str) -> None:
    summary = load(out / "summary.json")
    assert summary["seeds"] == [0, 1] and len(summary["train_seconds"]) == 4
    for way in (5, 20):
        compared = load(out / f"compare_seeds_{way}way.json")
        a, b = ([m["accuracy"] for m in compared[arm]] for arm in "ab")  # percent
        difference = statistics.mean(b) - statistics.mean(a)
        assert 100 * compared["difference"]["mean"] == pytest.approx(difference, abs=1e-4)
        assert (out / f"compare_{way}way_seed1.json").is_file()


def check_figures(out: Path, printed: str) -> None:
    for name in ("reproduction.png", "ehg_gain.png", "zoo_curves.png"):
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG") and (out / "docs" / name).read_bytes() == png
        assert str(out / name) in printed


@dataclass(frozen=True)
class Driver:
    """A driver's module, its smoke arguments ({out} and the data roots' fixture names in
    braces), the files it writes under {out}, and the check of their content (and of what it
    printed)."""

    module: str
    argv: tuple[str, ...]
    outputs: tuple[str, ...]
    check: Callable[[Path, str], None]


def check_zoo_bench(out: Path, printed: str) -> None:
    # The stored results made again equal the shipped ones, file by file (the floor, which
    # the store copies from a bench of its own, aside).
    shipped = REPO / "models" / "bench"
    made = sorted(p.relative_to(out) for p in out.rglob("*.json"))
    assert made == sorted(
        p.relative_to(shipped)
        for p in shipped.rglob("*.json")
        if p.parent.name != "random-conv4-floor"
    )
    for path in made:
        assert json.loads((out / path).read_text()) == json.loads((shipped / path).read_text())
    assert "stored results in" in printed


OMNIGLOT = ("--data-root", "{smoke_omniglot}")
DRIVERS = {
    "ehg_seeds": Driver(
        "experiments.ehg_seeds.study",
        ("--out", "{out}", "--heads", "protonet", *OMNIGLOT),
        ("results.json", "results.md"),
        check_ehg_seeds,
    ),
    "bf16_omniglot": Driver(
        "experiments.bf16_omniglot.study",
        ("--out", "{out}", "--heads", "ridge", *OMNIGLOT),
        ("results.json", "results.md"),
        check_bf16,
    ),
    "ehg_convergence": Driver(
        "experiments.ehg_convergence.study",
        ("--out", "{out}", "--methods", "protonet", "--test-ways", "5", *OMNIGLOT),
        ("results.json", "results.md", "curves_protonet.png", "curves_protonet_seed0.png"),
        check_convergence("protonet"),
    ),
    "ehg_adaptation": Driver(
        "experiments.ehg_adaptation.study",
        ("--out", "{out}", "--methods", "maml", *OMNIGLOT),
        ("results.json", "results.md", "curves_maml.png", "curves_maml_seed0.png"),
        check_convergence("maml"),
    ),
    "ehg_variance": Driver(
        "experiments.ehg_variance.variance",
        ("--out", "{out}/ehg_variance.json", *OMNIGLOT),
        ("ehg_variance.json",),
        check_variance,
    ),
    "fewshot_table": Driver(
        "experiments.fewshot_table.table",
        ("--table", "{out}/table.md", "--device", "cpu"),
        ("table.md",),
        check_fewshot_table,
    ),
    "hpo_cleaning": Driver(
        "experiments.hpo_cleaning.table",
        ("--out", "{out}", "--data-root", "{digits_root}"),
        ("cleaning_table.json", "cleaning_table.md"),
        check_cleaning,
    ),
    "hpo_image_regularization": Driver(
        "experiments.hpo_image_regularization.table",
        ("--out", "{out}", "--data-root", "{digits_10000}", "--device", "cpu"),
        ("image_table.json", "image_table.md"),
        check_image_regularization,
    ),
    "hpo_ground_truth": Driver(
        "experiments.hpo_ground_truth.paths",
        ("--out", "{out}"),
        ("ground_truth.json", "ground_truth.png"),
        check_ground_truth,
    ),
    "hpo_heart": Driver("experiments.hpo_heart.lambda_oracle", (), (), check_lambda_oracle),
    "hpo_regularization": Driver(
        "experiments.hpo_regularization.table",
        ("--out", "{out}"),
        ("table.json", "table.md"),
        check_regularization,
    ),
    "maml_vs_learn2learn": Driver(
        "experiments.maml_vs_learn2learn.study",
        ("--out", "{out}", *OMNIGLOT),
        ("compare.json", "curves.png"),
        check_maml_vs_learn2learn,
    ),
    "matching_similarity": Driver(
        "experiments.matching_similarity.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_matching_similarity,
    ),
    "batch_norm_protocol": Driver(
        "experiments.batch_norm_protocol.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_batch_norm_protocol,
    ),
    "imaml_inner_loop": Driver(
        "experiments.imaml_inner_loop.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_imaml_inner_loop,
    ),
    "imaml_inner_steps": Driver(
        "experiments.imaml_inner_steps.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_imaml_inner_steps,
    ),
    "maml_test_steps": Driver(
        "experiments.maml_test_steps.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_maml_test_steps,
    ),
    "relation_character_split": Driver(
        "experiments.relation_character_split.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_relation_character_split,
    ),
    "omniglot_reproduction": Driver(
        "experiments.omniglot_reproduction.study",
        ("--out", "{out}", "--train", "relation_conv4_5way5shot", *OMNIGLOT),
        ("results.json", "results.md"),
        check_omniglot_reproduction,
    ),
    "metric_omniglot": Driver(
        "experiments.metric_omniglot.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_metric,
    ),
    "omniglot_ehg": Driver(
        "experiments.omniglot_ehg.experiment",
        ("--out", "{out}/ehg_experiment", *OMNIGLOT),
        ("ehg_experiment.json", "ehg_experiment.md"),
        check_omniglot_ehg,
    ),
    "pretraining_omniglot": Driver(
        "experiments.pretraining_omniglot.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_pretraining,
    ),
    "cross_domain": Driver(
        "experiments.cross_domain.study",
        ("--out", "{out}", "--source", "{cross_domain_source}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_cross_domain,
    ),
    "zoo_bench": Driver(
        "experiments.zoo_bench.store",
        ("--out", "{out}"),
        ("omniglot-v1/protonet/5w1s.json", "cross-domain-v1/anil-5w1s-centroid/mnist-1shot.json"),
        check_zoo_bench,
    ),
    "pmf_omniglot": Driver(
        "experiments.pmf_omniglot.study",
        ("--out", "{out}", *OMNIGLOT),
        ("results.json", "results.md"),
        check_pmf,
    ),
    "resnet12_rehearsal": Driver(
        "experiments.resnet12_rehearsal.rehearsal",
        ("--out", "{out}", "--configs", "protonet_resnet12_1shot"),
        ("results.md", "protonet_resnet12_1shot.metrics.jsonl"),
        check_rehearsal,
    ),
    "figures": Driver(
        "experiments.figures.figures",
        ("--out", "{out}"),
        ("reproduction.png", "ehg_gain.png", "zoo_curves.png"),
        check_figures,
    ),
    "svm_solver": Driver(
        "experiments.svm_solver.study",
        ("--out", "{out}", *OMNIGLOT),
        ("summary.json", "compare_5way_seed0.json", "compare_seeds_20way.json"),
        check_svm_solver,
    ),
}
# Over ~20 s each on the project's loaded 2-core CPU.
SLOW = {
    "cross_domain",
    "ehg_convergence",
    "ehg_adaptation",
    "pmf_omniglot",
    "pretraining_omniglot",
    "resnet12_rehearsal",
}
# Modules of the study folders that are not drivers: the rehearsal's image generator, the
# ehg_convergence driver's layout and report, the ehg_seeds driver's report.
HELPERS = {
    "experiments.resnet12_rehearsal.synthetic",
    "experiments.ehg_convergence.layout",
    "experiments.ehg_convergence.report",
    "experiments.ehg_seeds.report",
}


@pytest.fixture(scope="module")
def smoke_omniglot(tmp_path_factory) -> Path:
    """The cut Omniglot of the drivers' smoke mode, written once for them all."""
    return omniglot_root(tmp_path_factory.mktemp("smoke_omniglot"))


@pytest.fixture(scope="module")
def digits_10000(tmp_path_factory) -> Path:
    """MNIST-like files of the image-regularization task's sizes (10000 training and test)."""
    return write_digits(tmp_path_factory.mktemp("digits"), n_train=10000, n_test=10000)


@pytest.fixture(scope="module")
def cross_domain_source(tmp_path_factory) -> Path:
    """Small stand-ins of the cross-domain study's sources: MNIST and Fashion-MNIST IDX files,
    CIFAR-10's test JPEGs in class folders in a tar.gz (ten classes of six shades)."""
    root = write_digits(tmp_path_factory.mktemp("cross_domain"), n_train=10, n_test=200)
    members = {
        f"cifar10_jpeg/test/class{c}/{i:04d}.jpg": jpeg((25 * c, 40 * i, 255 - 25 * c))
        for c in range(10)
        for i in range(6)
    }
    write_tar(root / "cifar10_jpeg" / "test.tar.gz", members)
    return root


@pytest.fixture(autouse=True)
def torch_threads():
    """Drivers set torch's thread count for their runs: give the suite's back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_smoke_output_never_lands_in_a_study_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert smoke_folder(EXPERIMENTS / "ehg_seeds") == Path("runs/smoke/ehg_seeds")
    assert (tmp_path / "runs" / "smoke" / "ehg_seeds").is_dir()
    assert smoke_folder(tmp_path / "mine") == tmp_path / "mine"


def test_smoke_omniglot_is_the_first_classes_of_the_shipped_splits(smoke_omniglot, omniglot_test):
    cut = load_split("omniglot", "test", smoke_omniglot)
    classes = OMNIGLOT_CLASSES["test"]
    assert cut.class_names == omniglot_test.class_names[:classes]
    assert torch.equal(cut.images, omniglot_test.images[: 20 * classes])  # 20 drawings a class
    assert len(load_split("omniglot", "train", smoke_omniglot).class_names) == 5


def test_every_driver_has_a_smoke_run():
    modules = {
        f"experiments.{path.parent.name}.{path.stem}"
        for path in EXPERIMENTS.glob("*/*.py")
        if path.name != "__init__.py"
    }
    assert modules - HELPERS == {driver.module for driver in DRIVERS.values()}
    assert set(DRIVERS) >= SLOW


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=pytest.mark.slow if name in SLOW else ()) for name in DRIVERS],
)
def test_driver_smoke_run(name, tmp_path, monkeypatch, capsys, request):
    driver = DRIVERS[name]
    monkeypatch.chdir(REPO)  # the drivers name the zoo's configs from the repository root
    values = {"out": tmp_path}
    for field in re.findall(r"\{(\w+)\}", " ".join(driver.argv)):
        if field != "out":
            values[field] = request.getfixturevalue(field)
    argv = [arg.format(**values) for arg in driver.argv]
    before = recorded_files()
    monkeypatch.setattr(sys, "argv", [driver.module, "--smoke", *argv])
    importlib.import_module(driver.module).main()
    printed = capsys.readouterr().out
    for output in driver.outputs:
        assert (tmp_path / output).is_file(), f"{name} wrote no {output}"
    driver.check(tmp_path, printed)
    assert recorded_files() == before, "a smoke run changed the recorded results"


def test_the_test_steps_study_writes_its_choice_into_the_model_and_nothing_else(
    tmp_path, monkeypatch
):
    from experiments.maml_test_steps import study

    for suffix in (".json", ".pt"):
        source = REPO / "models" / "omniglot" / f"anil_conv4_5way1shot_cpu{suffix}"
        (tmp_path / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(study, "MODELS", tmp_path)
    study.apply_choice("anil_conv4_5way1shot_cpu", 20)
    before = load(REPO / "models" / "omniglot" / "anil_conv4_5way1shot_cpu.json")
    after = load(tmp_path / "anil_conv4_5way1shot_cpu.json")
    assert after["method_options"].pop("eval_inner_steps") == 20
    before["method_options"].pop("eval_inner_steps")
    assert after == before
    shipped = load_checkpoint(REPO / "models" / "omniglot" / "anil_conv4_5way1shot_cpu.pt")
    changed = load_checkpoint(tmp_path / "anil_conv4_5way1shot_cpu.pt")
    assert changed["config"]["method_options"]["eval_inner_steps"] == 20
    assert changed.keys() == shipped.keys() and changed["progress"] == shipped["progress"]
    assert all(torch.equal(changed["model"][k], v) for k, v in shipped["model"].items())


def test_the_test_steps_study_refuses_to_change_the_models_in_a_smoke_run(capsys):
    from experiments.maml_test_steps.study import parse_args

    with pytest.raises(SystemExit) as stopped:
        parse_args(["--smoke", "--apply"])
    assert stopped.value.code == 2
    assert "--apply changes the shipped models: not with --smoke" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pmf-lrs", "-1"], "pmf lrs must be distinct learning rates >= 0"),
        (["--pmf-lrs", "0.1", "0.1"], "pmf lrs must be distinct learning rates >= 0"),
        (["--pmf-steps", "0"], "pmf steps must be at least 1"),
    ],
)
def test_the_pmf_study_refuses_bad_fine_tuning_options_before_training(flags, message, capsys):
    from experiments.pmf_omniglot.study import parse_args

    with pytest.raises(SystemExit) as stopped:
        parse_args(flags)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_source_is_one_line(tmp_path, capsys):
    # The cross-domain study reads its sets from --source: a wrong folder used to end in a
    # traceback.
    from experiments.cross_domain.study import main

    missing = tmp_path / "nowhere"
    with pytest.raises(SystemExit) as stop:
        main(["--source", str(missing), "--runs", str(tmp_path / "runs"), "--data-only"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cross_domain: error: --source {missing}: missing IDX file")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "runs" / "cross_domain_data" / "mnist").exists()
