"""Episodes a user can look at: `fewshot eval --save-episodes` records each seeded episode's
images, predictions and accuracy; `fewshot show` draws them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from fewshot.cli.main import main
from fewshot.datasets import load_split
from fewshot.datasets.sampler import EpisodeShape
from fewshot.datasets.varied import VariedShape, episode_shots
from fewshot.evaluation.episodes import seeded_episodes

REPO = Path(__file__).resolve().parents[1]
PROTONET = REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt"
MAML = REPO / "models" / "omniglot" / "maml_conv4_5way1shot_cpu.pt"


def saved_episodes(tmp_path: Path, checkpoint: Path, *extra: str) -> dict:
    """`fewshot eval --save-episodes` of 12 seeded 5-way 1-shot episodes; its two outputs."""
    result, episodes = tmp_path / "result.json", tmp_path / "episodes.json"
    argv = ["eval", "--checkpoint", str(checkpoint), "--episodes", "12", "--seed", "4"]
    argv += ["--query", "3", "--per-episode", "--device", "cpu", "--out", str(result)]
    argv += ["--no-cache"]  # 12 episodes: embedding the whole split would cost more
    assert main([*argv, "--save-episodes", str(episodes), *extra]) == 0
    return {"result": json.loads(result.read_text()), "saved": json.loads(episodes.read_text())}


@pytest.mark.parametrize("checkpoint", [PROTONET, MAML], ids=["protonet", "maml"])
def test_saved_episodes_are_the_evaluated_ones(tmp_path, checkpoint, omniglot_test):
    both = saved_episodes(tmp_path, checkpoint)
    result, saved = both["result"], both["saved"]
    episodes = saved["episodes"]
    # The accuracy of each saved episode's predictions is the evaluation's, episode by episode.
    assert [e["accuracy"] for e in episodes] == pytest.approx(result["accuracies"], abs=1e-6)
    assert saved["accuracy"] == pytest.approx(result["accuracy"])
    # Its images are the seeded episodes: the same split indices, support first.
    shape = EpisodeShape(5, 1, 3, 8)
    index = torch.cat(list(seeded_episodes(omniglot_test, shape, 12, 4)))
    for e, want in zip(episodes, index, strict=True):
        assert e["support"] == want[:, :1].tolist() and e["query"] == want[:, 1:].tolist()
        assert e["classes"] == omniglot_test.labels[want[:, 0]].tolist()
        assert len(e["predicted"]) == 5 and all(len(row) == 3 for row in e["predicted"])
    assert saved["class_names"] == omniglot_test.class_names
    # The MAML family's BatchNorm reads each episode's queries together: said in the result.
    assert result["transductive"] is (checkpoint == MAML)


def test_saved_episodes_draw_a_classifiers_random_numbers_as_the_evaluation(tmp_path):
    """Fine-tuning one step from its random initial weights: the predictions are the initial
    draw's, so the saved episodes match the evaluation only if each draws its episode's seed."""
    options = ["--classifier", "finetune", "--classifier-options", '{"steps": 1, "lr": 1e-4}']
    both = saved_episodes(tmp_path, PROTONET, *options)
    accuracies = both["result"]["accuracies"]
    assert min(accuracies) < 0.8  # near the initial draw: far from the model's 98 %
    assert [e["accuracy"] for e in both["saved"]["episodes"]] == pytest.approx(accuracies)


def test_varied_episodes_are_saved_as_evaluated_and_drawn_with_their_own_shape(tmp_path, capsys):
    """Unequal shots and ways per episode; fine-tuning one step from its random initial
    weights, so the saved predictions match the evaluation only if each episode draws its own
    seed as the evaluation does."""
    varied = ["--varied", "--way", "3", "--max-way", "6", "--shot", "4", "--max-support", "12"]
    options = ["--classifier", "finetune", "--classifier-options", '{"steps": 1, "lr": 1e-4}']
    both = saved_episodes(tmp_path, PROTONET, *varied, *options)
    episodes = both["saved"]["episodes"]
    assert [e["accuracy"] for e in episodes] == pytest.approx(both["result"]["accuracies"])
    split = load_split("omniglot", "test")
    shape = VariedShape(way=3, max_way=6, shot=4, max_support=12, query=3)
    batches = list(seeded_episodes(split, shape, 12, 4))  # one varied episode a batch
    for e, batch in zip(episodes, batches, strict=True):
        [want], [counts] = batch, episode_shots(batch, 3)
        rows = [row[row >= 0] for row in want]
        assert e["support"] == [r[:k].tolist() for r, k in zip(rows, counts.tolist(), strict=True)]
        assert e["query"] == [r[k:].tolist() for r, k in zip(rows, counts.tolist(), strict=True)]
        assert [len(row) for row in e["predicted"]] == [3] * len(rows)
    # The draw covers what it must: episodes of several ways, classes of unequal shots.
    ways = [len(e["classes"]) for e in episodes]
    assert len(set(ways)) > 1
    assert any(len({len(s) for s in e["support"]}) > 1 for e in episodes)
    # Each episode drawn with its own rows: one of the most classes against one of the fewest.
    drawn = {}
    for number in (ways.index(max(ways)), ways.index(min(ways))):
        out = tmp_path / f"{number}.png"
        argv = ["show", str(tmp_path / "episodes.json"), "--episode", str(number)]
        assert main([*argv, "--out", str(out)]) == 0
        drawn[number] = Image.open(out).size[1]
    big, small = drawn[ways.index(max(ways))], drawn[ways.index(min(ways))]
    assert big / small == pytest.approx(max(ways) / min(ways), rel=0.25)


def test_a_folder_data_set_records_each_images_file(tmp_path, omniglot_test):
    root = tmp_path / "folder"
    for c in range(6):
        folder = root / "test" / f"class{c}"
        folder.mkdir(parents=True)
        for j in range(4):
            Image.fromarray(omniglot_test.images[20 * c + j, 0].numpy()).save(folder / f"{j}.png")
    both = saved_episodes(
        tmp_path, PROTONET, "--dataset", "folder", "--data-root", str(root), "--episodes", "3"
    )
    split = load_split("folder", "test", root)
    for e in both["saved"]["episodes"]:
        for c, row in enumerate(e["files"]):
            indices = e["support"][c] + e["query"][c]
            assert row == [
                str(root / "test" / f"class{split.labels[i]}" / f"{i % 4}.png") for i in indices
            ]


def test_show_draws_the_worst_episodes(tmp_path, capsys):
    saved = saved_episodes(tmp_path, MAML)["saved"]
    capsys.readouterr()
    accuracies = [e["accuracy"] for e in saved["episodes"]]
    worst = sorted(range(12), key=lambda i: (accuracies[i], i))[:2]
    out = tmp_path / "worst.png"
    assert main(["show", str(tmp_path / "episodes.json"), "--worst", "2", "--out", str(out)]) == 0
    assert f"episodes {worst[0]}, {worst[1]} in " in capsys.readouterr().out
    small = tmp_path / "one.png"
    assert (
        main(["show", str(tmp_path / "episodes.json"), "--episode", "3", "--out", str(small)]) == 0
    )
    # Two episodes of 5 classes are twice the rows of one.
    assert Image.open(out).size[1] > 1.8 * Image.open(small).size[1]
    assert main(["show", str(tmp_path / "episodes.json"), "--out", str(small)]) == 2  # kept


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--episode", "12"], "--episode 12: "),
        (["--episode", "1", "--worst", "2"], "give --episode or --worst, not both"),
        (["--worst", "17"], "draws at most 16"),
        (["--out", "x.gif"], "--out must end in .png, .pdf, .svg"),
    ],
)
def test_show_refuses_in_one_line(tmp_path, argv, message, capsys):
    saved_episodes(tmp_path, PROTONET)
    capsys.readouterr()
    assert main(["show", str(tmp_path / "episodes.json"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (json.dumps({"accuracy": 99.0}), "is not a file of fewshot eval --save-episodes"),
        ("garbage", "is not valid JSON: Expecting value: line 1 column 1"),
        ("[1, 2]", "must hold a JSON object, not a list"),
    ],
)
def test_show_refuses_a_file_that_is_not_saved_episodes(tmp_path, capsys, text, message):
    other = tmp_path / "result.json"
    other.write_text(text)
    assert main(["show", str(other), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert message in err and str(other) in err and len(err.strip().splitlines()) == 1
