#!/usr/bin/env python3
"""Checks e2e_vs_torch.py's bookkeeping (choosing the torch, slowest-rank medians, reading the
CLI's watch events, exposed communication, the target ratios) without torch or a cluster."""

import json
import os
import statistics
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_vs_torch as bench  # noqa: E402


class ChooseTorchTest(unittest.TestCase):
    def test_newest_version_wins_whatever_the_order(self):
        found = [("/usr/bin/python3", "1.13.0a0"), ("/venv/python", "2.15.0+cu132"),
                 ("/other/python", "2.4.1")]
        self.assertEqual(bench.choose_newest(found), found[1])
        self.assertEqual(bench.choose_newest(list(reversed(found))), found[1])

    def test_numbers_compare_as_numbers(self):
        self.assertGreater(bench.version_key("2.15.0"), bench.version_key("2.4.1"))
        self.assertGreater(bench.version_key("2.4"), bench.version_key("2.3.9"))

    def test_interpreters_without_torch_are_skipped(self):
        self.assertEqual(bench.choose_newest([("/a", None), ("/b", "1.13.0a0")]),
                         ("/b", "1.13.0a0"))
        self.assertIsNone(bench.choose_newest([("/a", None)]))

    def test_a_tie_keeps_the_first_candidate(self):
        self.assertEqual(bench.choose_newest([("/own", "2.5.0"), ("/venv", "2.5.0")])[0], "/own")

    def test_torch_before_2_is_the_fallback(self):
        self.assertTrue(bench.is_fallback("1.13.0a0"))
        self.assertFalse(bench.is_fallback("2.0.0"))


class TorchSummaryTest(unittest.TestCase):
    @staticmethod
    def rank(rank, iters, step_comm=0.0):
        """A rank's record whose iteration i takes iters[i] seconds, half of it compute."""
        def it(seconds, compute):
            return {"iter": seconds, "compute": compute, "step": 0.002 + step_comm,
                    "update": 0.002, "loss": 0.5}
        return {
            "rank": rank, "optimizer": "AdamW(fused=True)", "refused": [],
            "trained": [it(s, s / 2) for s in iters],
            "paired": [it(s, s / 2) for s in iters],
            "no_comm": [it(s, s / 4) for s in iters],
            "peak_rss_bytes": 1000 + rank,
        }

    def test_medians_are_of_the_slowest_rank_per_iteration(self):
        fast = [0.010, 0.030, 0.010, 0.030, 0.010]
        slow = [0.030, 0.010, 0.030, 0.010, 0.030]
        record = bench.summarize_torch("seed", "torch_ddp", 2,
                                       [[self.rank(0, fast), self.rank(1, slow)]], "2.15.0", 1)
        # Each rank's own median is 10 or 30 ms; every iteration's slowest rank took 30 ms.
        self.assertAlmostEqual(record["iter_ms"], 30.0)
        self.assertAlmostEqual(record["iter_ms_rank0"], statistics.median(fast) * 1e3)
        self.assertEqual(record["peak_rss_bytes"], 1001)
        self.assertEqual(record["peak_rss_bytes_per_rank"], [1000, 1001])

    def test_rounds_are_pooled(self):
        first = [[self.rank(0, [0.010] * 3), self.rank(1, [0.012] * 3)]]
        second = [[self.rank(1, [0.040] * 4), self.rank(0, [0.050] * 4)]]
        record = bench.summarize_torch("seed", "torch_ddp", 2, first + second, "2.15.0", 1)
        # 3 iterations of 12 ms and 4 of 50 ms (the slowest rank of each round).
        self.assertAlmostEqual(record["iter_ms"], 50.0)
        self.assertEqual((record["steps"], record["rounds"]), (7, 2))
        self.assertEqual(record["peak_rss_bytes_per_rank"], [1000, 1001])

    def test_zero_counts_its_broadcasts_as_exposed_and_ddp_does_not(self):
        iters = [0.020] * 5
        ddp = bench.summarize_torch("m", "torch_ddp", 1, [[self.rank(0, iters)]], "2", 1)
        zero = bench.summarize_torch("m", "torch_zero", 1, [[self.rank(0, iters, 0.004)]], "2", 1)
        backward_comm_ms = (0.010 - 0.005) * 1e3
        self.assertAlmostEqual(ddp["exposed_comm_ms"], backward_comm_ms)
        self.assertAlmostEqual(zero["exposed_comm_ms"], backward_comm_ms + 4.0)
        self.assertAlmostEqual(zero["step_comm_ms"], 4.0)

    def test_the_limit_is_the_slowest_ranks_iteration_without_communication(self):
        ranks = [self.rank(0, [0.020] * 4), self.rank(1, [0.020] * 4)]
        ranks[0]["no_comm"] = [{"iter": s, "compute": s / 2, "step": 0.002, "update": 0.002,
                                "loss": 0.5} for s in (0.010, 0.016, 0.010, 0.016)]
        ranks[1]["no_comm"] = [{"iter": s, "compute": s / 2, "step": 0.002, "update": 0.002,
                                "loss": 0.5} for s in (0.014, 0.012, 0.014, 0.012)]
        record = bench.summarize_torch("m", "torch_zero", 2, [ranks], "2", 1)
        # Slowest rank per iteration: 14, 16, 14, 16 ms.
        self.assertAlmostEqual(record["limit_ms"], 15.0)
        self.assertAlmostEqual(record["over_limit"], round(20.0 / 15.0, 3))


class WatchEventsTest(unittest.TestCase):
    def test_event_times_keep_their_fraction(self):
        whole = bench.parse_event_time("2026-11-30T12:28:01Z")
        # A float of seconds since the epoch keeps about a tenth of a microsecond.
        self.assertAlmostEqual(bench.parse_event_time("2026-11-30T12:28:01.123456789Z") - whole,
                               0.123456789, delta=1e-6)
        self.assertAlmostEqual(bench.parse_event_time("2026-11-30T12:28:01.5Z") - whole, 0.5)
        self.assertIsNone(bench.parse_event_time(None))

    def test_a_new_generation_discards_earlier_progress(self):
        events = [
            {"type": "GENERATION_STARTED", "generation": "1"},
            {"type": "PROGRESS", "time": "2026-11-30T12:00:00Z", "progress": {"step": "1"}},
            {"type": "PROGRESS", "time": "2026-11-30T12:00:01Z", "progress": {"step": "2"}},
            {"type": "GENERATION_STARTED", "generation": "2"},
            {"type": "PROGRESS", "time": "2026-11-30T12:00:05Z",
             "progress": {"step": "1", "iteration_ms": 3}},
            {"type": "STATE_CHANGED", "state": "SUCCEEDED", "message": "done"},
        ]
        lines = [json.dumps(e) for e in events] + ["", "not json"]
        progress, times, state, message = bench.parse_watch_output(lines)
        self.assertEqual(sorted(progress), [1])
        self.assertEqual(times[1], bench.parse_event_time("2026-11-30T12:00:05Z"))
        self.assertEqual((state, message), ("SUCCEEDED", "done"))


class ZeroShardSummaryTest(unittest.TestCase):
    def test_exposed_is_everything_in_step_but_the_update(self):
        metrics = {"step_ms": 10.0, "update_ms": 3.0, "exposed_comm_ms": 2.0}
        self.assertAlmostEqual(bench.zeroshard_exposed_comm_ms(metrics), 7.0)

    def test_waits_in_backward_count_when_they_exceed_the_step(self):
        # zero2 waited 6 ms for a free bucket buffer during backward, then gathered for 4 ms.
        metrics = {"step_ms": 9.0, "update_ms": 3.0, "exposed_comm_ms": 6.0, "allgather_ms": 4.0}
        self.assertAlmostEqual(bench.zeroshard_exposed_comm_ms(metrics), 10.0)

    def test_an_all_gather_outside_step_is_not_counted(self):
        metrics = {"step_ms": 4.0, "update_ms": 3.0, "exposed_comm_ms": 0.0, "allgather_ms": 30.0}
        self.assertAlmostEqual(bench.zeroshard_exposed_comm_ms(metrics), 1.0)

    def test_medians_leave_out_the_warm_up_and_the_last_report(self):
        warmup, steps = 2, 5
        progress, times = {}, {}
        for step in range(1, warmup + steps + 1):
            measured = step > warmup
            progress[step] = {"step": str(step), "iteration_ms": 10.0 + step if measured else 900.0,
                              "step_ms": 4.0, "update_ms": 1.0, "loss": 0.25}
            # (10 + step) ms since the previous report, but the last one comes 5 s later (the
            # final checkpoint is written first).
            times[step] = (times.get(step - 1, 100.0) + (10.0 + step) / 1e3 +
                           (5.0 if step == warmup + steps else 0.0))
        measured, intervals = bench.measured_steps(progress, times, steps, warmup)
        run = {"measured": measured, "intervals": intervals, "peaks": [7, 9]}
        record = bench.summarize_zeroshard("seed", "zero2", 4, [run], warmup, "2.15.0")
        self.assertAlmostEqual(record["iter_ms"],
                               statistics.median(10.0 + s for s in range(3, 8)))
        # The intervals ending at the measured steps 3 to 6 (13 to 16 ms), not the last one.
        self.assertAlmostEqual(record["wall_per_iter_ms"], 14.5)
        self.assertAlmostEqual(record["exposed_comm_ms"], 3.0)
        self.assertEqual(record["peak_rss_bytes"], 9)
        self.assertEqual(record["variant"], "zeroshard_zero2")

    def test_runs_are_pooled_and_peaks_are_per_rank_maxima(self):
        def run(iteration_ms, peaks):
            return {"measured": [{"iteration_ms": iteration_ms, "loss": 0.5}] * 3,
                    "intervals": [iteration_ms / 1e3] * 2, "peaks": peaks}

        record = bench.summarize_zeroshard("medium", "ddp", 2, [run(5.0, [3, 8]), run(9.0, [6, 4]),
                                                                run(9.0, [1, 1])], 1, "2")
        self.assertAlmostEqual(record["iter_ms"], 9.0)
        self.assertAlmostEqual(record["wall_per_iter_ms"], 9.0)
        self.assertEqual(record["peak_rss_bytes_per_rank"], [6, 8])
        self.assertEqual((record["steps"], record["rounds"]), (9, 3))

    def test_the_limit_is_the_jobs_alone_plus_the_runs_own_update(self):
        def run(update_ms, no_comm):
            return {"measured": [{"iteration_ms": 30.0, "update_ms": update_ms, "loss": 0.5}] * 3,
                    "intervals": [0.03] * 2, "peaks": [1, 1], "no_comm_compute_ms": no_comm}

        # Two one-worker jobs per run; each step's slower one counts: 20, 22, 21 and 19, 24, 18.
        runs = [run(4.0, [[20.0, 22.0, 18.0], [19.0, 21.0, 21.0]]),
                run(6.0, [[19.0, 24.0, 15.0], [17.0, 20.0, 18.0]])]
        record = bench.summarize_zeroshard("medium", "zero2", 2, runs, 1, "2")
        self.assertAlmostEqual(record["compute_no_comm_ms"], 20.5)
        self.assertAlmostEqual(record["limit_ms"], 20.5 + 5.0)
        self.assertAlmostEqual(record["over_limit"], round(30.0 / 25.5, 3))

    def test_every_modes_limit_is_measured_by_ddp_jobs_that_copy_no_gradient(self):
        # A one-worker zero1/zero2 job copies its buckets into the owned shard: not compute.
        self.assertEqual(bench.NO_COMM_MODE, "ddp")

    def test_no_limit_without_the_jobs_alone(self):
        run = {"measured": [{"iteration_ms": 30.0, "update_ms": 4.0}], "intervals": [],
               "peaks": [1]}
        record = bench.summarize_zeroshard("medium", "zero2", 1, [run], 1, "2")
        self.assertIsNone(record["limit_ms"])
        self.assertIsNone(record["over_limit"])


class RoundPlanTest(unittest.TestCase):
    def test_odd_rounds_run_backwards(self):
        plan = bench.round_plan(bench.DEFAULT_VARIANTS, 3)
        forwards = [("torch", "torch_ddp"), ("torch", "torch_zero"),
                    ("zeroshard", ["ddp", "zero1", "zero2"])]
        backwards = [("zeroshard", ["zero2", "zero1", "ddp"]), ("torch", "torch_zero"),
                     ("torch", "torch_ddp")]
        self.assertEqual(plan, [forwards, backwards, forwards])

    # Issue 38. Fails before the fix: there was no zeroshard_zero3 variant nor deep job.
    def test_zero3_only_when_asked_for(self):
        self.assertNotIn("zeroshard_zero3", bench.DEFAULT_VARIANTS)
        self.assertEqual(bench.parse_args([]).variants, bench.DEFAULT_VARIANTS)
        args = bench.parse_args(["--jobs=deep", "--variants=zeroshard_zero2,zeroshard_zero3"])
        self.assertEqual(args.jobs, ["deep"])
        self.assertEqual(bench.round_plan(args.variants, 2),
                         [[("zeroshard", ["zero2", "zero3"])], [("zeroshard", ["zero3", "zero2"])]])
        self.assertEqual(bench.JOBS["deep"]["layers"], [1024] + [2048] * 17 + [1024])

    def test_only_the_chosen_variants(self):
        self.assertEqual(bench.round_plan(["zeroshard_zero2", "torch_zero"], 1),
                         [[("torch", "torch_zero"), ("zeroshard", ["zero2"])]])


class TargetsTest(unittest.TestCase):
    def test_ratios_against_their_references(self):
        def record(job, variant, iter_ms):
            return {"job": job, "variant": variant, "world_size": 2, "iter_ms": iter_ms}

        records = [record("medium", "zeroshard_zero2", 60.0), record("medium", "torch_zero", 100.0),
                   record("medium", "zeroshard_ddp", 90.0), record("medium", "torch_ddp", 100.0)]
        (line,) = bench.target_lines(records)
        ratios = {(t["variant"], t["reference"]): (t["ratio"], t["met"]) for t in line["targets"]}
        self.assertEqual(ratios[("zeroshard_zero2", "torch_zero")], (0.6, True))
        self.assertEqual(ratios[("zeroshard_ddp", "torch_ddp")], (0.9, False))
        self.assertEqual(ratios[("zeroshard_zero2", "zeroshard_ddp")], (round(60 / 90, 3), True))
        self.assertEqual(len(ratios), 3)  # seed's target has no records here; nor the limit

    # Issue 38: zero3 / zero2 on deep at most 1.20. Fails before the fix: no such target.
    def test_zero3_against_zero2_on_deep(self):
        records = [{"job": "deep", "variant": "zeroshard_zero2", "world_size": 2, "iter_ms": 100.0},
                   {"job": "deep", "variant": "zeroshard_zero3", "world_size": 2, "iter_ms": 118.0}]
        (line,) = bench.target_lines(records)
        self.assertEqual(line["targets"], [{"variant": "zeroshard_zero3",
                                            "reference": "zeroshard_zero2", "ratio": 1.18,
                                            "limit": 1.20, "met": True}])

    def test_over_limit_is_a_target(self):
        records = [{"job": "medium", "variant": "zeroshard_zero2", "world_size": 2,
                    "iter_ms": 57.0, "limit_ms": 50.0}]
        (line,) = bench.target_lines(records)
        self.assertEqual(line["targets"], [{"variant": "zeroshard_zero2", "reference": "limit",
                                            "ratio": 1.14, "limit": 1.15, "met": True}])


if __name__ == "__main__":
    unittest.main()
