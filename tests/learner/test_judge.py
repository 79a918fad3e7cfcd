"""The reward model's verdicts beside a checkpoint, as the gate's disagreement guard reads them."""

from learner.gate.guards import GuardConfig, reward_disagreement
from learner.judge import read_source_scores, write_source_scores


def test_no_file_means_no_scores(tmp_path):
    assert read_source_scores(tmp_path) == {}


def test_a_reward_model_that_misjudges_verified_runs_fails_the_guard(tmp_path):
    verdicts = [(1.0, 1.0), (-1.0, -1.0)] * 3 + [(1.0, -1.0)] * 4  # wrong on 4 of 10
    write_source_scores(tmp_path, verdicts)
    scores = read_source_scores(tmp_path)
    assert len(scores) == 10 and scores["replay/0"] == {"verifier": 1.0, "reward_model": 1.0}
    result = reward_disagreement(scores, GuardConfig())
    assert not result.passed and result.figure == 0.4
    assert "reward_model vs verifier on 10 runs" in result.detail


def test_a_reward_model_that_agrees_with_the_verifier_passes(tmp_path):
    write_source_scores(tmp_path, [(1.0, 1.0), (-1.0, -1.0)] * 5)
    assert reward_disagreement(read_source_scores(tmp_path), GuardConfig()).passed
