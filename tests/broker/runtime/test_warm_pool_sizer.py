"""broker/runtime/warm_pool_sizer.py: how many warm sandboxes the rule asks for, on a fake clock
(the rule is ours; the clock is not a part we ship)."""

from __future__ import annotations

import pytest

from broker.runtime.warm_pool_sizer import MAX_WARM_UP_SECONDS, PoolSizer
from broker.settings import Settings, SettingsError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sizer(clock: Clock, *, floor: int = 1, cap: int = 10, idle: float = 60.0) -> PoolSizer:
    return PoolSizer(floor=floor, cap=cap, idle_seconds=idle, clock=clock)


def test_with_no_new_tenant_the_target_is_the_floor() -> None:
    clock = Clock()
    s = sizer(clock, floor=2)
    assert s.target() == 2 and s.seconds_to_change() is None and s.peak == 2


def test_a_burst_counts_whole_up_to_the_cap() -> None:
    clock = Clock()
    s = sizer(clock, cap=10)
    for _ in range(6):
        s.arrived()
        clock.now += 0.01
    assert s.target() == 6
    for _ in range(20):
        s.arrived()
    assert s.target() == 10 and s.peak == 10


def test_steady_arrivals_ask_for_rate_times_warm_up() -> None:
    """Two new tenants a second, a spare warming in 1.6 s: four arrive within one warm-up."""
    clock = Clock()
    s = sizer(clock)
    for seconds in (1.6,) * 20:
        s.warmed(seconds)
    for _ in range(40):
        s.arrived()
        clock.now += 0.5
    assert s.target() == 4  # 1.6 s spans four arrivals 0.5 s apart


def test_a_slower_warm_up_asks_for_more_spares() -> None:
    clock = Clock()
    fast, slow = sizer(clock), sizer(clock)
    for _ in range(20):
        fast.warmed(0.5)
        slow.warmed(4.5)
    for _ in range(20):
        fast.arrived()
        slow.arrived()
        clock.now += 1.0
    assert (fast.target(), slow.target()) == (1, 5)


def test_a_daemon_that_hangs_does_not_make_every_arrival_one_burst() -> None:
    clock = Clock()
    s = sizer(clock, cap=64, idle=3600)
    s.warmed(10_000.0)
    assert s.warm_up_seconds == MAX_WARM_UP_SECONDS
    for _ in range(60):
        s.arrived()
        clock.now += 60.0  # one a minute
    assert s.target() == 1


def test_after_the_idle_time_without_new_tenants_the_pool_is_back_at_its_floor() -> None:
    clock = Clock()
    s = sizer(clock, floor=1, cap=10, idle=60.0)
    for _ in range(8):
        s.arrived()
    clock.now += 30.0
    assert s.target() == 8
    assert s.seconds_to_change() == pytest.approx(30.0)
    clock.now += 30.0
    assert s.target() == 1 and s.seconds_to_change() is None
    assert s.peak == 8  # how far it grew stays reported


def test_the_floor_and_the_cap_are_checked() -> None:
    with pytest.raises(ValueError, match="floor"):
        sizer(Clock(), floor=3, cap=2)
    off = sizer(Clock(), floor=0, cap=0)
    off.arrived()
    assert off.target() == 0


BASE = {"DOCBROKER_AUTH_ISSUER": "https://idp.invalid", "DOCBROKER_AUTH_AUDIENCE": "a",
        "DOCBROKER_AUTH_JWKS_URL": "https://idp.invalid/jwks"}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "floor", "cap"),
    [({}, 1, 10), ({"DOCBROKER_DOCKER_POOL_MAX": "3"}, 1, 3),
     ({"DOCBROKER_DOCKER_POOL_SIZE": "12"}, 12, 12), ({"DOCBROKER_DOCKER_POOL_SIZE": "0"}, 0, 10)],
)  # fmt: skip
def test_the_cap_is_a_setting_never_below_the_floor(env: dict[str, str], floor: int, cap: int) -> None:
    docker = Settings.from_env(BASE | env).runtime.docker
    assert (docker.pool_size, docker.pool_max) == (floor, cap)


def test_a_bad_cap_is_one_line_naming_the_setting() -> None:
    with pytest.raises(SettingsError, match=r"^DOCBROKER_DOCKER_POOL_MAX must be between 0 and 64$"):
        Settings.from_env(BASE | {"DOCBROKER_DOCKER_POOL_MAX": "65"})
