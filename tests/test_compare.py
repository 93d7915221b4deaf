"""`fewshot compare`, `compare-seeds`, `eval --per-episode` and `plot` on real runs."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from trainers import make_trainer

from fewshot.cli.main import main
from fewshot.evaluation.stats import paired_ci, paired_seeds_ci, seeds_ci
from fewshot.training.settings import TrainSettings

REPO = Path(__file__).resolve().parents[1]
EPISODES = ["--way", "5", "--shot", "1", "--query", "3", "--episodes", "60", "--seed", "4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_omniglot_root) -> dict[str, list[Path]]:
    """Two arms (ProtoNet, ridge) of two training seeds each, a few steps on 24 classes."""
    root = tmp_path_factory.mktemp("runs")
    arms: dict[str, list[Path]] = {"protonet": [], "ridge": []}
    for head, folders in arms.items():
        for seed in (0, 1):
            out = root / f"{head}{seed}"
            config = TrainSettings(
                head=head, way=5, query=2, epochs=1, episodes_per_epoch=6, val_episodes=8,
                seed=seed, device="cpu", out=str(out), data_root=str(tiny_omniglot_root),
            )  # fmt: skip
            make_trainer(config).fit()
            folders.append(out)
    return arms


def test_compare_is_paired_over_the_same_episodes(runs, tmp_path, capsys, tiny_omniglot_root):
    a, b = runs["protonet"][0] / "best.pt", runs["ridge"][0] / "best.pt"
    root = ["--data-root", str(tiny_omniglot_root)]
    out = tmp_path / "cmp.json"
    assert main(["compare", str(a), str(b), *EPISODES, *root, "--out", str(out)]) == 0
    note, *lines = capsys.readouterr().out.strip().splitlines()
    assert note.startswith("evaluation cache: the 480 images of split 'test' embedded once")
    record = json.loads(out.read_text())
    acc_a, acc_b = (torch.tensor(record[k]["accuracies"]) for k in "ab")
    d = paired_ci(acc_a, acc_b)
    assert lines[-1].startswith(f"B - A: {100 * d.mean:+.2f} ± {100 * d.ci95:.2f} %")
    assert f"p = {d.p_value:.3g}" in lines[-1]
    assert lines[0] == f"A {a}: {record['a']['accuracy']:.2f} ± {record['a']['ci95']:.2f} %"
    # The same episodes as `fewshot eval` draws with that seed.
    single = tmp_path / "eval.json"
    args = ["eval", "--checkpoint", str(a), *EPISODES, *root, "--out", str(single)]
    assert main([*args, "--per-episode"]) == 0
    assert json.loads(single.read_text())["accuracies"] == record["a"]["accuracies"]
    # A model against itself: no difference at all.
    assert main(["compare", str(a), str(a), *EPISODES, *root]) == 0
    assert "B - A: +0.00 ± 0.00 %" in capsys.readouterr().out
    # The same comparison may be written again; one in another precision, or of other
    # weights at the same path, is another result: kept unless --overwrite.
    assert main(["compare", str(a), str(b), *EPISODES, *root, "--out", str(out)]) == 0
    assert (
        main(["compare", str(a), str(b), *EPISODES, *root, "--amp", "bf16", "--out", str(out)]) == 2
    )
    shutil.copy(runs["protonet"][1] / "best.pt", tmp_path / "other.pt")
    shutil.copy(a, tmp_path / "a.pt")
    args = [
        "compare",
        str(tmp_path / "a.pt"),
        str(b),
        *EPISODES,
        *root,
        "--out",
        str(tmp_path / "c.json"),
    ]
    assert main(args) == 0
    shutil.copy(tmp_path / "other.pt", tmp_path / "a.pt")
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_compare_seeds_pairs_seed_i_with_seed_i(runs, tmp_path, capsys, tiny_omniglot_root):
    out = tmp_path / "seeds.json"
    args = ["compare-seeds", "--a", *map(str, runs["protonet"]), "--b", *map(str, runs["ridge"])]
    args += [*EPISODES, "--data-root", str(tiny_omniglot_root), "--out", str(out)]
    assert main(args) == 0
    note, *lines = capsys.readouterr().out.strip().splitlines()
    assert note.startswith("evaluation cache: the 480 images of split 'test' embedded once")
    record = json.loads(out.read_text())
    means = {arm: [m["accuracy"] / 100 for m in record[arm]] for arm in "ab"}
    for arm in "ab":
        model = record[arm][0]
        assert model["accuracy"] == pytest.approx(100 * sum(model["accuracies"]) / 60)
    mean, half = seeds_ci(means["a"])
    assert lines[0] == f"A (2 seeds): {100 * mean:.2f} ± {100 * half:.2f} % (t interval)"
    d = paired_seeds_ci(means["a"], means["b"])
    assert record["difference"]["mean"] == pytest.approx(d.mean)
    assert lines[-1].startswith(f"B - A: {100 * d.mean:+.2f} ± {100 * d.ci95:.2f} %")


def test_compare_seeds_refuses_unpaired_arms(runs, capsys):
    args = ["compare-seeds", "--a", *map(str, runs["protonet"]), "--b", str(runs["ridge"][0])]
    assert main(args) == 2
    assert "--b needs as many seeds as --a (at least 2), got 1" in capsys.readouterr().err


def test_plot_draws_real_learning_curves(runs, tmp_path, capsys):
    zoo = REPO / "experiments" / "omniglot_zoo" / "protonet_conv4_trainval.metrics.jsonl"
    out = tmp_path / "curves.png"
    args = [
        "plot",
        str(zoo),
        str(runs["protonet"][0]),
        "--labels",
        "zoo",
        "tiny",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"epoch": 1}\n')
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert "line 1: not a metrics row" in capsys.readouterr().err


def test_plot_on_a_full_disk_keeps_the_previous_image(tmp_path, capsys, monkeypatch):
    zoo = REPO / "experiments" / "omniglot_zoo" / "protonet_conv4_trainval.metrics.jsonl"
    out = tmp_path / "curves.png"
    out.write_bytes(b"the previous image")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)  # the write of the new image fails as on a full disk
    assert main(["plot", str(zoo), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"cannot write {out}: No space left on device; the previous curves.png is intact"
    )
    assert out.read_bytes() == b"the previous image"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]  # no temporary left
