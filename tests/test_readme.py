"""The README's Python examples run as written on a CPU machine (with their step budgets cut down), in order,
in a fresh folder, so they cannot rot; and its two commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
#: The only edits: smaller budgets (each must still match, so a changed README cannot skip its cut).
BUDGETS = {
    r"make_vec\(4096,": "make_vec(4,",
    r"model\.learn\(15_000,": "model.learn(1_200,",
    r"n_eval_episodes=8": "n_eval_episodes=1",
    r"\"episode_length\": presets\.CPU\.env\.episode_length": '"episode_length": 60',
    r"\"num_steps\": presets\.CPU\.synthetic_market_steps": '"num_steps": 1_500',
    r"\{\"episode_length\": 500\}": '{"episode_length": 60}',
    r"\{\"num_steps\": 20_000\}": '{"num_steps": 1_500}',
    r"steps=500": "steps=60",
}


def python_examples() -> list[str]:
    """The README's fenced ``python`` blocks, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.slow
def test_the_readme_examples_run_on_a_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    examples = python_examples()
    assert len(examples) == 3
    counts = dict.fromkeys(BUDGETS, 0)
    cut = []
    for block in examples:
        assert 'device="cuda"' not in block  # a CPU machine picks its device
        for pattern, replacement in BUDGETS.items():
            block, count = re.subn(pattern, replacement, block)
            counts[pattern] += count
        cut.append(block)
    missing = [pattern for pattern, count in counts.items() if not count]
    assert not missing, f"README no longer has {missing}: update BUDGETS"
    monkeypatch.chdir(tmp_path)
    for block in cut:  # in order: the evaluation example loads the model the algorithm example saved
        exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})  # noqa: S102
    assert (tmp_path / "runs" / "demo" / "model.zip").is_file()


def test_the_readme_commands_are_the_ones_ci_runs() -> None:
    text = README.read_text()
    assert "\npip install -e . && foxhunt train\n" in text
    assert '\npip install -e ".[test]" && pytest -q\n' in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci and 'readme_command \'pip install -e "\\.\\[test\\]"\'' in ci
