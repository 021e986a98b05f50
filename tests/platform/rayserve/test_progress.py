"""RegistryProgress: the throttled progress a drafter job writes."""

from specserve.platform.rayserve.progress import RegistryProgress


def test_known_total_fills_half_and_writes_are_throttled():
    written = []
    bar = RegistryProgress(written.append, total=4, interval_s=3600)
    bar.update()  # the first write goes through
    bar.update(2)  # within the interval: not written
    assert written == [0.125]
    assert bar.progress == 0.375
    bar.interval_s = 0.0
    bar.update(5)  # past the total: capped at half
    assert written == [0.125, 0.5]


def test_open_ended_training_holds_at_three_quarters():
    written = []
    bar = RegistryProgress(written.append, total=None, interval_s=0.0)
    bar.update()
    bar.set_postfix_str("loss 1.0")
    bar.close()
    assert written == [0.75]
