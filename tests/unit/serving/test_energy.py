"""Energy per request (blazar/serving/energy.py): the machine's counters read at a request's start and end, against a
fake sysfs tree (RAPL's intel-rapl:N/energy_uj, wrapping at max_energy_range_uj) and a fake NVML; the machine's joules
split evenly among the requests in flight; a machine without counters never read and said as not measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.adapters.energy import EnergyMeter, Nvml, Rapl
from blazar.events.requests import RequestEnergy
from blazar.serving.energy import NOT_MEASURED, EnergyLedger


class FakeNvml:
    """pynvml's energy counter (mJ since the driver loaded), one per GPU."""

    def __init__(self, count: int) -> None:
        self.count, self.mj, self.reads = count, 0, 0

    def nvmlInit(self) -> None:
        if self.count < 0:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self.reads += 1
        return self.mj


class Package:
    """One RAPL package zone in a fake /sys/class/powercap."""

    def __init__(self, root: Path, n: int, uj: int, max_range_uj: int = 10**9) -> None:
        self.dir = root / f"intel-rapl:{n}"
        self.dir.mkdir(parents=True)
        (self.dir / "name").write_text(f"package-{n}\n")
        (self.dir / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
        self.set(uj)

    def set(self, uj: int) -> None:
        (self.dir / "energy_uj").write_text(f"{uj}\n")


def rapl_ledger(root: Path) -> EnergyLedger:
    return EnergyLedger(EnergyMeter(rapl=Rapl(root), nvml=Nvml(FakeNvml(count=-1))))


def test_a_request_alone_is_charged_the_machines_joules_over_its_span(tmp_path: Path) -> None:
    pkg = Package(tmp_path, 0, 1_000_000)
    ledger = rapl_ledger(tmp_path)
    pkg.set(1_500_000)  # idle before the request: charged to nobody
    span = ledger.begin()
    pkg.set(4_500_000)  # 3 J while it ran
    got = span.end(completion_tokens=30)
    assert got == RequestEnergy(source="rapl", joules=3.0, machine_joules=3.0, tokens_per_joule=10.0, overlapped=1)


def test_a_wrapped_rapl_counter_is_undone(tmp_path: Path) -> None:
    pkg = Package(tmp_path, 0, 9_000_000, max_range_uj=10_000_000)
    ledger = rapl_ledger(tmp_path)
    span = ledger.begin()
    pkg.set(1_000_000)  # +1 J to the top, +1 J after the wrap
    assert span.end(completion_tokens=4).joules == pytest.approx(2.0)


def test_overlapping_requests_split_the_machines_joules_and_their_shares_add_up_to_it(tmp_path: Path) -> None:
    pkg = Package(tmp_path, 0, 0)
    ledger = rapl_ledger(tmp_path)
    a = ledger.begin()
    pkg.set(2_000_000)  # 2 J: a alone
    b = ledger.begin()
    pkg.set(6_000_000)  # 4 J: a and b, 2 J each
    got_b = b.end(completion_tokens=8)
    pkg.set(7_000_000)  # 1 J: a alone again
    got_a = a.end(completion_tokens=10)
    assert (got_a.joules, got_a.machine_joules, got_a.overlapped) == (5.0, 7.0, 2)
    assert (got_b.joules, got_b.machine_joules, got_b.overlapped) == (2.0, 4.0, 2)
    assert got_b.tokens_per_joule == 4.0 and got_a.tokens_per_joule == 2.0
    assert (got_a.joules or 0) + (got_b.joules or 0) == 7.0  # nothing counted twice, nothing lost


def test_a_request_that_started_and_ended_inside_another_counts_as_overlapping_it(tmp_path: Path) -> None:
    Package(tmp_path, 0, 0)
    ledger = rapl_ledger(tmp_path)
    a = ledger.begin()
    ledger.begin().end(completion_tokens=1)
    assert a.end(completion_tokens=1).overlapped == 2


def test_nvml_gpus_are_read_through_the_port_in_millijoules(tmp_path: Path) -> None:
    fake = FakeNvml(count=2)
    ledger = EnergyLedger(EnergyMeter(rapl=Rapl(tmp_path / "no-powercap"), nvml=Nvml(fake)))
    span = ledger.begin()
    fake.mj += 1500  # 1.5 J on each of two GPUs
    assert span.end(completion_tokens=30) == RequestEnergy(
        source="nvml", joules=3.0, machine_joules=3.0, tokens_per_joule=10.0, overlapped=1)


def test_rapl_and_nvml_together(tmp_path: Path) -> None:
    pkg = Package(tmp_path, 0, 0)
    fake = FakeNvml(count=1)
    ledger = EnergyLedger(EnergyMeter(rapl=Rapl(tmp_path), nvml=Nvml(fake)))
    span = ledger.begin()
    pkg.set(1_000_000)
    fake.mj += 1000
    got = span.end(completion_tokens=None)
    assert (got.source, got.joules, got.tokens_per_joule) == ("rapl+nvml", 2.0, 0.0)


def test_a_machine_without_counters_is_never_read_and_says_not_measured(tmp_path: Path) -> None:
    fake = FakeNvml(count=0)
    ledger = EnergyLedger(EnergyMeter(rapl=Rapl(tmp_path / "no-powercap"), nvml=Nvml(fake)))
    assert not ledger.measuring
    span = ledger.begin()
    assert span.mark is None and span.end(completion_tokens=5) == NOT_MEASURED
    assert fake.reads == 0
    assert EnergyLedger().begin().end(3).source == "not_measured"  # the default: no meter at all


def test_an_unreadable_energy_file_measures_nothing(tmp_path: Path) -> None:
    d = tmp_path / "intel-rapl:0"
    d.mkdir()
    (d / "max_energy_range_uj").write_text("100\n")  # energy_uj absent: as when the kernel makes it root-only
    assert not rapl_ledger(tmp_path).measuring


def test_a_counter_that_stops_reading_turns_measuring_off_for_good(tmp_path: Path) -> None:
    pkg = Package(tmp_path, 0, 0)
    ledger = rapl_ledger(tmp_path)
    span = ledger.begin()
    (pkg.dir / "energy_uj").unlink()
    assert span.end(completion_tokens=3) == NOT_MEASURED
    assert not ledger.measuring and ledger.begin().mark is None
    pkg.set(5)  # readable again: still off (no reads on the hot path once found unreadable)
    assert ledger.begin().mark is None
