"""The launcher's view of rank 0's output: rlhf_dyna's own lines, rendered for each tracking.console mode."""
from __future__ import annotations

import io

import pytest

from rlhf_dyna.tracking.console import format_step_line, parse_step_line
from rlhf_dyna.tracking.console_view import ConsoleView

RANK0 = [  # what rank 0 prints, ours and third parties' interleaved
    "/venv/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated",
    "rlhf_dyna: starting vLLM (tp=1, max_model_len=64)...",
    "[rank0]:[W1206 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 223.45it/s]",
    "step 0/4 | eval/accuracy 0.25 (step 0)",
    "step 1/4 | reward/mean 0.5 | eval/accuracy 0.25 (step 0) | eta 0:00:09",
    "rlhf_dyna.tasks.rewards.RewardError: the last line of a traceback is not ours to show",
    "step 2/4 | reward/mean 0.625 | eval/accuracy 0.5 (step 2) | eta 0:00:05",
    "rlhf_dyna: step 2: checkpoint /run/checkpoints/step_2 (6.4 MiB) in 0.23 s",
]
THIRD_PARTY = ("FutureWarning", "NUMA", "safetensors", "RewardError")


def shown(mode: str, terminal: bool = False) -> str:
    stream = io.StringIO()
    stream.isatty = lambda: terminal  # rich asks the stream whether it is a terminal
    view = ConsoleView(mode, stream)
    view.start()
    for line in RANK0:
        view.rank_line(line)
    view.close()
    return stream.getvalue()


def test_step_lines_round_trip():
    line = format_step_line(3, 20, {"reward/mean": 0.5, "timing_s/step": 1.25, "other": 1.0},
                            ("reward/mean", "timing_s/step"), last_eval=(0, 0.25), eta_s=3725)
    assert line == "step 3/20 | reward/mean 0.5 | timing_s/step 1.25 | eval/accuracy 0.25 (step 0) | eta 1:02:05"
    parsed = parse_step_line(line)
    assert (parsed.step, parsed.total_steps, parsed.eval_step) == (3, 20, 0)
    assert parsed.fields == {"reward/mean": "0.5", "timing_s/step": "1.25", "eval/accuracy": "0.25 (step 0)",
                             "eta": "1:02:05"}
    assert parse_step_line("step 3 of 20") is None and parse_step_line("rlhf_dyna: step 2: checkpoint") is None


def test_plain_shows_our_lines_only():
    out = shown("plain").splitlines()
    assert out == [line for line in RANK0 if not any(word in line for word in THIRD_PARTY)]


def test_off_keeps_our_notices_but_no_steps():
    assert shown("off").splitlines() == [RANK0[1], RANK0[-1]]


def test_verbose_shows_everything():
    assert shown("verbose").splitlines() == RANK0


def test_progress_off_a_terminal_is_plain():
    assert shown("progress") == shown("plain")


def test_progress_on_a_terminal_keeps_notices_and_evaluated_steps_above_a_live_line():
    out = shown("progress", terminal=True)
    for word in THIRD_PARTY:
        assert word not in out
    assert RANK0[-1] in out and RANK0[4] in out and RANK0[7] in out  # notices and the evaluated steps 0 and 2
    assert RANK0[5] not in out, "a step without an eval is shown on the live line only"
    assert "step 2/4" in out and "reward 0.625" in out and "eval 0.5 (step 2)" in out and "eta 0:00:05" in out
    assert "━" in out  # the bar


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="console mode must be one of"):
        ConsoleView("quiet", io.StringIO())
