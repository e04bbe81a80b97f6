"""Keeps tests/bench/torch_attach.py from rotting: runs it on a real local cluster (2 workers from
this test's runfiles) with a tiny MLP for 2 measured steps and checks that every variant's JSON
line has its fields with sane values; then a tiny --model gpt in zero3 (and FSDP2 beside it, with
the compare line, where this interpreter's torch has FSDP2; else its refusal). No timing bounds:
the figures come from runs by hand.
"""

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import unittest

from cluster_support import run_with_cluster_flags, runfiles_workspace

VARIANTS = ["torch_ddp", "torch_zero", "zeroshard_ddp", "zeroshard_zero2"]
STEPS = 2
ROUNDS = 2
WORLD_SIZE = 2


GPT_FLAGS = ["--model", "gpt", "--blocks", "2", "--d_model", "32", "--heads", "2", "--vocab",
             "64", "--seq", "8", "--batch", "2", "--rounds", "1", "--steps", str(STEPS),
             "--warmup", "1", "--memory_steps", "2", "--limit_steps", "2", "--sample_ms", "10",
             "--memory_launches", "0"]


def script_path():
    return os.path.join(runfiles_workspace(), "tests", "bench", "torch_attach.py")


def run_benchmark(arguments=None):
    """The benchmark's driver on tiny sizes: (exit status, its JSON lines, stderr)."""
    if arguments is None:
        arguments = ["--layers", "16,32,8", "--batch", "4", "--rounds", str(ROUNDS), "--steps",
                     str(STEPS), "--warmup", "1", "--memory_steps", "2", "--limit_steps", "2",
                     "--sample_ms", "10"]
    result = run_with_cluster_flags([sys.executable, script_path()], arguments, timeout_s=240)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.returncode, lines, result.stderr


def load_script():
    """tests/bench/torch_attach.py as a module (its functions; nothing runs on import)."""
    spec = importlib.util.spec_from_file_location("torch_attach", script_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def has_fsdp2():
    """Whether this interpreter's torch has FSDP2 (Debian's 1.13 has not)."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys, importlib.util; "
         f"spec = importlib.util.spec_from_file_location('ta', {script_path()!r}); "
         "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
         "sys.exit(0 if m.fully_shard_function() else 3)"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, timeout=120)
    if result.returncode not in (0, 3):
        raise RuntimeError(result.stderr[-2000:])
    return result.returncode == 0


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


class TorchAttachGptTest(unittest.TestCase):
    """--model gpt: zero3 on every torch; FSDP2 and the compare line where torch has FSDP2."""

    @classmethod
    def setUpClass(cls):
        cls.fsdp2 = has_fsdp2()
        variants = "torch_fsdp2,zeroshard_zero3" if cls.fsdp2 else "zeroshard_zero3"
        cls.status, lines, cls.stderr = run_benchmark(GPT_FLAGS + ["--variants", variants])
        cls.lines = {line.get("variant", line.get("compare")): line for line in lines}

    def test_zero3_runs_with_its_gathers_timed(self):
        self.assertEqual(self.status, 0, self.stderr[-4000:])
        line = self.lines["zeroshard_zero3"]
        self.assertTrue(line["model"].startswith("gpt(blocks=2"), line["model"])
        self.assertGreater(line["iter_ms"], 0)
        self.assertGreater(line["opt_state_bytes_per_rank"], 0)
        for ranks in line["peak_pss_parts_by_rank_rounds"]:
            for parts in ranks:
                self.assertEqual(len(parts), 2)  # the trainer and its worker daemon
        phases = line["rank0_phase_counts"]
        for phase in ("call_gather", "send_release", "call_segment", "hand_over", "call_step"):
            self.assertGreater(phases.get(phase, 0), 0, phases)
        self.assertEqual(len(line["losses_rank0"]), 1 + STEPS + 2)
        self.assertTrue(all(math.isfinite(v) for v in line["losses_rank0"]), line["losses_rank0"])
        # Tiny sizes: the per-tensor timeline is the MLP's only.
        self.assertFalse([p for p in phases if p.startswith("hand_over_t")], phases)

    def test_fsdp2_beside_zero3_or_refused(self):
        if not self.fsdp2:
            result = subprocess.run(
                [sys.executable, script_path(), "--model", "gpt", "--variants", "torch_fsdp2"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
            self.assertEqual(result.returncode, 2, result.stderr[-2000:])
            self.assertIn("needs FSDP2", result.stderr)
            return
        self.assertEqual(self.status, 0, self.stderr[-4000:])
        fsdp2, compared = self.lines["torch_fsdp2"], self.lines["zero3_vs_fsdp2"]
        for ranks in fsdp2["peak_pss_parts_by_rank_rounds"]:
            for parts in ranks:
                self.assertEqual(len(parts), 1)  # the trainer only
        self.assertTrue(fsdp2["optimizer"].startswith("AdamW("), fsdp2["optimizer"])
        zero3 = self.lines["zeroshard_zero3"]
        self.assertAlmostEqual(compared["iter_ratio"], zero3["iter_ms"] / fsdp2["iter_ms"],
                               delta=0.002)
        # The same initial model and data: the first iteration's loss is the same.
        self.assertAlmostEqual(zero3["losses_rank0"][0], fsdp2["losses_rank0"][0], places=4)
        self.assertLess(compared["loss_max_rel_diff"], 1e-2)


class CompareLineTest(unittest.TestCase):
    def test_ratios_are_zero3_over_fsdp2(self):
        script = load_script()
        common = {"bench": "torch_attach", "model": "gpt(...)", "world_size": 2}
        lines = [
            dict(common, variant="torch_fsdp2", iter_ms=200.0, peak_rss_bytes=1000,
                 final_loss_rounds=[4.0, 4.0, 4.2], losses_rank0=[5.0, 4.0],
                 optimizer="AdamW(fused=True)"),
            dict(common, variant="zeroshard_zero3", iter_ms=130.0, peak_rss_bytes=850,
                 final_loss_rounds=[4.1], losses_rank0=[5.0, 4.1],
                 optimizer="zt.ShardedOptimizer(adamw, mode=zero3)"),
        ]
        compared = script.compare_line(lines)
        self.assertEqual(compared["compare"], "zero3_vs_fsdp2")
        self.assertEqual(compared["iter_ratio"], 0.65)
        self.assertEqual(compared["pss_ratio"], 0.85)
        self.assertEqual(compared["loss_fsdp2"], 4.0)
        self.assertEqual(compared["loss_zero3"], 4.1)
        self.assertEqual(compared["loss_max_rel_diff"], 0.025)
        self.assertEqual(compared["fsdp2_optimizer"], "AdamW(fused=True)")
        self.assertIsNone(script.compare_line(lines[:1]))


if __name__ == "__main__":
    unittest.main()
