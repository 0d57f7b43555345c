"""plan() on a CPU other processes keep busy times its candidates with one intra-op thread per
free core, says so, and gives torch its threads back (planner/contention.py). The load is faked:
a test of the choice, not of the machine."""
import pytest
import torch

from trainopt_core.planner import contention


@pytest.mark.parametrize("free, threads, planned", [(2.0, 2, 2), (1.6, 2, 2), (1.4, 2, 1), (0.0, 2, 1), (0.9, 4, 1),
                                                    (2.6, 4, 3), (8.0, 4, 4), (0.0, 1, 1)])
def test_one_thread_per_free_core_at_least_one(free, threads, planned):
    assert contention.threads_for(free, threads) == planned


def test_a_busy_cpu_plans_with_fewer_threads_and_gives_them_back(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr(contention.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(contention, "others_busy_cores", lambda: 2.0)
    notes = []
    with contention.threads_the_cpu_can_run(torch.device("cpu"), notes) as threads:
        assert threads == 1 and seen == [1]
    assert seen == [1, 2]
    assert notes == ["Timed with 1 intra-op thread instead of torch's 2: other processes kept 2.0 of this CPU's 2 "
                     "cores busy when planning began, and threads that wait for each other on a busy CPU time the "
                     "scheduler, not the candidates (planner/contention.py). The speedups are ratios at that thread "
                     "count."]
    # quiet, or not a CPU, or /proc/stat unreadable: nothing changes, nothing said
    for device, busy in ((torch.device("cpu"), 0.2), (torch.device("cpu"), None), (torch.device("meta"), 2.0)):
        monkeypatch.setattr(contention, "others_busy_cores", lambda busy=busy: busy)
        notes, seen[:] = [], []
        with contention.threads_the_cpu_can_run(device, notes) as threads:
            assert threads == 2
        assert notes == [] and seen == []
    assert before >= 1


def test_the_threads_come_back_when_planning_fails(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr(contention.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(contention, "others_busy_cores", lambda: 1.8)
    with pytest.raises(RuntimeError, match="a failing stage"):
        with contention.threads_the_cpu_can_run(torch.device("cpu"), []):
            raise RuntimeError("a failing stage")
    assert seen == [1, 2]


def test_the_other_processes_cpu_use_is_read_from_the_systems_cpu_times():
    busy = contention.others_busy_cores(0.5)  # long enough that the counters' 10 ms ticks do not add a core
    assert busy is None or 0.0 <= busy <= (len(contention.os.sched_getaffinity(0)) + 0.5)


def test_only_the_cpus_this_process_may_run_on_count_as_busy(monkeypatch):
    # a container given CPUs 0 and 1 of a four-CPU host: CPUs 2 and 3 busy with other containers' work
    from collections import namedtuple

    Times = namedtuple("Times", "user system idle")
    calls = []

    def cpu_times(percpu=False):
        assert percpu
        calls.append(None)
        second = len(calls) > 1
        return [Times(user=0.5 * second, system=0.0, idle=0.0), Times(user=0.0, system=0.0, idle=1.0 * second),
                Times(user=1.0 * second, system=0.0, idle=0.0), Times(user=1.0 * second, system=0.0, idle=0.0)]

    monkeypatch.setattr(contention.psutil, "cpu_times", cpu_times)
    monkeypatch.setattr(contention.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(contention.time, "sleep", lambda s: None)
    clock = iter([0.0, 1.0])
    monkeypatch.setattr(contention.time, "monotonic", lambda: next(clock))
    busy = contention.others_busy_cores(1.0)
    assert busy == pytest.approx(0.5, abs=0.05)  # CPU 0's half a core (less this process's own ~0), not 2.5
