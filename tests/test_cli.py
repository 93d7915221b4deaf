"""The command line: train then eval end to end, and one-line errors for bad input."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_errors import error_line

from fewshot.cli.eval import METHOD_SETTINGS
from fewshot.cli.main import COMMANDS, build_parser, main
from fewshot.methods import build_method
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.io import load_checkpoint


@pytest.fixture(autouse=True)
def tiny_data(tiny_omniglot_root, monkeypatch):
    """Read Omniglot cut to 24 classes per split."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_omniglot_root):
    """A checkpoint from a few-step `fewshot train` run."""
    out = tmp_path_factory.mktemp("run")
    args = [
        "train",
        "--way",
        "5",
        "--shot",
        "1",
        "--query",
        "2",
        "--epochs",
        "1",
        "--episodes-per-epoch",
        "4",
        "--episodes-per-batch",
        "2",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--data-root",
        str(tiny_omniglot_root),
    ]
    assert main(args) == 0
    return out


def test_train_then_eval(trained, capsys, tmp_path):
    assert (trained / "metrics.jsonl").read_text().count("\n") == 1
    out = tmp_path / "result.json"
    code = main(
        [
            "eval",
            "--checkpoint",
            str(trained / "best.pt"),
            "--way",
            "5",
            "--shot",
            "1",
            "--query",
            "3",
            "--episodes",
            "20",
            "--seed",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(out.read_text())
    assert line == f"accuracy: {result['accuracy']:.2f} ± {result['ci95']:.2f} %"
    assert result["episodes"] == 20 and result["seed"] == 3


def test_eval_records_what_it_was_computed_with_and_keeps_other_results(trained, capsys, tmp_path):
    checkpoint = tmp_path / "model.pt"
    shutil.copy(trained / "best.pt", checkpoint)
    out = tmp_path / "result.json"
    args = ["eval", "--checkpoint", str(checkpoint), "--query", "3", "--episodes", "4"]
    args += ["--device", "cpu", "--out", str(out)]
    assert main(args) == 0
    record = json.loads(out.read_text())
    config = load_checkpoint(checkpoint)["config"]
    assert record["checkpoint_sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert {key: record[key] for key in METHOD_SETTINGS} == {k: config[k] for k in METHOD_SETTINGS}
    # Other batches give the same episodes and result: the same settings, accepted.
    assert main([*args, "--episodes-per-batch", "3"]) == 0
    assert json.loads(out.read_text()) == record
    kept = out.read_bytes()
    capsys.readouterr()  # the progress bars of the runs so far
    other_amp = "off" if record["precision"] == "bf16" else "bf16"
    refused = (
        "fewshot eval: error: {} already holds another result ({}); pass --overwrite to replace it"
    )
    changes = {
        "way: 5 there, 4 here": ["--way", "4"],
        "shot: 1 there, 2 here": ["--shot", "2"],
        "query: 3 there, 2 here": ["--query", "2"],
        "episodes: 4 there, 5 here": ["--episodes", "5"],
        "seed: 0 there, 1 here": ["--seed", "1"],
        'split: "test" there, "val" here': ["--split", "val"],
        f'precision: "{record["precision"]}" there, "{"float32" if other_amp == "off" else "bf16"}"'
        " here": ["--amp", other_amp],
    }
    for differ, change in changes.items():
        assert main([*args, *change]) == 2, change
        assert capsys.readouterr().err.strip() == refused.format(out, differ), change
        assert out.read_bytes() == kept
    # The cache cannot change the result: recorded, not part of its identity.
    assert main([*args, "--no-cache"]) == 0
    assert json.loads(out.read_text()) == {**record, "cache": False}
    assert main(args) == 0
    kept = out.read_bytes()
    capsys.readouterr()
    # The same path holding other evaluation options, then other weights: another checkpoint.
    ckpt = load_checkpoint(checkpoint)
    ckpt["config"]["eval_head_options"] = {"normalize_by_dim": True}
    torch.save(ckpt, checkpoint)
    assert main(args) == 2
    differ = (
        "checkpoint_sha256 differs; eval_head_options: {} there, "
        + '{"normalize_by_dim": true} here'
    )
    assert capsys.readouterr().err.strip() == refused.format(out, differ)
    assert main([*args, "--overwrite"]) == 0
    assert json.loads(out.read_text())["eval_head_options"] == {"normalize_by_dim": True}
    capsys.readouterr()
    ckpt["model"]["scale"] = ckpt["model"]["scale"] + 1
    torch.save(ckpt, checkpoint)
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == refused.format(out, "checkpoint_sha256 differs")


def test_the_cache_is_taken_where_it_embeds_fewer_images_and_said(
    trained, capsys, tmp_path, monkeypatch
):
    """The tiny test split holds 24 x 20 = 480 images, a 5-way 1-shot 3-query episode 20: 20
    episodes embed 400 images without the cache, fewer than the split; 30 embed 600, more.
    The default's choice is said and recorded; --cache and --no-cache choose without a word."""
    embedded = []
    embed_split = EmbeddingMethod.embed_split

    def counted(self, split, *args, **kwargs):
        embedded.append(len(split.labels))
        return embed_split(self, split, *args, **kwargs)

    monkeypatch.setattr(EmbeddingMethod, "embed_split", counted)
    args = ["eval", "--checkpoint", str(trained / "best.pt"), "--query", "3", "--device", "cpu"]
    cases = {
        ("--episodes", "20"): "no evaluation cache: the 400 images of the 20 episodes embedded, "
        "fewer than the 480 of split 'test' (--cache: embed the split once)",
        ("--episodes", "30"): "evaluation cache: the 480 images of split 'test' embedded once, "
        "fewer than the 600 of the 30 episodes (--no-cache: embed each episode)",
        ("--episodes", "30", "--no-cache"): None,
        ("--episodes", "20", "--cache"): None,
    }
    out = tmp_path / "result.json"
    for extra, said in cases.items():
        embedded.clear()
        assert main([*args, *extra, "--out", str(out), "--overwrite"]) == 0
        cache = said.startswith("evaluation") if said else extra[-1] == "--cache"
        assert json.loads(out.read_text())["cache"] is cache, extra
        assert embedded == ([480] if cache else []), extra
        printed = capsys.readouterr().out.splitlines()
        assert [line for line in printed if "evaluation cache" in line] == [said] * bool(said)


def test_eval_default_name_holds_what_decides_the_result(trained, capsys, tmp_path):
    checkpoint = tmp_path / "model.pt"
    shutil.copy(trained / "best.pt", checkpoint)
    args = ["eval", "--checkpoint", str(checkpoint), "--query", "3", "--episodes", "4"]
    args += ["--device", "cpu", "--amp", "off"]
    assert main(args) == 0
    (first,) = tmp_path.glob("eval_*.json")
    assert first.name.startswith("eval_omniglot_test_5w1s3q_4ep_seed0_float32_")
    assert f"result in {first}" in capsys.readouterr().out
    # The same identity (the cache and the batch do not decide it): rewritten in place.
    assert main([*args, "--no-cache", "--episodes-per-batch", "3"]) == 0
    assert list(tmp_path.glob("eval_*.json")) == [first]
    # More episodes, another classifier: results of their own, beside the first.
    assert main([*args[:-4], "--episodes", "6", "--device", "cpu", "--amp", "off"]) == 0
    assert main([*args, "--classifier", "logistic"]) == 0
    names = sorted(p.name for p in tmp_path.glob("eval_*.json"))
    assert len(names) == 3, names
    assert any("_6ep_" in n for n in names) and any("_logistic_" in n for n in names)


def test_eval_of_a_shipped_model_writes_into_results(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    model = Path(__file__).resolve().parents[1] / "models" / "omniglot" / "protonet_conv4_1shot.pt"
    before = sorted(model.parent.iterdir())
    args = ["eval", "--checkpoint", str(model), "--episodes", "2", "--device", "cpu"]
    assert main(args) == 0
    (result,) = (tmp_path / "results" / "omniglot" / "protonet_conv4_1shot").glob("eval_*.json")
    assert f"result in {result.relative_to(tmp_path)}" in capsys.readouterr().out
    assert sorted(model.parent.iterdir()) == before


# (command line, text the one-line error must contain). {tmp} is a fresh folder; {run} a
# trained run folder; {file} a regular file; {cfg} a config file written from the case's JSON.
BAD_COMMANDS = [
    (
        "train --backbone vgg",
        "--backbone must be one of conv4, resnet12, timm:NAME or torchvision:NAME, got 'vgg'",
    ),
    ("train --head knn", "--head must be one of protonet, ridge, svm, cosine, got 'knn'"),
    ("train --dataset mnist", "--dataset must be one of"),
    ("train --way 30 --out {tmp}/r", "30-way episodes need 30 classes"),
    ("train --shot -1", "--shot must be >= 1, got -1"),
    ("train --way -1 --resplits 2", "--way must be >= 1, got -1"),
    ("train --lr 0", "--lr must be > 0"),
    ("train --lr nan", "--lr must be a finite number"),
    ("train --lr inf", "--lr must be a finite number"),
    ("train --label-smoothing 1", "--label-smoothing must be >= 0 and < 1"),
    ("train --seed 18446744073709551616", "--seed must be >= 0 and <= 9223372036854775807"),
    ("train --momentum -0.5", "--momentum must be >= 0 and < 1"),
    ("train --weight-decay -1", "--weight-decay must be >= 0"),
    ("train --val-way 0", "--val-way must be >= 1, got 0"),
    ("train --val-episodes 1", "--val-episodes must be >= 2"),
    ("train --epochs 0", "--epochs must be >= 1"),
    ("train --way 1 --shot 1 --query 1 --resplits 3", "--resplits must be <= 2"),
    ("train --episodes-per-epoch 3 --episodes-per-batch 2", "--episodes-per-epoch must be a mult"),
    ("train --lr-schedule [[1]]", "--lr-schedule entry 0 must be [epoch >= 0"),
    ('train --lr-schedule [["a",0.1]]', "--lr-schedule entry 0 must be"),
    ("train --lr-schedule x", "argument --lr-schedule: not valid JSON"),
    ('train --head-options {"bogus":1}', "--head-options has no option 'bogus' for protonet"),
    ('train --head ridge --head-options {"lam":"x"}', "--head-options.lam must be a number"),
    ('train --backbone-options {"depth":3}', "--backbone-options has no option 'depth'"),
    ("train --way five", "argument --way: invalid int value: 'five'"),
    ("train --resume {run}/last.pt --overwrite", "--overwrite cannot be combined with --resume"),
    ("train --resume {run}/last.pt --shot 2", "the run's settings differ in shot"),
    ("train --resume {tmp}/none.pt", "checkpoint not found"),
    ("train --out {file}/run", "is not usable"),
    ("train --out {run}", "already holds a run"),
    ("train --config {tmp}", "is a folder, not a JSON file"),
    ("train --config {tmp}/missing.json", "config file not found"),
    ("eval --checkpoint {run}/best.pt --query 0", "--query must be >= 1, got 0"),
    ("eval --checkpoint {run}/best.pt --episodes 1", "--episodes must be >= 2"),
    ("eval --checkpoint {tmp}/x.pt", "checkpoint not found"),
    ("eval --checkpoint {file}", "cannot read checkpoint"),
    ("eval --checkpoint {run}/best.pt --out {file}/r.json", "cannot write"),
    ("eval --checkpoint {run}/best.pt --split nope", "omniglot has splits"),
    ("eval", "--checkpoint is required, or --backbone for a frozen backbone"),
    (
        "import-metaoptnet --checkpoint {file} --backbone conv4 --head svm --dataset fc100 "
        "--out {file}/x.pt",
        "cannot write",
    ),
]
# Config files: (JSON text, error text); each must name the file and the key at fault.
BAD_CONFIGS = [
    ("[1, 2]", "must hold a JSON object, not a list"),
    ('{"way": "five"}', "\"way\" must be an integer, got 'five'"),
    ('{"way": null}', '"way" must be an integer, got None'),
    ('{"way": true}', '"way" must be an integer, got True'),
    ('{"epochs": 2.5}', '"epochs" must be an integer, got 2.5'),
    ('{"lr": "0.1"}', "\"lr\" must be a number, got '0.1'"),
    ('{"lr_schedule": [[20, 0.1], [30]]}', '"lr_schedule" entry 1 must be'),
    ('{"wayy": 5}', "unknown keys wayy"),
    ('{"way": 5', "is not valid JSON"),
    ('{"head": "ridge", "eval_head_options": {"iters": 3}}', '"eval_head_options" has no option'),
]


@pytest.mark.parametrize(("command", "message"), BAD_COMMANDS, ids=[c for c, _ in BAD_COMMANDS])
def test_bad_input_is_one_line_naming_the_flag(capsys, tmp_path, trained, command, message):
    file = tmp_path / "file"
    file.write_bytes(b"garbage")
    places = {"{tmp}": tmp_path, "{run}": trained, "{file}": file}
    words = command.split()
    for name, path in places.items():
        words = [w.replace(name, str(path)) for w in words]
    assert message in error_line(capsys, words)


@pytest.mark.parametrize(("text", "message"), BAD_CONFIGS, ids=[t for t, _ in BAD_CONFIGS])
def test_bad_config_file_is_one_line_naming_file_and_key(capsys, tmp_path, text, message):
    path = tmp_path / "c.json"
    path.write_text(text)
    err = error_line(capsys, ["train", "--config", str(path), "--out", str(tmp_path / "r")])
    assert message in err and str(path) in err
    assert not (tmp_path / "r").exists()  # refused before any folder or data was touched


def test_a_config_file_that_is_not_utf8_is_refused(capsys, tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b'{"way": "\xff"}')
    assert "is not UTF-8 text" in error_line(capsys, ["train", "--config", str(path)])


def test_a_checkpoint_with_bad_settings_is_refused_naming_it(capsys, tmp_path, trained):
    ckpt = torch.load(trained / "best.pt", weights_only=True)
    ckpt["config"]["head_options"] = {"bogus": 1}
    torch.save(ckpt, tmp_path / "odd.pt")
    err = error_line(capsys, ["eval", "--checkpoint", str(tmp_path / "odd.pt")])
    assert f'checkpoint {tmp_path / "odd.pt"}: "head_options" has no option' in err


@pytest.mark.parametrize("command", ["eval --checkpoint", "compare"])
def test_the_cache_of_a_method_without_one_is_refused_before_any_data(capsys, tmp_path, command):
    """MAML adapts to every episode: there is nothing to cache, so --cache is refused (and
    its evaluations default to --no-cache); the data root does not even exist."""
    maml = str(Path(__file__).resolve().parents[1] / "models/omniglot/maml_conv4_5way1shot_cpu.pt")
    argv = [*command.split(), maml, *([maml] if command == "compare" else []), "--cache"]
    err = error_line(capsys, [*argv, "--data-root", str(tmp_path / "none")])
    assert err.endswith("--cache does not apply to --method maml: it adapts to every episode")


def test_eval_refuses_non_finite_weights(capsys, tmp_path, trained):
    ckpt = torch.load(trained / "best.pt", weights_only=True)
    ckpt["model"]["scale"] = torch.tensor(float("nan"))
    torch.save(ckpt, tmp_path / "nan.pt")
    err = error_line(capsys, ["eval", "--checkpoint", str(tmp_path / "nan.pt")])
    assert "non-finite weights (scale)" in err


def test_resume_continues_in_the_checkpoint_folder(capsys, tmp_path, tiny_omniglot_root):
    run = tmp_path / "run"
    args = ["train", "--way", "5", "--query", "2", "--episodes-per-epoch", "4"]
    args += ["--val-episodes", "4", "--device", "cpu", "--out", str(run)]
    assert main([*args, "--epochs", "1"]) == 0
    assert main(["train", "--resume", str(run / "last.pt"), "--epochs", "2"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]
    assert not (Path("runs") / "default").exists()
    capsys.readouterr()
    assert main(["train", "--resume", str(run / "last.pt")]) == 0  # --epochs 2 is kept
    assert "already finished its 2 epochs" in capsys.readouterr().out


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--val-episodes VAL_EPISODES seeded validation episodes per epoch (default: 500)" in text
    assert "--optimizer {sgd,adam}" in text


def test_checkpoint_of_another_backbone_is_refused(capsys, tmp_path, trained):
    ckpt = torch.load(trained / "best.pt", weights_only=True)
    ckpt["config"]["backbone"] = "resnet12"
    torch.save(ckpt, tmp_path / "other.pt")
    err = error_line(capsys, ["eval", "--checkpoint", str(tmp_path / "other.pt")])
    assert "does not fit a resnet12 backbone" in err


def test_the_shipped_checkpoint_resumes_with_its_own_config(capsys, tmp_path):
    zoo = Path(__file__).resolve().parents[1] / "models" / "omniglot"
    args = ["train", "--config", str(zoo / "protonet_conv4_1shot.json")]
    args += ["--resume", str(zoo / "protonet_conv4_1shot.pt"), "--out", str(tmp_path)]
    args += ["--data-root", str(zoo.parents[1] / "data"), "--device", "cpu"]
    assert main(args) == 0, capsys.readouterr().err
    assert "already finished its 10 epochs" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["train", "eval"])
def test_ctrl_c_outside_training_steps_is_one_line(capsys, monkeypatch, tmp_path, trained, command):
    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    # Ctrl-C while the data is read: no traceback, the shell's status for SIGINT.
    module = "fewshot.training.run_setup" if command == "train" else "fewshot.cli.episode_settings"
    monkeypatch.setattr(f"{module}.load_split", pressed)
    args = ["--out", str(tmp_path / "r")] if command == "train" else []
    args += ["--checkpoint", str(trained / "best.pt")] if command == "eval" else []
    assert main([command, *args]) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"fewshot {command}: interrupted"


@pytest.mark.parametrize(
    "path", [c.path for c in COMMANDS], ids=[" ".join(c.path) for c in COMMANDS]
)
def test_every_command_has_help_with_its_settings(capsys, path):
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    command = next(c for c in COMMANDS if c.path == path)
    for cls in command.settings:
        for f in (f for f in dataclasses.fields(cls) if f.metadata.get("flag")):
            shown = f.name if f.metadata.get("positional") else "--" + f.name.replace("_", "-")
            assert shown in text, shown


def command_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every leaf command's sub-parser under `parser`, found by walking its sub-commands."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        return [parser]
    return [leaf for sub in groups[0].choices.values() for leaf in command_parsers(sub)]


def test_every_flag_with_choices_lists_them_all_in_its_help():
    parsers = command_parsers(build_parser())
    assert {p.get_default("_command").path for p in parsers} == {c.path for c in COMMANDS}
    checked = set()
    for parser in parsers:
        text = parser.format_help()
        actions = {action.dest: action for action in parser._actions}
        for cls in parser.get_default("_command").settings:
            for f in dataclasses.fields(cls):
                choices = f.metadata.get("choices")
                if choices is None or not f.metadata.get("flag"):
                    continue
                allowed = list(choices() if callable(choices) else choices)
                # "--flag {a,b}", or "{a,b}" alone for a positional argument
                shown = " ".join([*actions[f.name].option_strings[:1], f"{{{','.join(allowed)}}}"])
                assert shown in text, (parser.prog, shown)
                checked.add((parser.prog, f.name))
    # The registries' flags are among them (their choices are callables).
    assert {("fewshot train", "method"), ("fewshot eval", "dataset")} <= checked


def test_help_of_the_root_and_every_command_works(capsys):
    for path in [(), *(command.path for command in COMMANDS)]:
        with pytest.raises(SystemExit) as done:
            main([*path, "--help"])
        assert done.value.code == 0, path
        assert "usage: fewshot" in capsys.readouterr().out


def test_version_and_python_dash_m(capsys):
    import subprocess
    import sys

    import fewshot

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"fewshot {fewshot.__version__}"
    done = subprocess.run(
        [sys.executable, "-m", "fewshot", "--version"], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"fewshot {fewshot.__version__}")


def test_output_into_a_closed_pipe_ends_quietly_as_a_pipes_writer_does(tmp_path):
    """`fewshot predict ... | head -1`: the reader gone, the command ends with 128 + SIGPIPE
    and no traceback, whether its output was written at once or left to the exit's flush."""
    from PIL import Image

    for name in ("a", "b"):
        (tmp_path / "support" / name).mkdir(parents=True)
        Image.new("L", (28, 28), 40 if name == "a" else 0).save(
            tmp_path / "support" / name / "0.png"
        )
    Image.new("L", (28, 28), 30).save(tmp_path / "query.png")
    command = [sys.executable, "-m", "fewshot", "predict", "--device", "cpu", "--checkpoint"]
    command += [
        str(Path(__file__).resolve().parents[1] / "models/omniglot/protonet_conv4_trainval.pt")
    ]
    command += ["--support", str(tmp_path / "support"), "--query", str(tmp_path / "query.png")]
    for unbuffered in ("1", ""):
        env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        process.stdout.close()  # before the interpreter has even started: the reader is gone
        err = process.communicate(timeout=120)[1].decode()
        assert (process.returncode, err) == (128 + signal.SIGPIPE, ""), unbuffered


def test_a_source_tree_that_is_not_installed_imports_with_its_version(tmp_path):
    """Without the package's metadata (a vendored copy; -S leaves site-packages and the editable
    install out) `import fewshot` reads the version from pyproject.toml."""
    import subprocess
    import sys

    import tomllib

    repo = Path(__file__).resolve().parents[1]
    want = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]
    code = (
        f"import sys; sys.path.insert(0, {str(repo)!r}); import fewshot; print(fewshot.__version__)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert (done.returncode, done.stdout.strip()) == (0, want), done.stderr


def signalled(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -c code` run to its end, its output as text."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_ctrl_c_while_the_commands_load_is_one_line(tmp_path):
    """A real SIGINT while `fewshot` imports torch and the commands: one line, status 130."""
    code = (
        "import builtins, os, signal, sys\n"
        "real = builtins.__import__\n"
        "def pressed(name, *args, **kwargs):\n"
        "    if name == 'fewshot.cli.main':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = pressed\n"
        "sys.argv = ['fewshot', '--version']\n"
        "from fewshot.cli import run\n"
        "sys.exit(run())\n"
    )
    done = signalled(code, tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (130, "fewshot: interrupted\n", "")


@pytest.mark.parametrize("moment", ["reading the flags", "after the command"])
def test_ctrl_c_outside_the_commands_run_is_one_line(tmp_path, moment):
    """A real SIGINT while `fewshot` reads its flags and tunes the allocator (C library lookup),
    or once the command has returned its status (2 here): one line, status 130, no traceback."""
    if moment == "reading the flags":
        patch = (
            "import fewshot.cli.main as m\n"
            "m.retain_freed_memory = lambda: os.kill(os.getpid(), signal.SIGINT)\n"
        )
    else:
        patch = (
            "import fewshot.cli.main as m\n"
            "real = m.main\n"
            "def main():\n"
            "    status = real()\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    return status\n"
            "m.main = main\n"
        )
    code = (
        "import os, signal, sys\n"
        + patch
        + "sys.argv = ['fewshot', 'plot', 'no-such-run', '--out', 'c.png']\n"
        + "from fewshot.cli import run\n"
        + "sys.exit(run())\n"
    )
    done = signalled(code, tmp_path)
    error = "fewshot plot: error: cannot read no-such-run: No such file or directory\n"
    said = (error if moment == "after the command" else "") + "fewshot: interrupted\n"
    assert (done.returncode, done.stderr) == (130, said)


def test_a_signal_within_an_import_ends_the_command_in_one_line(tmp_path):
    """Raised within an import, an exception leaves a half-imported module (numpy's core
    cannot load twice and its lazy attributes then recurse: a 40-line RecursionError): a
    signal there ends the process at once; elsewhere it is the `Interrupted` of one line."""
    (tmp_path / "slow_module.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nLOADED = True\n"
    )
    code = (
        "import os, signal, sys\n"
        "sys.path.insert(0, '.')\n"
        "from fewshot.runtime.signals import Interrupted, signals_raise\n"
        "try:\n"
        "    with signals_raise():\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "except Interrupted:\n"
        "    print('raised')\n"
        "with signals_raise():\n"
        "    import slow_module\n"
        "print('imported')\n"
    )
    done = signalled(code, tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (
        130,
        "fewshot: interrupted\n",
        "raised\n",
    )


@pytest.mark.slow
def test_ctrl_c_in_the_first_seconds_of_a_command_is_one_line(tmp_path):
    """Real Ctrl-C at moments spread over `fewshot plot`'s first seconds (torch, numpy and
    matplotlib loading): never a traceback. From half a second on: the interpreter's own start
    (its site module) comes before any code of the package."""
    (tmp_path / "run").mkdir()
    row = {"epoch": 1, "lr": 0.1, "train_loss": 1.0, "train_acc": 50.0, "val_acc": 50.0}
    row.update(val_ci95=1.0, seconds=1.0, precision="float32")
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    command = [sys.executable, "-m", "fewshot", "plot", "run", "--out", "c.png", "--overwrite"]
    for delay in [0.5 + 0.3 * i for i in range(8)]:
        process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=300)
        if process.returncode == 0:  # done before the signal
            continue
        assert process.returncode == 130, (delay, err)
        assert len(err.strip().splitlines()) == 1 and "interrupted" in err, (delay, err)


def test_eval_takes_a_run_folder_and_keeps_another_result(trained, capsys, tmp_path):
    out = tmp_path / "result.json"
    args = ["eval", "--checkpoint", str(trained), "--episodes", "4", "--out", str(out)]
    assert main(args) == 0
    assert json.loads(out.read_text())["checkpoint"] == str(trained / "best.pt")
    assert main(args) == 0  # the very same result may be written again
    assert main([*args[:-2], "--seed", "1", "--out", str(out)]) == 2
    assert "another result (seed: 0 there, 1 here); pass --overwrite" in capsys.readouterr().err
    assert main([*args[:-2], "--seed", "1", "--out", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text())["seed"] == 1


@pytest.mark.parametrize("kind", ["folder", "device", "symlink"])
def test_outputs_are_never_folders_device_nodes_or_replaced_links(trained, capsys, tmp_path, kind):
    target = tmp_path / "kept.json"
    target.write_text("{}")
    out = {"folder": tmp_path, "device": Path("/dev/null"), "symlink": tmp_path / "link.json"}[kind]
    if kind == "symlink":
        out.symlink_to(target)
    args = ["eval", "--checkpoint", str(trained), "--episodes", "4", "--out", str(out)]
    if kind == "symlink":
        assert main([*args, "--overwrite"]) == 0
        assert out.is_symlink() and json.loads(target.read_text())["episodes"] == 4
    else:
        assert main([*args, "--overwrite"]) == 2
        assert "name a file" in capsys.readouterr().err
        assert Path("/dev/null").is_char_device()


def test_a_checkpoint_for_other_images_is_refused_before_any_forward(trained, capsys, tmp_path):
    ckpt = torch.load(trained / "best.pt", weights_only=True)
    ckpt["config"].update(in_channels=3, image_size=84)
    ckpt["model"] = build_method(ckpt["config"]).state_dict()  # a model for RGB 84x84 images
    torch.save(ckpt, tmp_path / "rgb.pt")
    err = error_line(capsys, ["eval", "--checkpoint", str(tmp_path / "rgb.pt")])
    assert "expects 3x84x84 images" in err and "has 1x28x28" in err


def test_a_way_the_validation_split_cannot_give_is_refused_before_training(capsys, tmp_path):
    err = error_line(capsys, ["train", "--val-way", "30", "--out", str(tmp_path / "r")])
    assert "30-way episodes need 30 classes, 24 in" in err
    assert not (tmp_path / "r" / "last.pt").exists()


REPO_ROOT = Path(__file__).resolve().parents[1]
ZOO_PROTONET = REPO_ROOT / "models" / "omniglot" / "protonet_conv4_trainval.pt"


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "--checkpoint", str(ZOO_PROTONET), "--episodes", "2", "--out"],
        ["train", "--epochs", "1", "--episodes-per-epoch", "2", "--out"],
        [
            "plot",
            str(REPO_ROOT / "experiments" / "omniglot_zoo" / "protonet_conv4_1shot.metrics.jsonl"),
            "--out",
        ],
    ],
    ids=["eval", "train", "plot"],
)
def test_an_output_name_longer_than_the_file_system_allows_is_one_line(argv, tmp_path, capsys):
    long = str(tmp_path / ("a" * 300)) + (".png" if argv[0] == "plot" else ".json")
    assert main([*argv, long]) == 2
    err = capsys.readouterr().err
    assert "File name too long" in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
