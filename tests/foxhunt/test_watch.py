"""``foxhunt watch``: a GIF of one book of ``foxhunt evaluate``'s held-out evaluation, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foxhunt.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained run folder: episodes of 20 steps, evaluated on 2 books x 40 steps (2 windows each)."""
    out = tmp_path_factory.mktemp("watch") / "run"
    assert main(["train", "--steps", "120", "--n-envs", "2", "--out", str(out), "--no-progress",
                 "--eval-steps", "40", "--env.episode-length", "20", "--no-hindsight"]) == 0
    return out


def _frames(path: Path) -> int:
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "GIF"
        return image.n_frames


def test_watch_draws_a_book_of_the_held_out_evaluation(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> (
        None):
    """The GIF has the frames asked for; the book walks the held-out market (seed 1, not the training seed
    0) on the evaluation's windows, step for step as ``foxhunt evaluate`` records it, across an episode's
    end."""
    import torch

    from foxhunt.evaluation.api import evaluate_policies
    from foxhunt.evaluation.model_file import load_model
    from foxhunt.runs import RunConfig

    assert main(["watch", str(run_dir), "--steps", "25", "--book", "1", "--no-progress", "--fps", "10"]) == 0
    (gif,) = (run_dir / "watch").glob("*.gif")
    assert f"animation: {gif}" in capsys.readouterr().out
    assert _frames(gif) == 25
    record = json.loads(gif.with_suffix(".json").read_text())
    setup = record["setup"]
    assert setup["market_seed"] == 1 and setup["train_market_seed"] == 0
    assert setup["market"].startswith("synthetic seed=1 ") and setup["books"] == 2 and setup["book"] == 1
    assert len(setup["offsets"]) == 2 and setup["episode_length"] == 20 and setup["steps"] == 25
    config = RunConfig.load(run_dir / "config.json")
    evaluation = evaluate_policies(
        {"policy": load_model(run_dir / "model.zip")}, "synthetic", baselines=(), n_envs=2, steps=40,
        seed=config.seed + 1000, market_seed=1, train_market_seed=0, env_kwargs=config.resolved_env_kwargs(),
        market_kwargs={"num_steps": config.synthetic_market_steps})
    recording = evaluation.results["policy"].recording
    assert recording.offsets[:, 1].tolist() == setup["offsets"]
    for name in ("equity", "position", "mid"):
        expected = recording.series[name][:25, 1].double()
        assert torch.allclose(torch.tensor(record["series"][name], dtype=torch.float64), expected), name
    assert record["series"]["actions"] == recording.series["actions"][:25, 1].tolist()
    # each frame draws the depth of the row the book stands on after its step
    from foxhunt.evaluation.api import build_market

    market = build_market("synthetic", market_seed=1, num_steps=config.synthetic_market_steps)
    rows = torch.tensor(record["series"]["row"])
    assert rows[0] == setup["offsets"][0] + 1 and rows[20] == setup["offsets"][1] + 1
    drawn_mid = (market.bid_price[rows, 0] + market.ask_price[rows, 0]).double() / 2
    assert torch.allclose(drawn_mid, recording.series["mid"][:25, 1].double())


def test_watch_a_model_file_on_another_market_into_a_named_file(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "movie" / "book0.gif"
    assert main(["watch", str(run_dir / "model.zip"), "--market-seed", "7", "--steps", "3", "--out", str(out),
                 "--no-progress"]) == 0
    assert _frames(out) == 3
    setup = json.loads(out.with_suffix(".json").read_text())["setup"]
    assert setup["market_seed"] == 7 and setup["market"].startswith("synthetic seed=7 ")


def test_watch_refuses_bad_input_naming_the_option(run_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from matplotlib import animation

    (tmp_path / "there.gif").write_bytes(b"GIF89a")
    cases = [
        (["--steps", "0"], "--steps=0 must be >= 1"),
        (["--book", "-1"], "--book=-1 must be >= 0"),
        (["--book", "2"], "--book=2: the evaluation has 2 book(s), 0 to 1"),
        (["--steps", "41"], "--steps=41: the evaluation steps each book 40 times"),
        (["--fps", "0"], "--fps=0 must lie in (0, 100]"),
        (["--out", str(tmp_path / "a.png")], "must end in .gif or .mp4"),
        (["--out", str(tmp_path / "there.gif")], "exists: name a new file"),
        (["--market-seed", "0"], "--market-seed=0 is the training market's seed: not held out"),
        (["--signal-strength", "-1"], "--signal-strength=-1.0 must be >= 0"),
    ]
    if not animation.writers.is_available("ffmpeg"):
        cases.append((["--out", str(tmp_path / "a.mp4")], "needs ffmpeg, which is not installed here; "
                      "write a .gif instead"))
    for extra, message in cases:
        assert main(["watch", str(run_dir), "--no-progress", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("foxhunt: error: ") and message in err and err.count("\n") == 1, (extra, err)
    assert main(["watch", str(tmp_path / "nothing")]) == 2
    assert "must be a run folder or a model .zip" in capsys.readouterr().err
    assert not (run_dir / "watch").exists() or len(list((run_dir / "watch").glob("*.gif"))) <= 1


@pytest.mark.gpu
def test_watch_on_cuda_plays_the_book_as_on_the_cpu(run_dir: Path, tmp_path: Path) -> None:
    """``--device cuda`` steps the env and the model on the GPU: the same frames, actions and positions."""
    records = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.gif"
        assert main(["watch", str(run_dir), "--steps", "6", "--device", device, "--out", str(out),
                     "--no-progress"]) == 0
        assert _frames(out) == 6
        records[device] = json.loads(out.with_suffix(".json").read_text())
    assert records["cuda"]["setup"]["device"] == "cuda"
    assert records["cuda"]["series"]["actions"] == records["cpu"]["series"]["actions"]
    assert records["cuda"]["series"]["position"] == pytest.approx(records["cpu"]["series"]["position"])
