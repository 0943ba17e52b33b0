"""bench speed's bookkeeping (no torch, no GPU): the interleaved run order, the deadline's estimate and
the table's figures."""
from __future__ import annotations

import pytest

speed_suite = pytest.importorskip("bench.speed_suite")

GIB = 1 << 30


def run(allocator: str, timed_s: float, gmlake: bool = False) -> dict:
    """A finished run as dynamic.py reports it, at 2 GiB allocated of 4 GiB reserved."""
    out = {"workload": "bert", "allocator": allocator, "timed_s": timed_s, "samples_per_s": 100.0 / timed_s,
           "tokens_per_s": 1e4 / timed_s, "schedule_sha256": "s", "max_memory_reserved": 4 * GIB,
           "max_memory_allocated": 2 * GIB, "utilization": 0.5}
    if gmlake:
        out["gmlake_after_warmup"] = {"stitches": 3, "driver_calls": 40}
    return out


def test_rows_relate_each_allocator_to_natives_median():
    runs = [run("native", 10.0), run("native", 12.0), run("gmlake", 11.0, gmlake=True), run("gmlake", 13.2, True),
            {"workload": "bert", "allocator": "expandable", "error": "killed"}]
    rows = {r["allocator"]: r for r in speed_suite.table_rows(runs, ["bert"], ["native", "expandable", "gmlake"])}
    assert rows["native"]["vs_native"] == pytest.approx(1.0)
    assert rows["native"]["spread_pct"] == pytest.approx(100 * 2 / 11)
    assert rows["gmlake"]["vs_native"] == pytest.approx(12.1 / 11)
    assert (rows["gmlake"]["vs_native_min"], rows["gmlake"]["vs_native_max"]) == pytest.approx((1.0, 1.2))
    assert rows["gmlake"]["stitches_after_warmup"] == 3 and rows["gmlake"]["peak_reserved_gib"] == 4.0
    assert rows["expandable"] == {"workload": "bert", "allocator": "expandable", "runs": 0, "failed": 1}
    table = speed_suite.format_table(list(rows.values()), 15, 60)
    assert "1.100x" in table and "failed 1 time(s)" in table and "bert 18.2% over 2 runs" in table


def test_gpu_time_is_compared_with_natives_kernels_not_its_wall_time():
    """Note [GPU time]: the kernels' own time of the profiled extra steps, summed per run, against native's median;
    a run whose profiler failed has none."""
    def with_gpu(allocator: str, timed_s: float, kernel_ms: list[float]) -> dict:
        out = run(allocator, timed_s)
        out["gpu_time"] = [{"total_ms": ms, "copy": ms / 10, "gemm": ms / 2, "other": 0.4 * ms, "kernels": 9}
                           for ms in kernel_ms]
        return out

    runs = [with_gpu("native", 10.0, [100.0, 100.0]), with_gpu("native", 14.0, [101.0, 101.0]),
            with_gpu("gmlake", 10.5, [103.0, 104.0]), with_gpu("gmlake", 13.0, [104.0, 104.0]),
            run("expandable", 12.0) | {"gpu_time": [{"error": "RuntimeError: no CUPTI"}]},
            run("gmlake-paper", 12.0) | {"gpu_time": [{"total_ms": 0.0, "kernels": 0}]}]
    rows = {r["allocator"]: r for r in speed_suite.table_rows(runs, ["bert"],
                                                              ["native", "expandable", "gmlake", "gmlake-paper"])}
    assert speed_suite.gpu_ms(runs[0]) == 200.0 and speed_suite.gpu_ms(runs[-1]) is None and speed_suite.gpu_ms(runs[0], "copy") == pytest.approx(20.0)
    assert rows["gmlake"]["gpu_vs_native"] == pytest.approx(207.5 / 201.0)
    assert rows["gmlake"]["gpu_spread_pct"] == pytest.approx(100 * 1 / 207.5)
    assert "gpu_vs_native" not in rows["expandable"] and "gpu_vs_native" not in rows["gmlake-paper"]
    table = speed_suite.format_table(list(rows.values()), 15, 60)
    assert "1.032x" in table
