"""`fewshot bench` end to end on a tiny model and a small suite (on the real Omniglot files,
their test split cut to 24 classes), and `--episodes-file` on `fewshot eval` and `fewshot
compare`: a bench result is `fewshot eval` on the cell's manifest, which holds the seeded
episodes; reruns evaluate nothing, an interrupted bench goes on where it stopped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_errors import error_line

import fewshot.cli.episode_settings
import fewshot.cli.eval
import fewshot.runtime.io
from fewshot.benchmark.results import STORED, read_result, read_results
from fewshot.benchmark.suites import load_suite
from fewshot.cli.main import main
from fewshot.datasets import load_split
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import seeded_episodes
from fewshot.evaluation.manifests import (
    Manifest,
    draw_manifest,
    read_manifest,
    write_manifest,
)
from fewshot.runtime.errors import FewshotError

REPO = Path(__file__).resolve().parents[1]
# A zoo checkpoint that solves these episodes far better than the tiny model.
ZOO = REPO / "models" / "omniglot" / "protonet_conv4_1shot.pt"
# A MAML checkpoint whose classifier has 5 outputs: it cannot solve 20-way episodes.
MAML_5WAY = REPO / "models" / "omniglot" / "maml_conv4_5way1shot_cpu.pt"
SUITE = """\
name: tiny
version: 1
description: two small cells of the Omniglot test characters
dataset: omniglot
split: test
way: 5
query: 5
episodes: 20
seed: 0
cells:
  - {name: 5w1s, shot: 1}
  - {name: 5w5s, shot: 5}
"""
CELLS = {"5w1s": 1, "5w5s": 5}  # cell: shot
QUERIES = 5 * 5  # queries of an episode: way x query


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_omniglot_root) -> str:
    """A ProtoNet checkpoint of a few training steps, named tiny.pt."""
    out = tmp_path_factory.mktemp("run")
    args = ["train", "--way", "5", "--shot", "1", "--query", "2", "--epochs", "1"]
    args += ["--episodes-per-epoch", "4", "--episodes-per-batch", "2", "--device", "cpu"]
    assert main([*args, "--out", str(out), "--data-root", str(tiny_omniglot_root)]) == 0
    shutil.copy(out / "best.pt", out / "tiny.pt")
    return str(out / "tiny.pt")


@pytest.fixture
def suite(tmp_path) -> str:
    """The small suite's file."""
    path = tmp_path / "tiny.yaml"
    path.write_text(SUITE)
    return str(path)


@pytest.fixture
def bench(tiny_omniglot_root):
    """`bench(*args)`: run `fewshot bench` on the cut data, without the zoo's stored results,
    on the CPU; its exit status."""

    def run(*args) -> int:
        root = ["--data-root", str(tiny_omniglot_root), "--device", "cpu"]
        return main(["bench", *map(str, args), "--no-stored", *root])

    return run


@pytest.fixture
def evaluations(monkeypatch) -> list[tuple[int, int]]:
    """The (way, shot) of every evaluation run from now on (a spy on the episodes' solver)."""
    seen: list[tuple[int, int]] = []
    real = fewshot.cli.episode_settings.episode_accuracies

    def spy(method, split, shape, *args, **kwargs):
        seen.append((shape.way, shape.shot))
        return real(method, split, shape, *args, **kwargs)

    monkeypatch.setattr(fewshot.cli.episode_settings, "episode_accuracies", spy)
    return seen


def run_eval(root, *args) -> dict:
    """`fewshot eval ARGS --per-episode` on the cut data; its JSON record."""
    out = Path(args[args.index("--out") + 1])
    flags = ["--per-episode", "--device", "cpu", "--data-root", str(root)]
    assert main(["eval", *map(str, args), *flags]) == 0
    return json.loads(out.read_text())


def standings(out: Path) -> dict[str, list[tuple[str, float]]]:
    """Each cell's (model, rank) in the leaderboard's JSON, in order."""
    board = json.loads((out / "leaderboard.json").read_text())
    return {c["cell"]: [(s["name"], s["rank"]) for s in c["standings"]] for c in board["cells"]}


def final_error(capsys) -> str:
    """The one-line error a command that ran ends with (its progress bars are on stderr
    above it)."""
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.err.strip().splitlines()[-1]


def temporaries(folder: Path) -> list[Path]:
    """Hidden or temporary files left in `folder`."""
    return [p for p in folder.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def test_bench_results_are_evals_on_the_cells_manifests_which_are_the_seeded_episodes(
    model, suite, bench, tmp_path, capsys, tiny_omniglot_root
):
    out = tmp_path / "bench"
    assert bench(suite, model, "--out", out) == 0
    printed = capsys.readouterr().out
    assert "5w1s (20 episodes):" in printed and "leaderboard in " in printed
    assert json.loads((out / "suite.json").read_text())["suite"] == "tiny-v1"
    for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.json", "differences.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert sorted(p.name for p in (out / "results" / "tiny").iterdir()) == [
        "5w1s.json",
        "5w5s.json",
    ]
    assert len(read_results(out / "results", "tiny-v1", False)) == 2
    assert not temporaries(out)
    split = load_split("omniglot", "test", tiny_omniglot_root)
    for cell, shot in CELLS.items():
        manifest_path = out / "manifests" / f"{cell}.npz"
        manifest = read_manifest(manifest_path)
        seeded = torch.cat(list(seeded_episodes(split, EpisodeShape(5, shot, 5), 20, 0)))
        assert torch.equal(manifest.index, seeded)
        record = json.loads((out / "results" / "tiny" / f"{cell}.json").read_text())
        assert (record["name"], record["suite"], record["cell"]) == ("tiny", "tiny-v1", cell)
        assert record["episodes_sha256"] == manifest.sha256
        assert record["dataset_fingerprint"] == split.fingerprint()
        assert record["queries"] == QUERIES
        correct = record["correct"]
        assert len(correct) == 20 and all(type(c) is int and 0 <= c <= QUERIES for c in correct)
        assert record["accuracy"] == pytest.approx(100 * sum(correct) / (20 * QUERIES))
        assert read_result(out / "results" / "tiny" / f"{cell}.json", False).queries == QUERIES
        # `fewshot eval` on the manifest: the same episodes, the same answers.
        on_file = run_eval(
            tiny_omniglot_root,
            *("--checkpoint", model, "--episodes-file", manifest_path),
            *("--out", tmp_path / f"{cell}.file.json"),
        )
        assert on_file["episodes_sha256"] == manifest.sha256
        assert (on_file["way"], on_file["shot"], on_file["query"]) == (5, shot, 5)
        assert [round(a * QUERIES) for a in on_file["accuracies"]] == correct
        # Plain `fewshot eval` of the same shape and seed: the seeded episodes are the same.
        seeded_eval = run_eval(
            tiny_omniglot_root,
            *("--checkpoint", model, "--way", 5, "--shot", shot, "--query", 5),
            *("--episodes", 20, "--seed", 0, "--out", tmp_path / f"{cell}.seeded.json"),
        )
        assert "episodes_sha256" not in seeded_eval
        assert seeded_eval["accuracies"] == on_file["accuracies"]
    assert set(standings(out)) == set(CELLS)
    markdown = (out / "leaderboard.md").read_text()
    assert markdown.startswith("# Leaderboard: tiny-v1") and "tiny" in markdown
    rows = (out / "leaderboard.csv").read_text().splitlines()
    assert rows[0].startswith("cell,episodes,model,accuracy") and len(rows) == 3


def test_a_second_run_evaluates_nothing_and_ranks_the_same(
    model, suite, bench, tmp_path, evaluations
):
    out = tmp_path / "bench"
    assert bench(suite, model, "--out", out) == 0
    assert sorted(evaluations) == [(5, 1), (5, 5)]
    results = sorted((out / "results").rglob("*.json"))
    times = [p.stat().st_mtime_ns for p in results]
    board = {name: (out / name).read_text() for name in ("leaderboard.md", "leaderboard.csv")}
    board["leaderboard.json"] = (out / "leaderboard.json").read_text()
    manifests = {p.name: p.read_bytes() for p in (out / "manifests").iterdir()}
    evaluations.clear()
    assert bench(suite, model, "--out", out) == 0
    assert evaluations == []
    assert sorted((out / "results").rglob("*.json")) == results
    assert [p.stat().st_mtime_ns for p in results] == times
    assert {name: (out / name).read_text() for name in board} == board
    assert {p.name: p.read_bytes() for p in (out / "manifests").iterdir()} == manifests


def interrupt_evaluation(monkeypatch, at_call: int) -> None:
    """Ctrl-C in the middle of the `at_call`-th evaluation (its episodes being solved)."""
    real = fewshot.cli.episode_settings.episode_accuracies
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(fewshot.cli.episode_settings, "episode_accuracies", interrupted)


def interrupt_write(monkeypatch, name: str) -> None:
    """Ctrl-C while the result file `name` is half written (through the real atomic write)."""
    real = fewshot.cli.eval.atomic_write_json

    def half_written(record, path):
        if Path(path).name != name:
            return real(record, path)
        data = json.dumps(record).encode()

        def write(file):
            file.write(data[: len(data) // 2])
            raise KeyboardInterrupt

        fewshot.runtime.io._atomic_replace(Path(path), write)

    monkeypatch.setattr(fewshot.cli.eval, "atomic_write_json", half_written)


@pytest.mark.parametrize("when", ["evaluating", "writing"])
def test_an_interrupted_bench_goes_on_where_it_stopped(
    model, suite, bench, tmp_path, capsys, monkeypatch, when
):
    out = tmp_path / "bench"
    if when == "evaluating":
        interrupt_evaluation(monkeypatch, at_call=2)
    else:
        interrupt_write(monkeypatch, "5w5s.json")
    assert bench(suite, model, "--out", out) == 130
    assert "fewshot bench: interrupted" in capsys.readouterr().err
    monkeypatch.undo()
    first = out / "results" / "tiny" / "5w1s.json"
    done = read_result(first, False)  # complete, and of its 20 episodes
    assert len(done.correct) == 20 and done.cell == "5w1s"
    assert json.loads(first.read_text())["summary"]["episodes"] == 20
    assert sorted(p.name for p in (out / "results" / "tiny").iterdir()) == ["5w1s.json"]
    assert not temporaries(out)
    mtime = first.stat().st_mtime_ns
    seen: list[int] = []
    real = fewshot.cli.episode_settings.episode_accuracies

    def spy(method, split, shape, *args, **kwargs):
        seen.append(shape.shot)
        return real(method, split, shape, *args, **kwargs)

    monkeypatch.setattr(fewshot.cli.episode_settings, "episode_accuracies", spy)
    assert bench(suite, model, "--out", out) == 0
    assert seen == [5]  # only the cell that was not done
    assert first.stat().st_mtime_ns == mtime
    assert len(read_results(out / "results", "tiny-v1", False)) == 2
    assert not temporaries(out)


def test_two_models_are_ranked_together(model, suite, bench, tmp_path, capsys, evaluations):
    out = tmp_path / "bench"
    assert bench(suite, model, "--out", out) == 0
    # Another model into the same folder: only its cells are evaluated, both are ranked.
    evaluations.clear()
    assert bench(suite, ZOO, "--out", out, "--name", "zoo protonet") == 0
    assert sorted(evaluations) == [(5, 1), (5, 5)]
    assert (out / "results" / "zoo-protonet" / "5w1s.json").is_file()
    ranked = standings(out)
    assert ranked == {cell: [("zoo protonet", 1.0), ("tiny", 2.0)] for cell in CELLS}
    board = json.loads((out / "leaderboard.json").read_text())
    assert board["across"]["models"] == ["zoo protonet", "tiny"]
    assert board["across"]["mean_ranks"] == {"zoo protonet": 1.0, "tiny": 2.0}
    for ranking in board["cells"]:
        best, other = ranking["standings"]
        assert best["accuracy"] > other["accuracy"] and other["difference"] < 0
    # Both in one command, into a fresh folder: the same ranking, by the files' stems.
    capsys.readouterr()
    fresh = tmp_path / "fresh"
    assert bench(suite, model, ZOO, "--out", fresh) == 0
    ranked = standings(fresh)
    assert ranked == {cell: [("protonet_conv4_1shot", 1.0), ("tiny", 2.0)] for cell in CELLS}
    assert (fresh / "results" / "protonet-conv4-1shot" / "5w5s.json").is_file()


def test_two_models_of_one_name_are_refused(model, suite, bench, tmp_path, capsys):
    out = tmp_path / "bench"
    args = [suite, model, ZOO, "--out", out, "--no-stored", "--device", "cpu"]
    err = error_line(capsys, ["bench", *map(str, args), "--name", "same", "same"])
    assert "--name" in err and "'same'" in err
    err = error_line(capsys, ["bench", *map(str, args), "--name", "one"])
    assert "--name gives 1 names for 2 models" in err
    assert not (out / "results").exists()
    # Another model under a name whose results are there: refused, the results kept.
    assert bench(suite, model, "--out", out, "--name", "same") == 0
    before = (out / "results" / "same" / "5w1s.json").read_text()
    capsys.readouterr()
    assert bench(suite, ZOO, "--out", out, "--name", "same") == 2
    err = final_error(capsys)
    assert err.startswith("fewshot bench: error: ")
    assert "2 of 2 evaluations failed" in err and "same on 5w1s" in err
    assert "checkpoint_sha256 differs" in err and "--overwrite" in err
    assert (out / "results" / "same" / "5w1s.json").read_text() == before


def test_a_name_never_mixes_two_models_results(model, suite, bench, tmp_path, capsys):
    out = tmp_path / "bench"
    assert bench(suite, model, "--out", out, "--name", "same", "--cells", "5w1s") == 0
    capsys.readouterr()
    # The other model fills the cells the first left: its row would be a mix, so no leaderboard.
    assert bench(suite, ZOO, "--out", out, "--name", "same") == 2
    err = final_error(capsys)
    assert "'same' names two models" in err and "--overwrite" in err


def test_an_out_folder_of_another_suite_is_refused(model, suite, bench, tmp_path, capsys):
    out = tmp_path / "bench"
    assert bench(suite, model, "--out", out, "--cells", "5w1s") == 0
    other = tmp_path / "other.yaml"
    other.write_text(SUITE.replace("name: tiny", "name: other"))
    capsys.readouterr()
    args = ["bench", str(other), model, "--out", str(out), "--no-stored", "--device", "cpu"]
    err = error_line(capsys, args)
    assert f"{out} holds the results of suite tiny-v1, not other-v1" in err
    assert sorted(p.name for p in (out / "results").iterdir()) == ["tiny"]
    # A version of the same suite is another suite too.
    version2 = tmp_path / "tiny2.yaml"
    version2.write_text(SUITE.replace("version: 1", "version: 2"))
    assert "holds the results of suite tiny-v1, not tiny-v2" in error_line(
        capsys, ["bench", str(version2), model, "--out", str(out), "--no-stored"]
    )
    # A folder whose marker is not a bench folder's.
    (out / "suite.json").write_text("[]")
    assert "is not a bench folder's" in error_line(capsys, args)


def test_plan_prints_the_jobs_and_runs_nothing(model, suite, bench, tmp_path, capsys):
    out = tmp_path / "bench"
    assert bench(suite, model, ZOO, "--out", out, "--plan") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"4 evaluations, results in {out / 'results'}:",
        "  tiny on 5w1s: to run",
        "  tiny on 5w5s: to run",
        "  protonet_conv4_1shot on 5w1s: to run",
        "  protonet_conv4_1shot on 5w5s: to run",
    ]
    assert sorted(p.name for p in out.iterdir()) == ["suite.json"]  # no manifest, no result
    assert bench(suite, model, "--out", out, "--cells", "5w1s") == 0
    capsys.readouterr()
    assert bench(suite, model, ZOO, "--out", out, "--plan") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "  tiny on 5w1s: result present",
        "  tiny on 5w5s: to run",
        "  protonet_conv4_1shot on 5w1s: to run",
        "  protonet_conv4_1shot on 5w5s: to run",
    ]
    assert sorted(p.name for p in (out / "results").iterdir()) == ["tiny"]
    assert bench(suite, model, "--out", out, "--plan", "--limit", 5) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"2 evaluations, results in {out / 'first-5' / 'results'}:"
    assert lines[1:] == ["  tiny on 5w1s: to run", "  tiny on 5w5s: to run"]
    assert not (out / "first-5").exists()


def test_limit_is_a_quick_look_kept_apart(model, suite, bench, tmp_path, evaluations):
    out = tmp_path / "bench"
    assert bench(suite, model, "--out", out) == 0
    full = {r.cell: r.correct for r in read_results(out / "results", "tiny-v1", False)}
    times = {p: p.stat().st_mtime_ns for p in (out / "results").rglob("*.json")}
    evaluations.clear()
    assert bench(suite, model, "--out", out, "--limit", 5) == 0
    assert sorted(evaluations) == [(5, 1), (5, 5)]
    quick = read_results(out / "first-5" / "results", "tiny-v1", False)
    assert sorted(r.cell for r in quick) == ["5w1s", "5w5s"]
    for result in quick:
        assert len(result.correct) == 5
        assert torch.equal(result.correct, full[result.cell][:5])  # the first 5 episodes
        assert result.record["episodes"] == 5
    assert {p: p.stat().st_mtime_ns for p in (out / "results").rglob("*.json")} == times
    board = json.loads((out / "first-5" / "leaderboard.json").read_text())
    assert [c["episodes"] for c in board["cells"]] == [5, 5]
    # The full leaderboard again: results/ unchanged, nothing evaluated.
    evaluations.clear()
    assert bench(suite, model, "--out", out) == 0
    assert evaluations == []
    board = json.loads((out / "leaderboard.json").read_text())
    assert [c["episodes"] for c in board["cells"]] == [20, 20]


def test_a_failing_model_is_named_and_the_others_ranked(model, bench, tmp_path, capsys):
    two = tmp_path / "two.yaml"
    two.write_text(
        SUITE.replace("name: tiny", "name: two")
        .replace("way: 5\n", "shot: 1\n")
        .replace(
            "  - {name: 5w1s, shot: 1}\n  - {name: 5w5s, shot: 5}\n",
            "  - {name: 5w1s, way: 5}\n  - {name: 20w1s, way: 20}\n",
        )
    )
    assert [c.way for c in load_suite(str(two)).cells] == [5, 20]
    out = tmp_path / "bench"
    missing = tmp_path / "missing.pt"
    assert bench(two, model, MAML_5WAY, missing, "--out", out) == 2
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    err = printed.err.strip().splitlines()[-1]
    assert err.startswith("fewshot bench: error: 3 of 6 evaluations failed: ")
    assert err.endswith("(the others are ranked)")
    assert "maml_conv4_5way1shot_cpu on 20w1s: maml was trained 5-way" in err
    assert f"missing on 5w1s: checkpoint not found: {missing}" in err
    assert "missing on 20w1s" in err and "tiny on" not in err
    results = read_results(out / "results", "two-v1", False)
    assert sorted((r.name, r.cell) for r in results) == [
        ("maml_conv4_5way1shot_cpu", "5w1s"),
        ("tiny", "20w1s"),
        ("tiny", "5w1s"),
    ]
    ranked = standings(out)
    assert [name for name, _ in ranked["5w1s"]] == ["maml_conv4_5way1shot_cpu", "tiny"]
    assert ranked["20w1s"] == [("tiny", 1.0)]
    assert "leaderboard in" in printed.out


def test_a_bench_where_everything_fails_names_the_failures(suite, bench, tmp_path, capsys):
    missing = tmp_path / "missing.pt"
    assert bench(suite, missing, "--out", tmp_path / "bench") == 2
    err = final_error(capsys)
    assert err.startswith("fewshot bench: error: 2 of 2 evaluations failed")
    assert "checkpoint not found" in err


def test_a_suite_pin_or_manifest_that_differs_is_refused_before_any_evaluation(
    model, suite, bench, tmp_path, capsys, evaluations
):
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(
        SUITE.replace("{name: 5w5s, shot: 5}", f"{{name: 5w5s, shot: 5, sha256: {'ab' * 32}}}")
    )
    out = tmp_path / "pinned"
    args = ["bench", str(pinned), model, "--out", str(out), "--no-stored", "--device", "cpu"]
    err = error_line(capsys, args)
    assert "cell 5w5s: the episodes drawn now have SHA-256" in err
    assert "the suite pins abababababab" in err
    assert evaluations == [] and not (out / "results").exists()
    assert not (out / "manifests" / "5w5s.npz").exists()
    # A manifest changed in the folder after it was written.
    out = tmp_path / "bench"
    assert bench(suite, model, "--out", out, "--cells", "5w1s") == 0
    evaluations.clear()
    path = out / "manifests" / "5w1s.npz"
    with np.load(path) as data:
        arrays = {key: data[key].copy() for key in ("meta", "index", "classes")}
    arrays["index"][0, 0, 0] = arrays["index"][0, 0, 1]
    np.savez(path, **arrays)
    capsys.readouterr()
    args = ["bench", suite, model, "--out", str(out), "--no-stored", "--device", "cpu"]
    assert "SHA-256" in error_line(capsys, args)
    assert evaluations == []


def tiny_test_manifest(root: Path, path: Path) -> Manifest:
    """20 episodes of 5-way 1-shot 5-query of the tiny Omniglot's test split, written to path."""
    split = load_split("omniglot", "test", root)
    manifest = draw_manifest(
        split, {"dataset": "omniglot", "split": "test"}, EpisodeShape(5, 1, 5), 0, 20
    )
    write_manifest(manifest, path)
    return manifest


def test_eval_episodes_file_refuses_what_contradicts_it(
    model, tmp_path, capsys, tiny_omniglot_root
):
    path = tmp_path / "m.npz"
    manifest = tiny_test_manifest(tiny_omniglot_root, path)
    base = ["eval", "--checkpoint", model, "--episodes-file", str(path), "--device", "cpu"]
    base += ["--data-root", str(tiny_omniglot_root), "--out", str(tmp_path / "r.json")]
    for flag, value in (("--way", "20"), ("--shot", "5"), ("--query", "3"), ("--seed", "1")):
        err = error_line(capsys, [*base, flag, value])
        assert err.startswith(f"fewshot eval: error: {flag} is ")
        assert "in --episodes-file" in err and "leave it out" in err
    err = error_line(capsys, [*base, "--split", "val"])
    assert "--split is 'test' in --episodes-file" in err
    err = error_line(capsys, [*base, "--episodes", "21"])
    assert err.startswith("fewshot eval: error: --episodes is at most 20")
    err = error_line(capsys, [*base, "--varied"])
    assert "--varied does not apply with --episodes-file" in err
    # The flags that agree with it are taken.
    args = [*base, "--way", "5", "--shot", "1", "--query", "5", "--seed", "0", "--episodes", "7"]
    assert main([*args, "--per-episode"]) == 0
    capsys.readouterr()
    record = json.loads((tmp_path / "r.json").read_text())
    assert len(record["accuracies"]) == 7 and record["episodes_sha256"] == manifest.sha256
    # A changed manifest, and a missing one.
    with np.load(path) as data:
        arrays = {key: data[key].copy() for key in ("meta", "index", "classes")}
    arrays["classes"][3, 2] += 1
    np.savez(path, **arrays)
    err = error_line(capsys, [*base, "--episodes", "20"])
    assert f"episodes file {path}: its content does not match its recorded SHA-256" in err
    base[base.index(str(path))] = str(tmp_path / "none.npz")
    assert "not found" in error_line(capsys, [*base, "--episodes", "20"])


def test_eval_episodes_file_refuses_a_split_it_was_not_drawn_from(
    model, tmp_path, capsys, tiny_omniglot_root
):
    # Drawn from the cut test split (24 classes), evaluated on the shipped one (all classes).
    path = tmp_path / "m.npz"
    tiny_test_manifest(tiny_omniglot_root, path)
    args = ["eval", "--checkpoint", model, "--episodes-file", str(path), "--episodes", "20"]
    err = error_line(capsys, [*args, "--device", "cpu", "--out", str(tmp_path / "r.json")])
    assert f"--episodes-file {path} was drawn from omniglot split 'test' with other classes" in err
    assert not (tmp_path / "r.json").exists()


def test_eval_episodes_file_takes_an_explicit_thousand(model, tmp_path, tiny_omniglot_root):
    split = load_split("omniglot", "test", tiny_omniglot_root)
    shape = EpisodeShape(5, 1, 5)
    manifest = draw_manifest(split, {"dataset": "omniglot", "split": "test"}, shape, 0, 1001)
    write_manifest(manifest, tmp_path / "m.npz")
    record = run_eval(
        tiny_omniglot_root,
        *("--checkpoint", model, "--episodes-file", tmp_path / "m.npz", "--episodes", 1000),
        *("--out", tmp_path / "r.json"),
    )
    assert len(record["accuracies"]) == 1000


def test_compare_on_a_manifest_is_compare_on_the_seeded_episodes(
    model, tmp_path, capsys, tiny_omniglot_root
):
    split = load_split("omniglot", "test", tiny_omniglot_root)
    shape = EpisodeShape(5, 1, 5)
    manifest = draw_manifest(split, {"dataset": "omniglot", "split": "test"}, shape, 3, 20)
    write_manifest(manifest, tmp_path / "m.npz")
    common = ["compare", model, str(ZOO), "--device", "cpu", "--data-root", str(tiny_omniglot_root)]
    on_file = tmp_path / "file.json"
    args = [*common, "--episodes-file", str(tmp_path / "m.npz"), "--episodes", "20"]
    assert main([*args, "--out", str(on_file)]) == 0
    file_lines = capsys.readouterr().out.strip().splitlines()
    seeded = tmp_path / "seeded.json"
    args = [*common, "--way", "5", "--shot", "1", "--query", "5", "--episodes", "20"]
    assert main([*args, "--seed", "3", "--out", str(seeded)]) == 0
    seeded_lines = capsys.readouterr().out.strip().splitlines()
    a, b = (json.loads(p.read_text()) for p in (on_file, seeded))
    assert a["episodes_sha256"] == manifest.sha256 and "episodes_sha256" not in b
    for arm in "ab":
        assert a[arm]["accuracies"] == b[arm]["accuracies"]
    assert a["difference"] == b["difference"]
    assert file_lines[-1].startswith("B - A: ") and file_lines[-1] == seeded_lines[-1]
    # A flag that contradicts the manifest is refused as for eval.
    args = [*common, "--episodes-file", str(tmp_path / "m.npz"), "--seed", "4"]
    assert "--seed is 3 in --episodes-file" in error_line(capsys, args)


def test_the_zoo_stored_results_are_ranked_on_the_pinned_episodes(tmp_path, capsys):
    suite = load_suite("omniglot-v1")
    stored = read_results(STORED / suite.id, suite.id, True)
    names = sorted({r.name for r in stored})
    assert "ProtoNet" in names and {r.cell for r in stored} == {c.name for c in suite.cells}
    for result in stored:
        assert result.episodes_sha256 == suite.cell(result.cell).sha256, result.path
    out = tmp_path / "bench"
    assert main(["bench", suite.id, "--out", str(out), "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"0 evaluations, results in {out / 'results'}:",
        f"ranked with the stored results of {len(names)} models: {', '.join(names)}",
    ]
    args = ["bench", suite.id, "--out", str(out), "--rerun-stored", "nope", "--plan"]
    assert "names no stored model: 'nope'; stored: ANIL" in error_line(capsys, args)
    assert main(["bench", suite.id, "--out", str(out), "--plan", "--rerun-stored", "ProtoNet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("4 evaluations") and "  ProtoNet on 5w1s: to run" in lines
    # No model of its own: the stored results ranked (every cell's), the manifest of the cell
    # asked drawn here with its pin.
    assert main(["bench", suite.id, "--out", str(out), "--cells", "5w1s"]) == 0
    assert sorted(p.name for p in (out / "manifests").iterdir()) == ["5w1s.npz"]
    assert read_manifest(out / "manifests" / "5w1s.npz").sha256 == suite.cells[0].sha256
    board = json.loads((out / "leaderboard.json").read_text())
    assert board["stored"] == names
    for ranking in board["cells"]:
        assert "ProtoNet" in [s["name"] for s in ranking["standings"]]
        assert ranking["episodes"] == 2000
    assert not (out / "results").exists()


def test_bench_refusals_name_the_flag(tmp_path, capsys):
    args = ["bench", "omniglot-v1", "--out", str(tmp_path), "--rerun-stored", "nope", "--plan"]
    assert "error: --rerun-stored names no stored model" in error_line(capsys, args)


@pytest.mark.slow
def test_the_zoo_protonet_on_the_omniglot_v1_manifest_is_its_recorded_evaluation(
    omniglot_test, tmp_path
):
    recorded = REPO / "experiments" / "omniglot_reproduction" / "evals"
    recorded = json.loads((recorded / "protonet_conv4_trainval.c2c54ef4a9c8.5w1s.json").read_text())
    cell = load_suite("omniglot-v1").cell("5w1s")
    manifest = draw_manifest(
        omniglot_test, {"dataset": "omniglot", "split": "test"}, cell.shape, cell.seed, 2000
    )
    assert manifest.sha256 == cell.sha256
    path = tmp_path / "5w1s.npz"
    write_manifest(manifest, path)
    checkpoint = REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt"
    out = tmp_path / "eval.json"
    args = ["eval", "--checkpoint", str(checkpoint), "--episodes-file", str(path)]
    assert main([*args, "--amp", "off", "--per-episode", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["episodes"] == 2000 and record["episodes_sha256"] == cell.sha256
    assert record["checkpoint_sha256"] == recorded["checkpoint_sha256"]
    assert record["dataset_fingerprint"] == recorded["dataset_fingerprint"]
    queries = 5 * 15
    ours = [round(a * queries) for a in record["accuracies"]]
    theirs = [round(a * queries) for a in recorded["accuracies"]]
    assert len(ours) == len(theirs) == 2000
    differing = [i for i, (x, y) in enumerate(zip(ours, theirs, strict=True)) if x != y]
    assert not differing, f"{len(differing)} episodes differ, the first {differing[:10]}"
    # The zoo's stored bench result of this model is the same evaluation.
    zoo = read_result(STORED / "omniglot-v1" / "protonet" / "5w1s.json", True)
    assert zoo.episodes_sha256 == cell.sha256
    assert zoo.correct.tolist() == ours


def test_a_stored_model_evaluated_again_is_its_stored_record(tmp_path, capsys):
    # The floor (a frozen conv4 with its seeded initialisation): --rerun-stored rebuilds it
    # from its record and finds every episode of its stored result, and the leaderboard ranks
    # the new result in place of the stored one.
    name, out = "random conv4 (floor)", tmp_path / "bench"
    args = ["bench", "omniglot-v1", "--rerun-stored", name, "--cells", "20w5s", "--limit", "100"]
    assert main([*args, "--out", str(out), "--device", "cpu"]) == 0
    [again] = read_results(out / "first-100" / "results", "omniglot-v1", False)
    stored = read_result(STORED / "omniglot-v1" / "random-conv4-floor" / "20w5s.json", True)
    assert again.name == name and again.record["stored_model"] is True
    assert torch.equal(again.correct, stored.correct[:100])
    board = json.loads((out / "first-100" / "leaderboard.json").read_text())
    assert name not in board["stored"] and "ProtoNet" in board["stored"]


def test_the_python_api_returns_the_leaderboard(model, suite, tmp_path, tiny_omniglot_root):
    out = tmp_path / "bench"
    board = fewshot.bench(
        suite, model, out=out, stored=False, data_root=tiny_omniglot_root, device="cpu"
    )
    assert [ranking.cell for ranking in board.cells] == ["5w1s", "5w5s"]
    assert board.cells[0].standings[0].name == "tiny"
    assert json.loads((out / "leaderboard.json").read_text()) == json.loads(
        json.dumps(board.to_json())
    )
    with pytest.raises(FewshotError, match="--limit 50 is more than the 20 episodes"):
        fewshot.bench(suite, model, out=out, stored=False, limit=50)
