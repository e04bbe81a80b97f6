"""A model that does not fit otherwise (issue 39's target): attached trainers on real local
clusters of 2 workers (attach_memory_limit_script.py). Unlimited runs measure what each mode's
worker holds (its engine's counted bytes); with every worker's --memory_limit_bytes halfway
between zero3's and zero2's, zero2 is refused at submission with the figures (its need, the
limit, zero3's need that fits) and zero3 trains within it. Fails when zero3 needs as much as zero2 (the parameters are not
sharded), when the limit does not reach attached jobs, or when the refusal names no figures.
The trainers run under $ZEROSHARD_TRAINER_PYTHON when set (CI: the torch 2.x venv)."""

import json
import os
import unittest

from cluster_support import launch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "attach_memory_limit_script.py")


def run(mode, limit=None, flags=()):
    flags = list(flags) + ([] if limit is None else [f"--worker_flag=--memory_limit_bytes={limit}"])
    status, out = launch(2, SCRIPT, mode, launcher_args=flags)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for line in lines:
        if "memory" in line:
            print(mode, json.dumps(line))
    return status, out, [line for line in lines if "mode" in line]


class AttachMemoryLimitTest(unittest.TestCase):

    def test_only_zero3_fits_between_the_two_needs(self):
        counted = {}
        for mode in ("zero2", "zero3"):
            status, out, lines = run(mode)
            self.assertEqual(status, 0, out)
            self.assertEqual(len(lines), 1, out)
            self.assertTrue(lines[0]["trained"], lines[0])
            counted[mode] = lines[0]["worker_counted_bytes"]
        print(json.dumps({"worker_counted_bytes": counted}))
        # zero3 leaves half the parameters (W = 2) on the other rank, less its gather pool.
        self.assertLess(counted["zero3"], 0.9 * counted["zero2"], counted)
        limit = (counted["zero2"] + counted["zero3"]) // 2

        status, out, lines = run("zero2", limit)
        print(json.dumps(lines))
        self.assertEqual(len(lines), 1, out)
        self.assertFalse(lines[0]["trained"], lines[0])
        refusal = lines[0].get("error", "")
        # Refused at submission, with the figures: zero2's need, the limit, and zero3's fit.
        self.assertIn("RESOURCE_EXHAUSTED: spec.mode: ZERO2 needs", refusal)
        self.assertIn("--memory_limit_bytes=", refusal)
        self.assertIn(f"({limit} bytes)", refusal)
        self.assertIn("ZERO3 would need", refusal)
        self.assertIn("(fits)", refusal)

        status, out, lines = run("zero3", limit)
        print(json.dumps(lines))
        self.assertEqual(status, 0, out)
        self.assertEqual(len(lines), 1, out)
        self.assertTrue(lines[0]["trained"], lines[0])
        self.assertLessEqual(lines[0]["worker_counted_bytes"], limit)

    def test_zero3_equals_zero2_with_a_slow_rank_and_one_bucket_buffer(self):
        # The model spans 17 buckets in zero3 (its default bucket): modules span several, and
        # backward's gathers run among the reduce-scatters.
        status, out, lines = run("compare", flags=["--worker_flag=--bucket_pool_size=1"])
        print(json.dumps(lines))
        self.assertEqual(status, 0, out)
        self.assertEqual(len(lines), 1, out)
        self.assertTrue(lines[0]["equal"], lines[0])


if __name__ == "__main__":
    unittest.main()
