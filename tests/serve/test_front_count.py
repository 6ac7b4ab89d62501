"""What `--front-processes auto` picks, and how the flag reads its value."""

from __future__ import annotations

import argparse

import pytest

from kernel.serve.flags import parse_front_processes
from kernel.serve.fronts import count


@pytest.mark.parametrize("cpus, fronts", [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2), (8, 2), (16, 5),
                                          (64, 21), (128, 32), (2.5, 1)])
def test_auto_picks_a_third_of_the_cpus_and_one_below_six(cpus, fronts):
    assert count.auto_count(cpus) == fronts


def test_a_cgroup_quota_caps_the_cpus(tmp_path):
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    assert count.cgroup_quota(tmp_path) == 4.0
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert count.cgroup_quota(tmp_path) is None


def test_a_cgroup_v1_quota_is_read_too(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("250000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert count.cgroup_quota(tmp_path) == 2.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert count.cgroup_quota(tmp_path) is None


def test_usable_cpus_is_at_most_the_affinity_mask():
    import os

    assert 1 <= count.usable_cpus() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("AUTO", "auto"), ("1", 1), ("3", 3), ("254", 254)])
def test_the_flag_takes_auto_or_a_count(text, value):
    assert parse_front_processes(text) == value


@pytest.mark.parametrize("text", ["0", "-2", "255", "many", ""])
def test_the_flag_refuses_other_values(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_front_processes(text)
