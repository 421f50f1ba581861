"""The probe's worker groups: a long module split into runs of PATCHER_PROBE_GROUP_SIZE checks."""

from patcher.probe import workers


def test_groups_are_cut_into_consecutive_runs_in_order():
    groups = [["a1", "a2", "a3", "a4", "a5"], ["iso"], ["b1", "b2"]]
    assert workers.split_groups(groups, 2) == [["a1", "a2"], ["a3", "a4"], ["a5"], ["iso"], ["b1", "b2"]]


def test_size_zero_keeps_a_module_in_one_worker():
    groups = [["a1", "a2", "a3"]]
    assert workers.split_groups(groups, 0) == groups


def test_group_size_comes_from_the_environment_and_a_bad_value_means_whole_modules(monkeypatch):
    monkeypatch.setenv(workers.GROUP_SIZE_ENV, "6")
    assert workers.group_size() == 6
    monkeypatch.setenv(workers.GROUP_SIZE_ENV, "many")
    assert workers.group_size() == 0
    monkeypatch.delenv(workers.GROUP_SIZE_ENV)
    assert workers.group_size() == 0
