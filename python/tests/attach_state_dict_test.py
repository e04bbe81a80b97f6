"""ShardedOptimizer.state_dict() / load_state_dict() on real local clusters (python3 -m
zeroshard.launch): attach_state_dict_script.py's checks at W = 2 (the consolidated state against
torch's ZeroRedundancyOptimizer, bitwise replay after a load, round trips with torch.optim.AdamW,
bad inputs), and a sharded state dict saved at W = 2 loaded at W = 3 (resharded by the workers,
with each tensor's own step count: the last layer was stepped once alone, issue 26).
"""

import json
import os
import shutil
import tempfile
import unittest

from cluster_support import launch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "attach_state_dict_script.py")


def checks(out):
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for line in lines:
        print(json.dumps(line))
    return lines


class StateDictTest(unittest.TestCase):
    def test_checks_at_two_workers(self):
        status, out = launch(2, SCRIPT)
        lines = checks(out)
        by_check = {}
        for line in lines:
            by_check.setdefault(line["check"], []).append(line)
        self.assertEqual(len(by_check.get("zero_equivalence", [])), 3, out)
        self.assertEqual(len(by_check.get("save_load_bitwise", [])), 3, out)
        self.assertEqual(len(by_check.get("consolidated_into_torch_adamw", [])), 1, out)
        self.assertEqual(len(by_check.get("torch_adamw_into_zeroshard", [])), 1, out)
        self.assertEqual(len(by_check.get("bad_input", [])), 11, out)
        self.assertEqual(len(by_check.get("bad_inputs_changed_nothing", [])), 1, out)
        for line in by_check["zero_equivalence"]:
            self.assertLessEqual(line["worst_relative"], 1e-6, line)
        self.assertEqual([line for line in lines if not line["ok"]], [])
        self.assertEqual(status, 0)

    def test_saved_at_two_workers_loads_at_three(self):
        directory = tempfile.mkdtemp(prefix="zs-sd-", dir="/tmp")
        try:
            status, out = launch(2, SCRIPT, "--save", directory)
            saved = checks(out)
            self.assertEqual(status, 0, out)
            self.assertEqual([line["check"] for line in saved if line["ok"]],
                             ["saved_for_other_world_size"], out)
            status, out = launch(3, SCRIPT, "--load", directory)
            loaded = checks(out)
            self.assertEqual(len(loaded), 1, out)
            self.assertEqual(loaded[0]["check"], "loaded_from_other_world_size")
            self.assertEqual(loaded[0]["world_size"], 3)
            self.assertEqual(loaded[0]["saved_world_size"], 2)
            self.assertTrue(loaded[0]["ok"], loaded[0])
            self.assertEqual(status, 0)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
