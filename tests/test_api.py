"""The Python API is the command line's equal: the same layered defaults, the same runs and
results, the same refusals with the same one-line messages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from datafiles import cut_omniglot_root

import fewshot
from fewshot.cli.main import build_parser, main
from fewshot.datasets import REPO_DATA
from fewshot.methods import method_names

REPO = Path(__file__).resolve().parents[1]
TINY = dict(epochs=1, episodes_per_epoch=2, episodes_per_batch=2, val_episodes=2, query=2)
TINY_EVAL = dict(episodes=3, query=2, device="cpu")


def flags(values: dict) -> list[str]:
    """Keyword settings as command-line flags."""
    return [arg for key, value in values.items() for arg in (f"--{key.replace('_', '-')}", value)]


def from_command_line(argv: list[str]):
    """The settings objects `fewshot ARGV` builds."""
    args = build_parser().parse_args(argv)
    return args._command.build_settings(args)[-1]


@pytest.mark.parametrize("method", list(method_names()))
def test_settings_built_in_python_take_the_command_lines_defaults(method):
    assert fewshot.TrainSettings(method=method) == from_command_line(["train", "--method", method])


@pytest.mark.parametrize("backbone", ["conv4", "resnet12"])
def test_a_backbones_defaults_with_its_head_apply_in_python(backbone):
    argv = ["train", "--backbone", backbone, "--head", "ridge"]
    assert fewshot.TrainSettings(backbone=backbone, head="ridge") == from_command_line(argv)


def test_a_given_value_overrides_a_method_default_or_is_refused_as_there():
    with pytest.raises(fewshot.FewshotError) as refused:
        fewshot.TrainSettings(method="maml", channels_last=True)
    assert str(refused.value) == (
        "channels_last does not apply to --method maml (got True; leave it at False)"
    )


@pytest.mark.parametrize("method", list(method_names()))
def test_every_method_trains_and_evaluates_from_python(method, tiny_omniglot_root, tmp_path):
    run = fewshot.train(
        method=method, **TINY, out=str(tmp_path / method), data_root=str(tiny_omniglot_root)
    )
    assert {p.name for p in run.iterdir()} >= {"best.pt", "last.pt", "metrics.jsonl"}
    # The MAML family records the formulation chosen for the device (a loop per thread here).
    adapts = method in ("maml", "fomaml", "anil", "imaml")
    assert json.loads((run / "config.json").read_text()).get("batching") == (
        "threads" if adapts else None
    )
    out = tmp_path / "eval.json"
    result = fewshot.evaluate(run, **TINY_EVAL, out=str(out), data_root=str(tiny_omniglot_root))
    record = json.loads(out.read_text())
    assert (result.accuracy, result.ci95, result.episodes) == (
        record["accuracy"],
        record["ci95"],
        3,
    )


def test_python_and_command_line_give_the_same_run(tiny_omniglot_root, tmp_path, monkeypatch):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    values = {**TINY, "amp": "off", "seed": 3}
    api_run = fewshot.train(**values, out=str(tmp_path / "api"))
    assert (
        main(
            [
                "train",
                *flags({k: str(v) for k, v in values.items()}),
                "--out",
                str(tmp_path / "cli"),
            ]
        )
        == 0
    )
    api_rows = (api_run / "metrics.jsonl").read_text().splitlines()
    cli_rows = (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()
    # Everything but the wall-clock time of the epoch.
    strip = [{k: v for k, v in json.loads(r).items() if "second" not in k} for r in api_rows]
    assert strip == [
        {k: v for k, v in json.loads(r).items() if "second" not in k} for r in cli_rows
    ]
    difference = fewshot.compare(api_run, tmp_path / "cli", **TINY_EVAL)
    assert difference.mean == 0


def test_a_resumed_run_and_a_config_file_work_as_on_the_command_line(
    tiny_omniglot_root, tmp_path, monkeypatch
):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"method": "anil", **TINY}))
    run = fewshot.train(config=str(config), out=str(tmp_path / "run"))
    assert json.loads((run / "config.json").read_text())["method"] == "anil"
    fewshot.train(resume=str(run / "last.pt"), epochs=2)
    epochs = [json.loads(r)["epoch"] for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]


def test_pretraining_and_compare_seeds_from_python(tiny_omniglot_root, tmp_path, monkeypatch):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    runs = [
        fewshot.pretrain(
            epochs=1, batch_size=64, val_episodes=2, seed=s, out=str(tmp_path / f"p{s}")
        )
        for s in range(4)
    ]
    difference = fewshot.compare_seeds(runs[:2], runs[2:], **TINY_EVAL)
    assert difference.n == 2


@pytest.mark.parametrize(
    ("call", "argv"),
    [
        (lambda: fewshot.train(way=0), ["train", "--way", "0"]),
        (
            lambda: fewshot.train(method="maml", channels_last=True),
            ["train", "--method", "maml", "--channels-last"],
        ),
        (lambda: fewshot.train(nonsense=1), None),
        (lambda: fewshot.evaluate("no/such.pt"), ["eval", "--checkpoint", "no/such.pt"]),
        (lambda: fewshot.pretrain(classifier="linear", scale=3.0), ["pretrain", "--scale", "3"]),
    ],
)
def test_refusals_are_the_command_lines_one_line_messages(call, argv, capsys):
    with pytest.raises(fewshot.FewshotError) as refused:
        call()
    if argv is None:  # no flag of that name: the command line's parser refuses it itself
        assert str(refused.value) == "flags: unknown keys nonsense"
        return
    assert main(argv) == 2
    command = " ".join(argv[:1])
    assert capsys.readouterr().err.strip() == f"fewshot {command}: error: {refused.value}"


def test_settings_and_keyword_values_are_not_mixed():
    with pytest.raises(fewshot.FewshotError, match="either a settings object"):
        fewshot.train(fewshot.TrainSettings(), epochs=2)


# The pages whose Python examples are complete programs, run as they are written.
EXAMPLE_PAGES = ["README.md", "docs/reference/python-api.md"]


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown page."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.fixture
def small_omniglot_root(tmp_path):
    """The shipped Omniglot with 64 train classes (the quickstart's 60-way episodes) and 24 in
    the other splits: the documented examples as written, in seconds."""
    classes = {"train": 64, "val": 24, "test": 24}
    return cut_omniglot_root(tmp_path / "data", REPO_DATA, classes)


@pytest.mark.slow
@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_the_documented_python_examples_run(page, small_omniglot_root, tmp_path, monkeypatch):
    blocks = python_blocks((REPO / page).read_text())
    assert blocks, f"{page} has no Python example"
    work = tmp_path / "work"
    work.mkdir()
    (work / "models").symlink_to(REPO / "models")  # the examples name the shipped configs
    monkeypatch.chdir(work)
    monkeypatch.setenv("FEWSHOT_DATA", str(small_omniglot_root))
    for block in blocks:
        exec(compile(block, page, "exec"), {})
    assert (work / "runs").is_dir()


def test_path_objects_are_taken_wherever_a_path_is(tiny_omniglot_root, tmp_path):
    run = fewshot.train(
        data_root=tiny_omniglot_root,  # a Path, as Python users pass paths
        epochs=1,
        episodes_per_epoch=2,
        val_episodes=2,
        out=tmp_path / "run",
    )
    assert (run / "last.pt").is_file()
    result = fewshot.evaluate(run / "last.pt", data_root=tiny_omniglot_root, **TINY_EVAL)
    assert 0 <= result.accuracy <= 100
    again = fewshot.train(resume=run / "last.pt", epochs=2, episodes_per_epoch=2, val_episodes=2)
    assert again == run


def test_a_config_file_given_as_the_settings_says_where_it_goes():
    with pytest.raises(
        fewshot.FewshotError,
        match=r"settings must be a TrainSettings, got str 'x.json'; a config file goes in config=",
    ):
        fewshot.train("x.json")
