#!/usr/bin/env python3
"""Checks reduce_scatter_study.py's bookkeeping (variants from the command line, the per-bucket
and per-round medians, the comparison with the reference round by round) without a cluster."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reduce_scatter_study as study  # noqa: E402


def step(iteration_ms, buckets=(), in_backward=(), process_cpu_ms=100.0):
    return {"iteration_ms": iteration_ms, "compute_ms": iteration_ms - 20, "step_ms": 20,
            "exposed_comm_ms": sum(buckets), "bucket_exposed_ms": list(buckets),
            "bucket_exposed_in_backward_ms": list(in_backward), "process_cpu_ms": process_cpu_ms,
            "memory": {"bucket_bytes": "33554432"}}


def run(steps, peaks=(1000, 2000), load=1.0):
    return {"measured": steps, "peaks": list(peaks), "load_average": load}


class Args:
    job = "medium"
    mode = "zero2"


class ParseVariantTest(unittest.TestCase):
    def test_catalogue_names_give_their_flags_and_bucket_size(self):
        self.assertEqual(study.parse_variant("pool_3"), ("pool_3", ["--bucket_pool_size=3"], None))
        self.assertEqual(study.parse_variant("bucket_2m"), ("bucket_2m", [], 1 << 21))

    def test_combinations_name_their_flags_and_bucket_size(self):
        self.assertEqual(study.parse_variant("mix=--bucket_pool_size=4+--gloo_lanes=1@2097152"),
                         ("mix", ["--bucket_pool_size=4", "--gloo_lanes=1"], 2097152))
        self.assertEqual(study.parse_variant("flags=--gloo_lanes=1"),
                         ("flags", ["--gloo_lanes=1"], None))

    def test_unknown_names_are_refused(self):
        with self.assertRaises(ValueError):
            study.parse_variant("pool_33")


class SummarizeTest(unittest.TestCase):
    def test_medians_per_bucket_and_backward_share(self):
        runs = [run([step(150, (1, 5, 0), (1, 0, 0)), step(160, (3, 7, 0), (3, 2, 0))]),
                run([step(170, (2, 6, 2), (2, 1, 0))])]
        line = study.summarize(Args(), "v", [], None, runs, runs)
        self.assertEqual(line["iter_ms"], 160)
        self.assertEqual(line["bucket_exposed_ms"], [2, 6, 0])
        self.assertEqual(line["bucket_exposed_in_backward_ms"], [2, 1, 0])
        # Per step: 1, 5, 3, then the median.
        self.assertEqual(line["exposed_in_backward_ms"], 3)
        self.assertEqual(line["peak_rss_bytes"], 2000)
        self.assertEqual(line["iter_ms_per_round"], [155, 170])
        self.assertEqual(line["iter_ms_best_round"], 155)
        self.assertEqual(line["steps"], 3)
        self.assertEqual(line["bucket_bytes"], 33554432)

    def test_comparison_pairs_each_round_with_the_references_same_round(self):
        # A loaded second round slows both; the ratio of each round is what counts.
        reference = [run([step(100)]), run([step(300)]), run([step(110)])]
        variant = [run([step(90)]), run([step(280)]), run([step(99)])]
        line = study.summarize(Args(), "v", [], None, variant, reference)
        self.assertAlmostEqual(line["iter_vs_reference"], 0.9, places=3)
        self.assertEqual(line["iter_ms_best_round"], 90)

    def test_cpu_per_core_scales_the_rank_by_the_world_over_the_cpus(self):
        line = study.summarize(Args(), "v", [], None, [run([step(150, process_cpu_ms=120)])],
                               [run([step(150)])])
        cpus = len(os.sched_getaffinity(0))
        self.assertAlmostEqual(line["cpu_per_core_ms"], 120 * 2 / cpus, places=3)


if __name__ == "__main__":
    unittest.main()
