"""The order in which pytest-xdist hands out the suite (tests/xdist_order.py): the same tests, the heavy files whole,
split between the workers' first batches with balanced costs."""

from pathlib import Path

import xdist_order
from xdist_order import HEAVY, plan

NAMES = (["a.py"] * 3 + ["light1.py"] * 40 + ["b.py"] * 2 + ["light2.py"] * 30 + ["c.py"] * 4 + ["d.py"] * 5
         + ["light3.py"] * 50)
COSTS = {"a.py": 10.0, "b.py": 9.0, "c.py": 5.0, "d.py": 4.0}


def _batches(order, workers):
    batch = len(NAMES) // workers // 4
    return [[NAMES[i] for i in order[j * batch:(j + 1) * batch]] for j in range(workers)]


def test_the_same_tests_each_heavy_file_in_one_piece():
    order = plan(NAMES, 2, COSTS)
    assert sorted(order) == list(range(len(NAMES)))
    for name in COSTS:
        where = [k for k, i in enumerate(order) if NAMES[i] == name]
        assert where == list(range(where[0], where[0] + len(where))), name
        assert [order[k] for k in where] == sorted(order[k] for k in where), name  # their own order kept
    light = [i for i in order if NAMES[i] not in COSTS]
    assert light == sorted(light)  # the other tests keep theirs


def test_each_workers_first_batch_opens_with_its_share_of_the_heavy_files():
    """Longest first, each to the least loaded worker: 10 + 4 and 9 + 5."""
    first, second = _batches(plan(NAMES, 2, COSTS), 2)
    assert first[:7] == ["a.py"] * 3 + ["d.py"] * 4 and first[7] == "d.py"
    assert second[:6] == ["b.py"] * 2 + ["c.py"] * 4
    assert set(first[8:]) == set(second[6:]) == {"light1.py"}  # filled with the light tests, in order
    for j, heavy in enumerate(_batches(plan(NAMES, 3, COSTS), 3)):
        assert {n for n in heavy if n in COSTS} == [{"a.py"}, {"b.py"}, {"c.py", "d.py"}][j]


def test_without_workers_the_order_is_pytests(monkeypatch):
    class Item:
        def __init__(self, name):
            self.path = Path("tests") / name

    items = [Item(n) for n in ["test_lm.py", "test_types.py", "test_translation.py"]]
    before = list(items)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    xdist_order.pytest_collection_modifyitems(None, items)
    assert items == before
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setattr(xdist_order, "HEAVY", {"test_translation.py": 2.0, "test_lm.py": 1.0})
    xdist_order.pytest_collection_modifyitems(None, items)
    # two workers: first batches of two tests, the heaviest file opening the first, the next one the second
    assert [i.path.name for i in items] == ["test_translation.py", "test_types.py", "test_lm.py"]


def test_the_heavy_files_exist():
    here = Path(__file__).parent
    assert [n for n in HEAVY if not (here / n).is_file()] == []


def test_a_heavy_file_goes_where_its_tests_fit_and_one_too_big_keeps_its_place():
    """First batches of 16 tests: e (12 tests) fills one, so f (6) goes to the other although it is the least loaded;
    g (20 tests) fits in none and keeps its place among the light tests."""
    names = ["light.py"] * 90 + ["e.py"] * 12 + ["f.py"] * 6 + ["g.py"] * 20
    order = plan(names, 2, {"g.py": 30.0, "e.py": 20.0, "f.py": 1.0, "h.py": 5.0})
    assert sorted(order) == list(range(len(names)))
    first, second = ([names[i] for i in order[j * 16:(j + 1) * 16]] for j in range(2))
    assert first[:12] == ["e.py"] * 12 and second[:6] == ["f.py"] * 6
    assert [names[i] for i in order[32:]] == ["light.py"] * (90 - 4 - 10) + ["g.py"] * 20
