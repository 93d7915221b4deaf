"""Plug-ins from other packages (entry points): the package of docs/guide/your-own-method.md,
built from the page's own code, joins the registries and trains, resumes, evaluates and is
compared with the zoo's ProtoNet from the command line; a plug-in that fails to import (or
exits there), takes a built-in's name or another's, or names the wrong kind of object is refused
in one line naming its package, before any image is read; what one returns is checked where it
first runs, before any checkpoint is saved; a checkpoint names the plug-ins it needs, and their
packages where they are missing."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_errors import error_line
from PIL import Image

from fewshot.backbones import BACKBONES, backbone_names
from fewshot.cli.main import main
from fewshot.datasets import GEOMETRY, READERS, dataset_geometry, dataset_names, load_split
from fewshot.datasets.base import ImageSplit
from fewshot.heads import CLASSIFIERS, HEADS, get_head, head_names, protonet
from fewshot.methods import (
    METHODS,
    TRAINING_DEFAULTS,
    UNUSED_SETTINGS,
    build_method,
    method_names,
)
from fewshot.methods.embedding import build_embedding_method
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.plugins import check_installed
from fewshot.training.checkpoint import load_trained, plugins_needed
from fewshot.training.settings import TrainSettings

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "guide" / "your-own-method.md"
ZOO_PROTONET = "models/omniglot/protonet_conv4_trainval.pt"
REGISTRIES = [METHODS, TRAINING_DEFAULTS, UNUSED_SETTINGS, HEADS, CLASSIFIERS, BACKBONES]
REGISTRIES += [READERS, GEOMETRY]
NAMES = [method_names(), head_names(), backbone_names(), dataset_names()]


def fenced(language: str) -> list[str]:
    """The contents of the page's fenced blocks of `language`, in order."""
    pattern = rf"^```{language}\n(.*?)^```$"
    return re.findall(pattern, PAGE.read_text(), flags=re.MULTILINE | re.DOTALL)


def page_package(folder: Path) -> Path:
    """The page's package written into `folder`: its pyproject.toml and its module (the page's
    one TOML block and first Python block)."""
    (pyproject,) = fenced("toml")
    module = fenced("python")[0]
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(pyproject)
    (folder / "fewshot_mine.py").write_text(module)
    return folder


def installed(
    site: Path, package: str, points: dict[str, dict[str, str]], modules: dict[str, str]
) -> None:
    """An installed distribution `package` 0.1 in `site`, as pip leaves one: its metadata, its
    entry points ({group: {name: "module:object"}}) and its modules ({name: source})."""
    info = site / f"{package.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    lines = [
        f"[{group}]\n" + "".join(f"{n} = {v}\n" for n, v in names.items())
        for group, names in points.items()
    ]
    (info / "entry_points.txt").write_text("\n".join(lines))
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)


def forget(folder: Path, kept: list[dict]) -> None:
    """Every registry as in `kept` (taken before any plug-in joined), no entry-point group read
    and no module of `folder` imported: as a fresh process finds them."""
    for registry, before in zip(REGISTRIES, kept, strict=True):
        registry.clear()
        registry.update(before)
    for names in NAMES:
        names._points, names._loaded = None, {}
    for name, module in list(sys.modules.items()):  # the next test's modules of one name
        if str(getattr(module, "__file__", None)).startswith(str(folder)):
            del sys.modules[name]


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder of installed distributions on sys.path, no entry-point group read yet; every
    registry as it was before, afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    kept = [dict(registry) for registry in REGISTRIES]
    for names in NAMES:
        monkeypatch.setattr(names, "_points", None)
        monkeypatch.setattr(names, "_loaded", {})
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    forget(folder, kept)


def refusal(capsys, tmp_path, *flags: str) -> str:
    """The one line `fewshot train` refuses `flags` with (exit 2), on a data root without
    images: refused before any is read."""
    empty = tmp_path / "no_images"
    empty.mkdir(exist_ok=True)
    argv = ["train", *flags, "--data-root", str(empty), "--out", str(tmp_path / "run")]
    return error_line(capsys, [*argv, "--device", "cpu"])


def test_the_pages_plugins_join_the_registries(site):
    installed(
        site,
        "fewshot-mine",
        {
            "fewshot.methods": {"mine": "fewshot_mine:MINE"},
            "fewshot.heads": {"manhattan": "fewshot_mine:manhattan"},
            "fewshot.backbones": {"tiny": "fewshot_mine:Tiny"},
        },
        {"fewshot_mine": fenced("python")[0]},
    )
    assert "mine" not in list(method_names())  # listed once read, not before
    settings = TrainSettings(method="mine", head="manhattan", backbone="tiny", lr=0.01)
    assert (settings.optimizer, settings.weight_decay) == ("adam", 0.0)  # the method's defaults
    assert settings.lr == 0.01  # under the values given
    assert "mine" in list(method_names()) and "manhattan" in CLASSIFIERS
    model = build_method({**settings.to_dict(), "in_channels": 1, "image_size": 28})
    assert type(model).__name__ == "UnitEmbedding" and model.backbone.out_dim == 32
    # The head is the plug-in's, on unit-length embeddings: minus L1 distances to the
    # prototypes (one shot: the support embeddings themselves).
    query, support = torch.randn(2, 6, 8), torch.randn(2, 5, 8)
    labels = torch.arange(5).repeat(2, 1)
    expected = -torch.cdist(F.normalize(query, dim=-1), F.normalize(support, dim=-1), p=1)
    torch.testing.assert_close(model.head(query, support, labels, 5, 1), expected)
    assert get_head("manhattan") is HEADS["manhattan"]


def test_a_run_of_builtins_reads_no_plugin(site):
    installed(site, "fewshot-broken", {"fewshot.methods": {"embedding": "nothere:x"}}, {})
    settings = TrainSettings(method="embedding", backbone="conv4", head="protonet")
    assert METHODS[settings.method] is build_embedding_method  # not shadowed
    assert HEADS["protonet"] is protonet
    assert all(names._points is None for names in NAMES)  # no group was read


def test_a_plugin_that_fails_to_import_is_refused(site, capsys, tmp_path):
    installed(
        site,
        "fewshot-broken",
        {"fewshot.methods": {"mine": "fewshot_broken:build"}},
        {"fewshot_broken": "import nothere\n"},
    )
    line = refusal(capsys, tmp_path, "--method", "mine")
    assert "--method mine: plug-in method 'mine'" in line
    assert "'mine = fewshot_broken:build' of package fewshot-broken 0.1" in line
    assert "failed to import: ModuleNotFoundError: No module named 'nothere'" in line


def test_a_plugin_with_a_builtins_name_is_refused(site, capsys, tmp_path):
    installed(
        site,
        "fewshot-shadow",
        {"fewshot.heads": {"svm": "fewshot_shadow:svm", "mine": "fewshot_shadow:mine"}},
        {"fewshot_shadow": "def svm(query, support, support_labels, way, shot): pass\n"},
    )
    line = refusal(capsys, tmp_path, "--head", "mine")
    assert "--head mine: plug-in head 'svm'" in line
    assert "of package fewshot-shadow 0.1" in line and "takes a built-in head's name" in line
    assert HEADS["svm"].__module__ == "fewshot.heads.svm"


def test_a_test_time_classifiers_name_is_a_builtin_one_for_heads(site, capsys, tmp_path):
    installed(site, "fewshot-logistic", {"fewshot.heads": {"logistic": "fewshot_x:f"}}, {})
    line = refusal(capsys, tmp_path, "--head", "mine")
    assert "plug-in head 'logistic'" in line and "fewshot-logistic 0.1" in line


def test_two_plugins_with_one_name_are_refused(site, capsys, tmp_path):
    for package in ("fewshot-one", "fewshot-two"):
        installed(site, package, {"fewshot.backbones": {"tiny": f"{package[8:]}:Tiny"}}, {})
    line = refusal(capsys, tmp_path, "--backbone", "tiny")
    assert "plug-in backbone 'tiny' is declared twice" in line
    assert "package fewshot-one 0.1" in line and "package fewshot-two 0.1" in line


@pytest.mark.parametrize(
    ("group", "flag", "source", "problem"),
    [
        ("fewshot.methods", "--method", "plugin = {'lr': 1}", "must name a builder"),
        ("fewshot.heads", "--head", "class plugin:\n    pass", "not the class plugin"),
        ("fewshot.heads", "--head", "def plugin(x, y):\n    pass", "must name a head function"),
        ("fewshot.backbones", "--backbone", "def plugin(): pass", "must name an nn.Module class"),
        (
            "fewshot.backbones",
            "--backbone",
            "from torch import nn\n"
            "class plugin(nn.Module):\n"
            "    def __init__(self, in_channels, image_size, width): pass",
            "its options with defaults, not plugin(in_channels, image_size, width)",
        ),
        ("fewshot.datasets", "--dataset", "plugin = print", "must name a fewshot.datasets"),
    ],
)
def test_a_plugin_of_the_wrong_kind_is_refused(
    site, capsys, tmp_path, group, flag, source, problem
):
    installed(
        site, "fewshot-wrong", {group: {"mine": "fewshot_wrong:plugin"}}, {"fewshot_wrong": source}
    )
    line = refusal(capsys, tmp_path, flag, "mine")
    assert line.startswith(f"fewshot train: error: {flag} mine: plug-in ")
    assert "(entry point 'mine = fewshot_wrong:plugin' of package fewshot-wrong 0.1)" in line
    assert problem in line


def test_an_unknown_name_lists_the_plugins(site, capsys, tmp_path):
    installed(site, "fewshot-mine", {"fewshot.methods": {"mine": "fewshot_mine:MINE"}}, {})
    line = refusal(capsys, tmp_path, "--method", "mien")
    builtins = "embedding, matching, relation, maml, fomaml, anil, imaml"
    assert line.endswith(f"--method must be one of {builtins}, mine, got 'mien'")


DATASET = '''
import torch
from fewshot.datasets import DatasetPlugin, ImageSplit

def read(data_root, split):
    """Eight 1x16x16 images of two classes, each image of its class's value."""
    labels = torch.arange(8) % 2
    images = (labels * 200).to(torch.uint8).view(8, 1, 1, 1).expand(8, 1, 16, 16).clone()
    return ImageSplit(images, labels, ["dark", "light"], (0.5,), (0.5,), f"squares {split}")

SQUARES = DatasetPlugin(read, channels=1, image_size=16)
'''


def test_a_plugin_data_set_is_read_by_name(site, tmp_path):
    installed(
        site,
        "fewshot-squares",
        {"fewshot.datasets": {"squares": "squares:SQUARES"}},
        {"squares": DATASET},
    )
    assert dataset_geometry("squares") == (1, 16)
    data = load_split("squares", "val", tmp_path)
    assert isinstance(data, ImageSplit) and data.source == "squares val"
    assert data.images[1].unique().tolist() == [200] and "squares" in list(dataset_names())
    settings = TrainSettings(dataset="squares", data_root=str(tmp_path), way=2, query=1, shot=1)
    assert settings.geometry == (1, 16)


def python(site: Path, cwd: Path, *argv: str) -> str:
    """Run `python ARGV` in `cwd` in a new process that finds the packages installed in
    `site`; its output, after checking it succeeded."""
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr}"
    return done.stdout


def fewshot(site: Path, cwd: Path, *argv: str) -> str:
    """Run `fewshot ARGV` as `python` does."""
    return python(site, cwd, "-m", "fewshot", *argv)


@pytest.mark.slow
def test_the_pages_package_trains_resumes_evaluates_and_compares(tmp_path, tiny_omniglot_root):
    package = page_package(tmp_path / "fewshot-mine")
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--quiet", "--target", str(site), str(package)]
    subprocess.run(pip, check=True, capture_output=True)
    (tmp_path / "models").symlink_to(REPO / "models")
    lines = fenced("bash")[0].splitlines()
    assert lines[0] == "pip install ./fewshot-mine"
    commands = [shlex.split(line)[1:] for line in lines[1:]]
    assert [c[0] for c in commands] == ["train", "train", "eval", "compare"]
    data = ["--data-root", str(tiny_omniglot_root), "--device", "cpu"]
    tiny = ["--epochs", "1", "--episodes-per-epoch", "2", "--episodes-per-batch", "1"]
    tiny += ["--val-episodes", "2", "--query", "2"]
    episodes = ["--episodes", "4"]
    extra = [[*tiny, *data], ["--epochs", "2", *data], [*episodes, *data], [*episodes, *data]]
    outputs = [fewshot(site, tmp_path, *c, *e) for c, e in zip(commands, extra, strict=True)]
    run = tmp_path / "runs" / "mine"
    config = json.loads((run / "config.json").read_text())
    assert (config["method"], config["head"], config["backbone"]) == ("mine", "manhattan", "tiny")
    assert (config["optimizer"], config["lr"]) == ("adam", 0.001)
    metrics = [
        json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics == [1, 2]
    (result,) = run.glob("eval_*.json")
    record = json.loads(result.read_text())
    assert record["episodes"] == 4 and f"{record['accuracy']:.2f}" in outputs[2]
    assert "B - A: " in outputs[3]
    # The checkpoint holds the plug-ins' model: loaded where the package is installed, its
    # head is the L1 one on unit-length embeddings.
    check = (
        "import torch, torch.nn.functional as F\n"
        "from fewshot.training.checkpoint import load_trained\n"
        f"model, config = load_trained({str(run / 'best.pt')!r}, torch.device('cpu'))\n"
        "q, s = torch.randn(1, 3, 32), torch.randn(1, 5, 32)\n"
        "got = model.head(q, s, torch.arange(5)[None], 5, 1)\n"
        "want = -torch.cdist(F.normalize(q, dim=-1), F.normalize(s, dim=-1), p=1)\n"
        "torch.testing.assert_close(got, want)\n"
        "print(type(model).__name__, type(model.backbone).__name__)\n"
    )
    assert python(site, tmp_path, "-c", check).split() == ["UnitEmbedding", "Tiny"]
    # The page's Python example, its run cut to the size of the others.
    small = {"epochs": 1, "episodes_per_epoch": 2, "episodes_per_batch": 1, "val_episodes": 2}
    small |= {"query": 2, "data_root": str(tiny_omniglot_root), "device": "cpu"}
    script = (
        "import fewshot\n"
        "train = fewshot.train\n"
        f"fewshot.train = lambda **values: print(train(**values | {small!r}))\n"
        f"{fenced('python')[1]}"
    )
    folder = tmp_path / python(site, tmp_path, "-c", script).splitlines()[-1]
    config = json.loads((folder / "config.json").read_text())
    assert folder.name == "mine-python"
    assert (config["method"], config["head"], config["backbone"]) == ("mine", "manhattan", "tiny")


def test_a_plugin_backbone_and_head_evaluate_frozen(site, tmp_path, tiny_omniglot_root):
    installed(
        site,
        "fewshot-mine",
        {
            "fewshot.heads": {"manhattan": "fewshot_mine:manhattan"},
            "fewshot.backbones": {"tiny": "fewshot_mine:Tiny"},
        },
        {"fewshot_mine": fenced("python")[0]},
    )
    out = tmp_path / "e.json"
    argv = ["eval", "--backbone", "tiny", "--dataset", "omniglot", "--classifier", "manhattan"]
    argv += ["--data-root", str(tiny_omniglot_root), "--episodes", "10", "--amp", "off"]
    assert main([*argv, "--device", "cpu", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert (record["backbone"], record["classifier"]) == ("tiny", "manhattan")
    assert 0.2 < record["accuracy"] / 100 <= 1


# A training run cut to two steps and two validation episodes, on the CPU.
TINY_RUN = ["--epochs", "1", "--episodes-per-epoch", "2", "--episodes-per-batch", "1"]
TINY_RUN += ["--val-episodes", "2", "--query", "2", "--device", "cpu"]


def train_refusal(capsys, tmp_path, data_root: Path, *flags: str) -> str:
    """The line a tiny `fewshot train` run of `flags` on `data_root` is refused with (exit 2,
    no traceback; its last, after the progress bar it erased), checking it saved no
    checkpoint."""
    run = tmp_path / "run"
    argv = ["train", *flags, *TINY_RUN, "--data-root", str(data_root), "--out", str(run)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert not list(run.glob("*.pt"))
    return re.split(r"[\r\n]", err.strip())[-1]


def one_plugin(site: Path, group: str, name: str, source: str) -> str:
    """Install `source` as package fewshot-NAME 0.1 whose entry point `name` of `group` names
    its `plugin`; how refusals name the entry point and package."""
    module = f"fewshot_{name}"
    installed(site, f"fewshot-{name}", {group: {name: f"{module}:plugin"}}, {module: source})
    return f"(entry point '{name} = {module}:plugin' of package fewshot-{name} 0.1)"


HEAD = "import torch\n\ndef plugin(query, support, support_labels, way, shot):\n    {}\n"


def test_a_head_of_the_wrong_class_count_is_refused_before_any_image(site, capsys, tmp_path):
    # It trained to 0 % and saved checkpoints: the extra class is predicted, never right.
    source = HEAD.format("return torch.zeros(*query.shape[:2], way + 1)")
    package = one_plugin(site, "fewshot.heads", "wide", source)
    line = refusal(capsys, tmp_path, "--head", "wide")
    assert line.startswith(f"fewshot train: error: --head plug-in head 'wide' {package} returned")
    assert (
        "returned a torch.float32 tensor of shape (1, 1, 3) for 1 episode(s) of 1 queries" in line
    )
    assert "and 2 classes: a head returns float logits [B, nq, way] = [1, 1, 2]" in line


def test_a_head_of_the_wrong_shape_is_refused_on_the_first_batch(
    site, capsys, tmp_path, tiny_omniglot_root
):
    # Right on the settings' one-query episode, wrong on more: a traceback in the loss.
    source = HEAD.format("return -torch.cdist(query[:, :1], support)[..., :way]")
    package = one_plugin(site, "fewshot.heads", "first", source)
    line = train_refusal(capsys, tmp_path, tiny_omniglot_root, "--head", "first")
    assert f"error: plug-in head 'first' {package} returned a torch.float32 tensor of shape" in line
    assert "(1, 1, 5) for 1 episode(s) of 10 queries and 5 classes" in line
    assert line.endswith("[B, nq, way] = [1, 10, 5]")


BACKBONE = """
from torch import nn

class plugin(nn.Module):
    def __init__(self, in_channels, image_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.out_dim = {}

    def forward(self, images):
        return self.conv(images).{}
"""


@pytest.mark.parametrize(
    ("out_dim", "features", "returned"),
    [
        (1, "mean((1, 2, 3))", "shape (2,) for 2 images; a backbone returns float features"),
        (16, "amax((2, 3))", "shape (2, 8) for 2 images; a backbone returns float features"),
    ],
    ids=["a number per image", "another out_dim"],
)
def test_a_backbone_whose_features_are_not_out_dim_vectors_is_refused(
    site, capsys, tmp_path, tiny_omniglot_root, out_dim, features, returned
):
    package = one_plugin(site, "fewshot.backbones", "odd", BACKBONE.format(out_dim, features))
    line = train_refusal(capsys, tmp_path, tiny_omniglot_root, "--backbone", "odd")
    assert f"error: plug-in backbone 'odd' {package} returned a torch.float32 tensor of " in line
    assert returned in line
    assert line.endswith(f"[N, out_dim] = [2, {out_dim}] (its out_dim is {out_dim})")


def test_a_method_builder_that_returns_none_is_refused(site, capsys, tmp_path):
    package = one_plugin(site, "fewshot.methods", "nothing", "def plugin(settings):\n    pass\n")
    line = refusal(capsys, tmp_path, "--method", "nothing")
    assert line.endswith(
        f"plug-in method 'nothing' {package} built None: its builder must return a "
        "fewshot.methods.Method"
    )


STEP = """
from fewshot.methods import EmbeddingMethod
from fewshot.methods.embedding import settings_backbone

class Step(EmbeddingMethod):
    def forward(self, images, resplits, shot):
        loss, accuracies = super().forward(images, resplits, shot)
        return {}

def plugin(settings):
    return Step(settings_backbone(settings), settings["head"])
"""


@pytest.mark.parametrize(
    ("returns", "returned"),
    [
        ("loss", "returned (a torch.float32 tensor of shape ())"),
        ("loss.detach(), accuracies", "(1,) (a loss without a gradient))"),
    ],
)
def test_a_methods_training_step_is_checked(
    site, capsys, tmp_path, tiny_omniglot_root, returns, returned
):
    package = one_plugin(site, "fewshot.methods", "step", STEP.format(returns))
    line = train_refusal(capsys, tmp_path, tiny_omniglot_root, "--method", "step")
    assert f"error: plug-in method 'step' {package} returned (" in line and returned in line
    assert line.endswith("a float scalar loss with its gradient and float accuracies [problems]")


def test_a_package_that_exits_at_import_is_named(site, capsys, tmp_path):
    package = one_plugin(site, "fewshot.methods", "quits", "import sys\nsys.exit(3)\n")
    line = refusal(capsys, tmp_path, "--method", "quits")
    assert line.endswith(
        f"--method quits: plug-in method 'quits' {package} exited when imported (sys.exit(3))"
    )


def test_relation_says_a_backbone_of_vectors_returns_vectors(site, capsys, tmp_path):
    installed(
        site,
        "fewshot-mine",
        {"fewshot.backbones": {"tiny": "fewshot_mine:Tiny"}},
        {"fewshot_mine": fenced("python")[0]},
    )
    line = refusal(capsys, tmp_path, "--method", "relation", "--backbone", "tiny")
    assert "--backbone tiny returns vectors [N, 32], and --method relation compares feature" in line
    assert "--backbone-options" not in line


def test_a_checkpoint_names_the_plugins_it_needs(site, capsys, tmp_path, tiny_omniglot_root):
    kept = [dict(registry) for registry in REGISTRIES]
    installed(
        site,
        "fewshot-mine",
        {
            "fewshot.methods": {"mine": "fewshot_mine:MINE"},
            "fewshot.heads": {"manhattan": "fewshot_mine:manhattan"},
            "fewshot.backbones": {"tiny": "fewshot_mine:Tiny"},
        },
        {"fewshot_mine": fenced("python")[0]},
    )
    run, data = tmp_path / "run", ["--data-root", str(tiny_omniglot_root)]
    flags = ["--method", "mine", "--head", "manhattan", "--backbone", "tiny", *TINY_RUN, *data]
    assert main(["train", *flags, "--out", str(run)]) == 0
    capsys.readouterr()
    checkpoint = torch.load(run / "last.pt", weights_only=True)
    assert checkpoint["plugins"] == [
        {"group": group, "name": name, "package": "fewshot-mine", "version": "0.1"}
        for group, name in [
            ("fewshot.methods", "mine"),
            ("fewshot.heads", "manhattan"),
            ("fewshot.backbones", "tiny"),
        ]
    ]
    # Written before checkpoints recorded their plug-ins: loaded as before.
    old = tmp_path / "old.pt"
    torch.save({k: v for k, v in checkpoint.items() if k != "plugins"}, old)
    model, _ = load_trained(old, torch.device("cpu"))
    assert type(model).__name__ == "UnitEmbedding"
    # The package uninstalled: resume, eval and predict name it.
    shutil.rmtree(site)
    site.mkdir()
    importlib.invalidate_caches()
    forget(site, kept)
    missing = "was trained with the method 'mine' of package fewshot-mine 0.1, which is not "
    missing += "installed here: install it"
    last, best = run / "last.pt", run / "best.pt"
    resume = ["train", "--resume", str(last), "--epochs", "2", "--device", "cpu"]
    assert error_line(capsys, resume).endswith(f"--resume {last} {missing}")
    evaluate = ["eval", "--checkpoint", str(best), "--episodes", "2", *data, "--device", "cpu"]
    assert error_line(capsys, evaluate).endswith(f"{best} {missing}")
    support = tmp_path / "support"
    for name in ("a", "b"):
        (support / name).mkdir(parents=True)
        Image.new("L", (28, 28)).save(support / name / "0.png")
    predict = ["predict", "--checkpoint", str(best), "--support", str(support)]
    predict += ["--query", str(support / "a" / "0.png"), "--device", "cpu"]
    assert error_line(capsys, predict).endswith(f"{best} {missing}")
    # Another package's plug-in of the name stands in its place: named, with the one to install.
    installed(
        site,
        "fewshot-other",
        {"fewshot.methods": {"mine": "fewshot_other:MINE"}},
        {"fewshot_other": fenced("python")[0]},
    )
    importlib.invalidate_caches()
    forget(site, kept)  # a fresh process: the group read again
    line = error_line(capsys, evaluate)
    assert line.endswith(
        f"{best} was trained with the method 'mine' of package fewshot-mine 0.1; here 'mine' is "
        "the plug-in of package fewshot-other 0.1: install fewshot-mine in its place"
    )


def test_a_run_of_builtins_needs_no_plugin():
    settings = {"method": "embedding", "head": "svm", "backbone": "conv4", "dataset": "omniglot"}
    assert plugins_needed({**settings, "extra_data": ["mnist"]}) == []
    check_installed([], "x.pt")
    with pytest.raises(FewshotError, match=r"x\.pt has a damaged record of its plug-ins: 'mine'"):
        check_installed(["mine"], "x.pt")
