"""Keeps tests/bench/torch_attach.py from rotting: runs it on a real local cluster (2 workers from
this test's runfiles) with a tiny MLP for 2 measured steps and checks that every variant's JSON
line has its fields with sane values. No timing bounds: the figures come from runs by hand.
"""

import json
import os
import statistics
import sys
import unittest

from cluster_support import run_with_cluster_flags, runfiles_workspace

VARIANTS = ["torch_ddp", "torch_zero", "zeroshard_ddp", "zeroshard_zero2"]
STEPS = 2
ROUNDS = 2
WORLD_SIZE = 2


def run_benchmark():
    """The benchmark's driver on tiny sizes: (exit status, its JSON lines, stderr)."""
    result = run_with_cluster_flags(
        [sys.executable, os.path.join(runfiles_workspace(), "tests", "bench", "torch_attach.py")],
        ["--layers", "16,32,8", "--batch", "4", "--rounds", str(ROUNDS), "--steps", str(STEPS),
         "--warmup", "1", "--memory_steps", "2", "--limit_steps", "2", "--sample_ms", "10"], timeout_s=240)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.returncode, lines, result.stderr


class TorchAttachBenchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.status, lines, cls.stderr = run_benchmark()
        cls.lines = {line["variant"]: line for line in lines}

    def test_exits_cleanly_with_one_line_per_variant(self):
        self.assertEqual(self.status, 0, self.stderr[-4000:])
        self.assertEqual(sorted(self.lines), sorted(VARIANTS), self.stderr[-4000:])

    def test_every_line_has_sane_headline_fields(self):
        for variant, line in self.lines.items():
            with self.subTest(variant=variant):
                self.assertEqual(line["bench"], "torch_attach")
                self.assertEqual(line["world_size"], WORLD_SIZE)
                self.assertEqual(line["rounds"], ROUNDS)
                self.assertEqual(line["steps"], STEPS)
                self.assertEqual(line["memory_steps"], 2)
                self.assertGreater(line["iter_ms"], 0)
                self.assertGreater(line["step_ms"], 0)
                self.assertLessEqual(line["step_ms"], line["iter_ms"])
                self.assertGreater(line["peak_rss_bytes"], 0)
                self.assertGreater(line["opt_state_bytes_per_rank"], 0)
                self.assertGreater(line["limit_ms"], 0)
                # Both are rounded to microseconds: their ratio to within 5%.
                self.assertAlmostEqual(line["over_limit"] * line["limit_ms"] / line["iter_ms"], 1.0,
                                       delta=0.05)
                self.assertEqual(len(line["limit_ms_rounds"]), ROUNDS)
                self.assertEqual(len(line["iter_ms_rounds"]), ROUNDS)
                for round_ms in line["iter_ms_rounds"]:
                    self.assertGreater(round_ms, 0)

    def test_memory_counts_the_daemon_for_zeroshard_only(self):
        for variant, line in self.lines.items():
            with self.subTest(variant=variant):
                processes = 2 if variant.startswith("zeroshard") else 1
                for ranks in line["peak_pss_parts_by_rank_rounds"]:
                    self.assertEqual(len(ranks), WORLD_SIZE)
                    for parts in ranks:
                        self.assertEqual(len(parts), processes)
                        self.assertTrue(all(part > 0 for part in parts), parts)
                by_rank = line["peak_pss_by_rank_rounds"]
                self.assertEqual(line["peak_rss_bytes_rounds"],
                                 [max(ranks) for ranks in by_rank])
                for ranks, parts in zip(by_rank, line["peak_pss_parts_by_rank_rounds"]):
                    self.assertEqual(ranks, [sum(p) for p in parts])

    def test_memory_comes_from_a_launch_of_each_variant_alone(self):
        for variant, line in self.lines.items():
            with self.subTest(variant=variant):
                alone = line["memory_launch"]
                self.assertEqual(len(alone["peak_pss_by_rank_rounds"]), 1)  # one round
                self.assertEqual(line["peak_rss_bytes"], max(alone["peak_pss_by_rank_rounds"][0]))
                self.assertEqual(line["peak_rss_bytes_in_run"],
                                 int(statistics.median(line["peak_rss_bytes_rounds"])))

    def test_optimizer_state_is_sharded(self):
        torch_ddp, torch_zero = self.lines["torch_ddp"], self.lines["torch_zero"]
        # ZeroRedundancyOptimizer splits whole tensors: its ranks hold the state between them.
        self.assertLess(torch_zero["opt_state_bytes_per_rank"],
                        torch_ddp["opt_state_bytes_per_rank"])
        self.assertEqual(sum(torch_zero["opt_state_bytes_by_rank"]),
                         torch_ddp["opt_state_bytes_per_rank"])
        ddp, zero2 = self.lines["zeroshard_ddp"], self.lines["zeroshard_zero2"]
        self.assertEqual(zero2["opt_state_bytes_per_rank"] * WORLD_SIZE,
                         ddp["opt_state_bytes_per_rank"])
        owned = zero2["owned_elems_by_rank"]
        self.assertEqual(len(owned), WORLD_SIZE)
        self.assertEqual(len(set(owned)), 1, owned)

    def test_zero2_phases_are_timed(self):
        phases = self.lines["zeroshard_zero2"]["rank0_phase_counts"]
        for phase in ("call_segment", "send_written", "call_step", "hand_over"):
            self.assertGreater(phases.get(phase, 0), 0, phases)


if __name__ == "__main__":
    unittest.main()
