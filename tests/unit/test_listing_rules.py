"""The region anomaly rule (a listing too unlike the last clean one is not believed)."""

import pytest

from orphan_cleanup.core.listing_rules import region_anomaly


@pytest.mark.parametrize(("listed", "clean", "suspect", "anomalous"), [
    (0, None, None, False),     # no baseline yet
    (0, 19, None, False),       # the baseline is too small to judge
    (0, 20, None, True),        # an empty answer against 20
    (1, 20, None, True),        # lost 95%
    (2, 20, None, False),       # lost exactly 90%: accepted
    (100, 1000, None, False),
    (99, 1000, None, True),
    (0, 500, 0, False),         # agrees with the suspect listing: believed now
    (60, 1000, 55, False),      # agrees within a tenth
    (40, 1000, 60, True),       # the suspect listing disagrees: still not believed
    (1200, 1000, None, False),  # growth is never an anomaly
])
def test_region_anomaly(listed, clean, suspect, anomalous):
    why = region_anomaly(listed, clean, suspect, max_shrink=0.9, min_groups=20)
    assert (why is not None) == anomalous
    if anomalous:
        assert why.startswith(f"anomaly: listed {listed} groups, the last clean listing had {clean}")
