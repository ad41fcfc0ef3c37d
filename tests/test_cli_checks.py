"""Every option is checked before anything is written, at the CLI (no search runs here): a refused option or
campaign leaves no directory behind to block the corrected command; the help says what branch --at-attempt does."""

from __future__ import annotations

from conftest import SOFTMAX, run_cli


def test_a_refused_option_or_campaign_leaves_nothing_behind(tmp_path):
    proc = run_cli("run", str(SOFTMAX), "--run-dir", str(tmp_path / "run"), "--cpu-slots", "0")
    assert proc.returncode == 2 and "--cpu-slots: 0: must be at least 1" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
    proc = run_cli("campaign", str(SOFTMAX), str(SOFTMAX), "--runs-dir", str(tmp_path / "campaign"), "--offline")
    assert proc.returncode == 2 and "task softmax is named twice" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []  # no campaign folder, no run directory, no hidden half-made one


def test_branch_help_says_the_cycle_goes_on():
    text = " ".join(run_cli("branch", "--help", check=True).stdout.split())
    assert "cycle goes on right after that attempt, improving on its code" in text and "ends there" not in text
