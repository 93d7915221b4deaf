"""Every study driver in experiments/ runs end to end in its --smoke mode (seconds, on small data),
writes its outputs into the folder the test gives it, and leaves the recorded results alone."""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from datafiles import jpeg, write_digits, write_tar

from experiments.smoke import OMNIGLOT_CLASSES, omniglot_root, smoke_folder
from fewshot.datasets import load_split
from fewshot.datasets.cifar10 import CIFAR10_CLASSES

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


OMNIGLOT = ("--data-root", "{smoke_omniglot}")
DRIVERS = {
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
    "figures": Driver(
        "experiments.figures.figures",
        ("--out", "{out}"),
        ("reproduction.png", "ehg_gain.png", "zoo_curves.png"),
        check_figures,
    ),
}
# Over ~20 s each on the project's loaded 2-core CPU.
SLOW: set[str] = set()
# Modules of the study folders that are not drivers: the rehearsal's image generator and data
# writer, the relation study's split writer, fewshot with the learn2learn arm's method (tested
# in tests/test_study_commands.py), the cross-domain suite's data (tested below).
HELPERS = {
    "experiments.cross_domain.data",
    "experiments.maml_vs_learn2learn.l2l_maml",
    "experiments.relation_character_split.split",
    "experiments.resnet12_rehearsal.rehearsal",
    "experiments.resnet12_rehearsal.synthetic",
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
    """Small stand-ins of the cross-domain suite's sources: MNIST and Fashion-MNIST IDX files,
    CIFAR-10's test JPEGs in class folders in a tar.gz (ten classes of six shades)."""
    root = write_digits(tmp_path_factory.mktemp("cross_domain"), n_train=10, n_test=200)
    members = {
        f"cifar10_jpeg/test/{name}/{i:04d}.jpg": jpeg((25 * c, 40 * i, 255 - 25 * c))
        for c, name in enumerate(CIFAR10_CLASSES)
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


def test_the_cross_domain_data_are_folders_written_once(cross_domain_source, tmp_path, capsys):
    from experiments.cross_domain.data import main

    argv = ["--source", str(cross_domain_source), "--out", str(tmp_path), "--per-class", "4"]
    main(argv)
    data = tmp_path / "cross_domain_data"
    for name in ("mnist", "fashion_mnist", "cifar10"):
        classes = sorted((data / name / "test").iterdir())
        assert len(classes) == 10 and all(len(list(c.glob("*.png"))) == 4 for c in classes)
    assert (data / "fashion_mnist" / "test" / "t_shirt_top").is_dir()
    assert "cifar10: 40 test images of 10 classes" in capsys.readouterr().out
    main(argv)  # each set is written once
    assert capsys.readouterr().out == ""
    assert sorted(p.name for p in data.iterdir()) == ["cifar10", "fashion_mnist", "mnist"]


def test_a_missing_source_is_one_line(tmp_path, capsys):
    # The cross-domain data are read from --source: a wrong folder used to end in a traceback.
    from experiments.cross_domain.data import main

    missing = tmp_path / "nowhere"
    with pytest.raises(SystemExit) as stop:
        main(["--source", str(missing), "--out", str(tmp_path / "runs")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cross_domain: error: --source {missing}: missing IDX file")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "runs" / "cross_domain_data" / "mnist").exists()
