"""A round's memory figure: the learner process's peak resident memory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from learner.round_metrics import peak_rss_mb

STATM = Path("/proc/self/statm")
SLACK_MB = 16


def _resident_mb() -> float:
    pages = int(STATM.read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not STATM.exists(), reason="reads /proc (Linux)")
def test_the_peak_covers_memory_the_process_touched_and_holds():
    block = bytearray(256 * 2**20)
    block[::4096] = b"\x01" * len(range(0, len(block), 4096))  # every page resident
    resident = _resident_mb()
    assert resident >= 256
    # the kernel folds each thread's page counts into the process's in batches: a little slack
    assert peak_rss_mb() >= resident - SLACK_MB
    del block
    assert peak_rss_mb() >= resident - SLACK_MB  # a high-water mark: freeing does not lower it


@pytest.mark.skipif(not STATM.exists(), reason="reads /proc (Linux)")
def test_a_process_started_by_a_large_one_reports_its_own_peak_not_its_parents():
    block = bytearray(512 * 2**20)
    block[::4096] = b"\x01" * len(range(0, len(block), 4096))
    assert _resident_mb() >= 512  # the parent is large when it starts the child
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from learner.round_metrics import peak_rss_mb; print(peak_rss_mb())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(child.stdout) < 256  # getrusage's ru_maxrss would carry the parent's 512+


def test_node_metrics_count_and_average_each_nodes_rewarded_calls():
    from learner.episodes import Episode
    from learner.rewards import EpisodeReward
    from learner.round_metrics import node_metrics
    from tests.learner.learner_events import trajectory

    t = trajectory(tool_turn=True)
    call, tool, answer = t.steps
    named = t.model_copy(
        update={
            "steps": [
                call.model_copy(update={"node": "think"}),
                tool,
                answer.model_copy(update={"node": "answer"}),
            ]
        }
    )
    unnamed = trajectory()
    episodes = [Episode(named), Episode(named), Episode(unnamed)]
    rewards = [
        EpisodeReward(1.0, {0: 1.0, 2: 1.0}),
        EpisodeReward(-1.0, {0: -1.0}),  # its answer turn not trained
        EpisodeReward(1.0, {0: 1.0}),
    ]
    assert node_metrics(episodes, rewards) == {
        "nodes/answer/calls": 1.0,
        "nodes/answer/reward": 1.0,
        "nodes/think/calls": 2.0,
        "nodes/think/reward": 0.0,
    }
