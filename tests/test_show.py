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


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> dict:
    """A saved-episodes file of 3 seeded 5-way 1-shot episodes with 3 queries per class, as
    `fewshot eval --save-episodes` wrote it (parsed)."""
    return saved_episodes(tmp_path_factory.mktemp("intact"), PROTONET, "--episodes", "3")["saved"]


def other_class_image(saved: dict) -> int:
    """The split index of an image of episode 0's class 1: of another class than its class 0."""
    return saved["episodes"][0]["support"][1][0]


def set_in(saved: dict, *path_and_value) -> None:
    """Replace the value at a path of keys and positions (the last argument is the value)."""
    *path, key, value = path_and_value
    for step in path:
        saved = saved[step]
    saved[key] = value


def delete(saved: dict, *path) -> None:
    """Delete the value at a path of keys and positions."""
    *path, key = path
    for step in path:
        saved = saved[step]
    del saved[key]


# Each case damages one thing of an intact file (a function of the parsed file) and gives the
# line's text after the file's path: every check in the order read_saved and run_show make them.
DAMAGED = {
    "no class names": (
        lambda s: delete(s, "class_names"),
        " is not a file of fewshot eval --save-episodes (no 'class_names')",
    ),
    "dataset not a string": (
        lambda s: set_in(s, "dataset", 5),
        " is damaged: 'dataset' must be a string, got 5",
    ),
    "resize a string": (
        lambda s: set_in(s, "resize", "28"),
        " is damaged: 'resize' must be a positive integer or null, got \"28\"",
    ),
    "class names not strings": (
        lambda s: set_in(s, "class_names", 0, 7),
        " is damaged: 'class_names' must be a non-empty list of strings",
    ),
    "episodes an object": (
        lambda s: set_in(s, "episodes", {"0": {}}),
        " is damaged: 'episodes' must be a non-empty list of episodes",
    ),
    "no episodes": (
        lambda s: set_in(s, "episodes", []),
        " is damaged: 'episodes' must be a non-empty list of episodes",
    ),
    "episode a list": (
        lambda s: set_in(s, "episodes", 1, [1, 2]),
        " is damaged: episode 1 must be an object, not a list",
    ),
    "episode without queries": (
        lambda s: delete(s, "episodes", 2, "query"),
        " is damaged: episode 2 has no 'query'",
    ),
    "class beyond the names": (
        lambda s: set_in(s, "episodes", 0, "classes", 4, len(s["class_names"])),
        " is damaged: episode 0 'classes' must be a non-empty list of class numbers 0 to "
        "1691 ('class_names')",
    ),
    "class a bool": (
        lambda s: set_in(s, "episodes", 0, "classes", 0, True),
        " is damaged: episode 0 'classes' must be a non-empty list of class numbers 0 to "
        "1691 ('class_names')",
    ),
    "a class's support missing": (
        lambda s: s["episodes"][1]["support"].pop(),
        " is damaged: episode 1 'support' must be 5 lists of one or more image indices",
    ),
    "an empty support": (
        lambda s: set_in(s, "episodes", 1, "support", 2, []),
        " is damaged: episode 1 'support' must be 5 lists of one or more image indices",
    ),
    "a negative index": (
        lambda s: set_in(s, "episodes", 1, "support", 2, 0, -1),
        " is damaged: episode 1 'support' must be 5 lists of one or more image indices",
    ),
    "an index as text": (
        lambda s: set_in(s, "episodes", 2, "query", 3, 0, "12"),
        " is damaged: episode 2 'query' must be 5 lists of image indices",
    ),
    "an index as a float": (
        lambda s: set_in(s, "episodes", 2, "query", 3, 0, 12.0),
        " is damaged: episode 2 'query' must be 5 lists of image indices",
    ),
    "a prediction beyond the way": (
        lambda s: set_in(s, "episodes", 0, "predicted", 1, 0, 5),
        " is damaged: episode 0 'predicted' must be 5 lists of class positions 0 to 4, one "
        "per query",
    ),
    "a prediction missing": (
        lambda s: s["episodes"][0]["predicted"][1].pop(),
        " is damaged: episode 0 'predicted' must be 5 lists of class positions 0 to 4, one "
        "per query",
    ),
    "accuracy as text": (
        lambda s: set_in(s, "episodes", 1, "accuracy", "high"),
        " is damaged: episode 1 'accuracy' must be a number, got \"high\"",
    ),
    "accuracy a bool": (
        lambda s: set_in(s, "episodes", 1, "accuracy", True),
        " is damaged: episode 1 'accuracy' must be a number, got true",
    ),
    "accuracy beyond 1": (
        lambda s: set_in(s, "episodes", 1, "accuracy", 1.5),
        " is damaged: episode 1 'accuracy' must be between 0 and 1, got 1.5",
    ),
    "an index beyond the split": (
        lambda s: set_in(s, "episodes", 2, "query", 4, 2, 10**9),
        " does not match omniglot split 'test': episode 2 class 4 names image 1000000000, "
        "beyond the 33840 images of the split",
    ),
    "an image of another class": (
        lambda s: set_in(s, "episodes", 0, "query", 0, 1, other_class_image(s)),
        " does not match omniglot split 'test': episode 0 class 0's image {image} is of class "
        "{now!r} in the data now, the file records {recorded!r}: the data changed since it "
        "was saved",
    ),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_show_refuses_a_damaged_episodes_file_in_one_line(case, intact, tmp_path, capsys):
    """Every key show reads, damaged one at a time: one line naming the file and the fault,
    exit 2, nothing drawn (never a KeyError, IndexError or TypeError)."""
    damage, message = DAMAGED[case]
    saved = json.loads(json.dumps(intact))
    damage(saved)
    path, out = tmp_path / "episodes.json", tmp_path / "drawn.png"
    path.write_text(json.dumps(saved))
    assert main(["show", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    names = intact["class_names"]
    episode = intact["episodes"][0]
    expected = message.format(
        image=other_class_image(intact),
        now=names[episode["classes"][1]],
        recorded=names[episode["classes"][0]],
    )
    assert err == f"fewshot show: error: {path}{expected}"
    assert not out.exists()


def test_the_intact_file_the_damaged_cases_start_from_draws(intact, tmp_path):
    path, out = tmp_path / "episodes.json", tmp_path / "drawn.png"
    path.write_text(json.dumps(intact))
    assert main(["show", str(path), "--out", str(out), "--episode", "0", "2"]) == 0
    assert Image.open(out).size[1] > 0
