import json

import pytest
import torch
from omegaconf import OmegaConf

from rlhf_dyna.tracking import METRICS_FILE, Tracker
from .wandb_records import history_rows, read_records

DISABLED = {"wandb_mode": "disabled"}


def _lines(path):
    return [json.loads(line) for line in (path / METRICS_FILE).read_text().splitlines()]


def test_jsonl_one_object_per_step(tmp_path):
    with Tracker(tmp_path, DISABLED, console="off", total_steps=3) as tracker:
        tracker.log(1, {"reward/mean": 0.5, "actor/pg_loss": torch.tensor(-0.25)})
        tracker.log(2, {"reward/mean": 0.75, "eval/accuracy": 1})
        tracker.log(3, {"actor/kl": float("nan"), "critic/vf_loss": float("inf")})
    assert _lines(tmp_path) == [
        {"step": 1, "reward/mean": 0.5, "actor/pg_loss": -0.25},
        {"step": 2, "reward/mean": 0.75, "eval/accuracy": 1.0},
        {"step": 3, "actor/kl": None, "critic/vf_loss": None},  # strict JSON: non-finite -> null
    ]


def test_jsonl_appends_on_resume(tmp_path):
    with Tracker(tmp_path, None, console="off", total_steps=2) as tracker:
        tracker.log(1, {"reward/mean": 0.1})
    with Tracker(tmp_path, None, console="off", total_steps=2) as tracker:
        tracker.log(2, {"reward/mean": 0.2})
    assert [line["step"] for line in _lines(tmp_path)] == [1, 2]


def test_a_rewind_drops_the_rows_of_the_steps_to_be_logged_again(tmp_path):
    """A recovery rolled the run back to step 2 (orchestrator/recovery.py): steps 3-4 are redone, each logged once."""
    with Tracker(tmp_path, DISABLED, console="off", total_steps=5) as tracker:
        for step in range(5):
            tracker.log(step, {"a": float(step)})
        tracker.rewind(2)
        with pytest.raises(ValueError, match="steps must increase"):
            tracker.log(2, {"a": 20.0})
        tracker.log(3, {"a": 30.0})
        tracker.log(4, {"a": 40.0})
    assert [(line["step"], line["a"]) for line in _lines(tmp_path)] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0),
                                                                        (4, 40.0)]


def test_a_tracker_that_takes_over_after_a_rollback_drops_the_later_rows_and_a_cut_line(tmp_path):
    """Rank 0 lost during step 4 after logging steps 0-3 (the last row cut short by the kill), the run rolled back to
    step 2: its successor's tracker drops the rows of steps 3 and after, and the step lines go on from step 3."""
    rows = "".join(json.dumps({"step": s, "a": float(s)}) + "\n" for s in range(4)) + '{"step": 4, "a'
    (tmp_path / METRICS_FILE).write_text(rows)
    with Tracker(tmp_path, DISABLED, console="off", total_steps=5, after_step=2) as tracker:
        with pytest.raises(ValueError, match="steps must increase"):
            tracker.log(2, {"a": 20.0})
        tracker.log(3, {"a": 30.0})
    assert [(line["step"], line["a"]) for line in _lines(tmp_path)] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
    assert not list(tmp_path.glob("*.tmp"))


def test_steps_must_increase_and_step_key_reserved(tmp_path):
    with Tracker(tmp_path, DISABLED, console="off", total_steps=3) as tracker:
        tracker.log(2, {"a": 1.0})
        with pytest.raises(ValueError, match="steps must increase"):
            tracker.log(2, {"a": 2.0})
        with pytest.raises(ValueError, match="reserved"):
            tracker.log(3, {"step": 1.0})


def test_bad_wandb_config_rejected(tmp_path):
    with pytest.raises(ValueError, match="wandb_mode"):
        Tracker(tmp_path, {"wandb_mode": "sometimes"}, console="off", total_steps=1)
    with pytest.raises(ValueError, match="unknown wandb_cfg keys"):
        Tracker(tmp_path, {"wandb_mode": "disabled", "entity": "x"}, console="off", total_steps=1)


def test_a_line_per_step_with_the_last_eval_and_an_eta(tmp_path, capsys, monkeypatch):
    clock = iter([100.0, 102.0, 106.0])  # the sink's monotonic clock at steps 0, 1, 2
    monkeypatch.setattr("rlhf_dyna.tracking.console.time.monotonic", lambda: next(clock))
    with Tracker(tmp_path, DISABLED, console="plain", total_steps=4) as tracker:
        tracker.log(0, {"eval/accuracy": 0.25})
        tracker.log(1, {"reward/mean": 0.5, "actor/pg_loss": -0.012345, "reshard/x/seconds": 1.0})
        tracker.log(2, {"reward/mean": 0.625})
    out = capsys.readouterr().out.splitlines()
    assert out == ["step 0/4 | eval/accuracy 0.25 (step 0)",
                   "step 1/4 | reward/mean 0.5 | actor/pg_loss -0.01235 | eval/accuracy 0.25 (step 0) | eta 0:00:06",
                   "step 2/4 | reward/mean 0.625 | eval/accuracy 0.25 (step 0) | eta 0:00:06"]


def test_console_off_prints_nothing_and_modes_are_checked(tmp_path, capsys):
    with Tracker(tmp_path, DISABLED, console="off", total_steps=2) as tracker:
        tracker.log(1, {"reward/mean": 0.5})
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="console must be one of"):
        Tracker(tmp_path, DISABLED, console=True, total_steps=2)


def test_wandb_offline_run_holds_metrics_and_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # our dir= must win
    wandb_cfg = OmegaConf.create({"wandb_mode": "offline", "project": "rlhf_test", "run_name": "t1", "console": "progress"})
    run_config = {"algorithm": {"name": "grpo", "lr": 1e-4}}
    tracker = Tracker(tmp_path, wandb_cfg, console="off", total_steps=2, run_config=run_config)
    run_dir = tracker.wandb_run_dir
    tracker.log(1, {"reward/mean": 0.5, "timing_s/generation": 1.25})
    tracker.log(2, {"reward/mean": 0.75})
    tracker.close()
    tracker.close()  # idempotent

    assert run_dir.parent == tmp_path / "wandb" and run_dir.name.startswith("offline-run-")
    records = read_records(next(run_dir.glob("run-*.wandb")))
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.display_name) == ("rlhf_test", "t1")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["algorithm"] == {"name": "grpo", "lr": 1e-4}
    rows = history_rows(records)
    assert [(row["_step"], row["reward/mean"]) for row in rows] == [("1", "0.5"), ("2", "0.75")]
    assert rows[0]["timing_s/generation"] == "1.25"
    assert [line["step"] for line in _lines(tmp_path)] == [1, 2]


def test_one_wandb_run_per_output_dir_across_rank_0s_and_rewinds(tmp_path):
    """A recovery rewinds rank 0's tracker (the redone steps go to metrics.jsonl, wandb keeps the values it was sent
    first), and a new rank 0 (the old one lost) opens the same wandb run: one run id for the directory."""
    wandb_cfg = {"wandb_mode": "offline", "project": "rlhf_test"}
    first = Tracker(tmp_path, wandb_cfg, console="off", total_steps=5)
    for step in (1, 2, 3):
        first.log(step, {"reward/mean": float(step)})
    first.rewind(1)
    for step in (2, 3, 4):
        first.log(step, {"reward/mean": 10.0 * step})
    first_dir = first.wandb_run_dir
    first.close()
    second = Tracker(tmp_path, wandb_cfg, console="off", total_steps=5, after_step=4)
    second.log(5, {"reward/mean": 50.0})
    second_dir = second.wandb_run_dir
    second.close()

    run_id = (tmp_path / "wandb" / "run_id").read_text()
    assert first_dir != second_dir and first_dir.name.endswith(run_id) and second_dir.name.endswith(run_id)
    sent = [(r["_step"], r["reward/mean"]) for r in history_rows(read_records(next(first_dir.glob("run-*.wandb"))))]
    assert sent == [("1", "1"), ("2", "2"), ("3", "3"), ("4", "40")]
    assert [(r["_step"], r["reward/mean"]) for r in history_rows(read_records(next(second_dir.glob("run-*.wandb"))))] \
        == [("5", "50")]
    assert [(line["step"], line["reward/mean"]) for line in _lines(tmp_path)] == [
        (1, 1.0), (2, 20.0), (3, 30.0), (4, 40.0), (5, 50.0)]
