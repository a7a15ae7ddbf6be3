"""Every test has exactly one tier (pyproject.toml's markers): unit, service, integration or faults.

A module sets its tier with `pytestmark = pytest.mark.<tier>`; a test that belongs to another tier
carries its own marker, which overrides the module's (the closest one wins). After collection each
test holds its one tier itself, so `-m` expressions see exactly that tier; a test without one, or a
node with two, stops the run before anything runs.
"""

import pytest

TIERS = ("unit", "service", "integration", "faults")


def assign_tiers(items):
    """Give every item its closest tier marker; pytest.UsageError listing the tests that have none."""
    tiers, problems = {}, []
    for item in items:
        try:
            tiers[item] = closest_tier(item)
        except ValueError as problem:
            problems.append(f"{item.nodeid}: {problem}")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise pytest.UsageError("every test needs exactly one tier marker (" + ", ".join(TIERS) + "), set by "
                                "`pytestmark = pytest.mark.<tier>` or on the test:\n  " + "\n  ".join(shown))
    for item, tier in tiers.items():
        for node in item.listchain()[:-1]:
            node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
        if not any(m.name == tier for m in item.own_markers):
            item.add_marker(tier)


def closest_tier(item):
    """The tier marker nearest to the test (its own, then its class's, then its module's)."""
    for node in reversed(item.listchain()):
        names = {m.name for m in node.own_markers if m.name in TIERS}
        if len(names) > 1:
            raise ValueError(f"several tiers on {node.name}: {sorted(names)}")
        if names:
            return names.pop()
    raise ValueError("no tier marker")
