"""Runs tools/compare.py reduced (seed, W = 2, a few steps, a small kernel) into the test's
temporary directory and checks its output: the plots are real PNGs, and every number in the
markdown equals the one recomputed here from the raw JSON it saved (without compare.py's code)."""

import json
import os
import re
import statistics
import subprocess
import sys
import unittest

WORKSPACE = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE",
                                                                          "zeroshard"))
OUT_DIR = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "report")
STEPS = 5
WARMUP = 1
# zero3 runs too (issue 38): its row adds the plan's gather pool to the formula column.
ZEROSHARD_MODES = ["ddp", "zero1", "zero2", "zero3"]
VARIANTS = ["torch_ddp", "torch_zero"] + [f"zeroshard_{mode}" for mode in ZEROSHARD_MODES]
PLOTS = ["loss.png", "memory.png", "iteration.png", "kernels.png"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIB = 1 << 20
# The markdown shows 3 significant digits.
DISPLAY_RELATIVE = 5e-3
# Final parameters within this fraction of the largest |parameter| of torch DDP's: the two sides
# round differently (docs/workloads.md: about 2.5e-7 after 20 steps).
PARAM_AGREEMENT = 1e-5


def run_compare():
    command = [sys.executable, os.path.join(WORKSPACE, "tools", "compare.py"),
               "--presets=seed", "--world_sizes=2", f"--steps={STEPS}", f"--warmup={WARMUP}",
               "--kernel_params=262144", "--kernel_rounds=1", "--no-attached", "--lock=",
               f"--zeroshard_modes={','.join(ZEROSHARD_MODES)}",
               f"--bin_dir={WORKSPACE}", f"--out={os.path.join(OUT_DIR, 'report.md')}"]
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=150)


def table_rows(markdown, header_start):
    """The cells of each row of the table whose header line starts with `header_start`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def expected_formula_bytes(variant, params, world_size):
    """ZeRO's per-rank bytes for fp32 AdamW: 4 (parameters) + 4 (gradients) + 8 (two moments)
    bytes a parameter; ZeroRedundancyOptimizer and zero1 shard the moments, zero2 the gradients
    too."""
    grads = 4 * params / (world_size if variant in ("zeroshard_zero2", "zeroshard_zero3") else 1)
    moments = 8 * params / (world_size if variant in ("torch_zero", "zeroshard_zero1",
                                                      "zeroshard_zero2", "zeroshard_zero3") else 1)
    # zero3 shards the parameters too (its gather pool is the plan's figure, added by the caller).
    return 4 * params / (world_size if variant == "zeroshard_zero3" else 1) + grads + moments


class CompareReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.result = run_compare()
        if cls.result.returncode != 0:
            raise AssertionError(f"compare.py failed:\n{cls.result.stderr[-6000:]}")
        with open(os.path.join(OUT_DIR, "report.md")) as f:
            cls.markdown = f.read()
        raw = os.path.join(OUT_DIR, "raw")
        with open(os.path.join(raw, "meta.json")) as f:
            cls.meta = json.load(f)
        with open(os.path.join(raw, "train-seed-w2.json")) as f:
            cls.training = json.load(f)
        with open(os.path.join(raw, "kernels.json")) as f:
            cls.kernels = json.load(f)

    def assertShows(self, cell, value, what):
        shown = float(cell)
        self.assertLessEqual(abs(shown - value), DISPLAY_RELATIVE * abs(value) + 1e-12,
                             f"{what}: the markdown shows {cell}, the raw JSON gives {value}")

    def test_plots_are_pngs_of_reasonable_size(self):
        for name in PLOTS:
            with self.subTest(plot=name):
                path = os.path.join(OUT_DIR, name)
                with open(path, "rb") as f:
                    data = f.read()
                self.assertEqual(data[:8], PNG_SIGNATURE)
                self.assertGreater(len(data), 4000)
                self.assertLess(len(data), 200 * 1024)
                self.assertIn(f"]({name})", self.markdown)

    def test_header_states_machine_load_and_torch(self):
        machine = self.meta["machine"]
        self.assertIn(f"{machine['cpu_model']}, {machine['cores']} cores", self.markdown)
        self.assertIn(f"{self.meta['load_average_before']} before", self.markdown)
        self.assertIn(f"{self.meta['load_average_after']} after", self.markdown)
        self.assertIn(f"torch {self.meta['torch']['version']} ", self.markdown)
        fused = "available" if self.meta["torch"]["fused_cpu_adamw"] else "not available"
        self.assertIn(f"fused CPU AdamW {fused}", self.markdown)

    def test_every_variant_ran_every_step(self):
        self.assertEqual([v["variant"] for v in self.training["variants"]], VARIANTS)
        for variant in self.training["variants"]:
            with self.subTest(variant=variant["variant"]):
                self.assertEqual([s["step"] for s in variant["steps"]],
                                 list(range(1, WARMUP + STEPS + 1)))
                self.assertEqual(len(variant["peak_rss_bytes_per_rank"]), 2)

    def test_final_parameters_agree_with_torch(self):
        tolerance = PARAM_AGREEMENT * self.training["max_abs_param"]
        self.assertGreater(self.training["max_abs_param"], 0)
        for variant in self.training["variants"]:
            with self.subTest(variant=variant["variant"]):
                self.assertLessEqual(variant["max_abs_dparam_vs_torch_ddp"], tolerance)

    def test_training_table_matches_raw_json(self):
        rows = table_rows(self.markdown, "| preset | W | variant | iteration ms")
        self.assertEqual([row[2] for row in rows], VARIANTS)
        by_variant = {v["variant"]: v for v in self.training["variants"]}
        for row in rows:
            variant = by_variant[row[2]]
            measured = variant["steps"][WARMUP:]

            def median(key):
                return statistics.median(s[key] for s in measured)

            # The torch variants have no plan; zero3's pool comes from its plan's formula.
            plan_formula = variant.get("model_state_formula", {})
            comm_key = "exposed_comm_ms" if "exposed_comm_ms" in measured[0] else \
                "comm_after_backward_ms"
            expected = {
                3: median("iteration_ms"),
                4: median("compute_ms"),
                5: median(comm_key),
                6: median("update_ms"),
                7: max(variant["peak_rss_bytes_per_rank"]) / MIB,
                8: (expected_formula_bytes(row[2], self.training["params"], 2)
                    + float(plan_formula.get("gather_pool_bytes", 0))) / MIB,
                9: variant["memory"]["optimizer_state_bytes"] / MIB,
                10: variant["steps"][-1]["loss"],
                11: variant["max_abs_dparam_vs_torch_ddp"],
            }
            self.assertEqual(row[:2], ["seed", "2"])
            for column, value in expected.items():
                with self.subTest(variant=row[2], column=column):
                    self.assertShows(row[column], value, f"{row[2]} column {column}")

    def test_kernel_table_matches_raw_json(self):
        values = {}
        for line in self.kernels["lines"]:
            if line["bench"] == "optimizer":
                values.setdefault(("zeroshard", line["threads"]), []).append(line["gbps"])
                values.setdefault(("baseline", line["threads"]), []).append(
                    line["baseline_gbps"])
            else:
                values.setdefault((f"torch_{line['impl']}", line["threads"]), []).append(
                    line["gbps"])
        rows = table_rows(self.markdown, "| side | threads | GB/s |")
        self.assertEqual(sorted((row[0], int(row[1])) for row in rows), sorted(values))
        self.assertIn(("zeroshard", 1), values)
        self.assertTrue(any(side.startswith("torch_") for side, _ in values))
        for side, threads, gbps in rows:
            self.assertShows(gbps, statistics.median(values[(side, int(threads))]),
                             f"{side} {threads} threads")

    def test_losses_fall_alike(self):
        finals = {v["variant"]: v["steps"][-1]["loss"] for v in self.training["variants"]}
        firsts = {v["variant"]: v["steps"][0]["loss"] for v in self.training["variants"]}
        for variant in VARIANTS:
            with self.subTest(variant=variant):
                self.assertLess(finals[variant], firsts[variant])
                self.assertAlmostEqual(finals[variant], finals["torch_ddp"],
                                       delta=1e-5 * finals["torch_ddp"])


if __name__ == "__main__":
    unittest.main()
