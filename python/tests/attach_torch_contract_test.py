"""torch.optim's contract around the optimizer on real local clusters (issue 26, items 3-5):
attach_torch_contract_script.py under `python3 -m zeroshard.launch`, W = 1 and 2, one cluster per
W - add_param_group before the first step (and NotImplementedError after it), torch's
clip_grad_norm_ refused on handed-over gradients, model.zero_grad(), zero_grad(set_to_none=True),
parameters without gradients skipped with their own step counts (AdamW, SGD, Adagrad; torch's
state dict loaded), step() without gradients a no-op, opt.clip_grad_norm_ (2 and inf) and ddp's
averaged .grad under torch's clip_grad_norm_, each against torch.optim in the same process in
zero1, zero2 and ddp.
"""

import json
import os
import unittest

import attach_torch_contract_script as script
from cluster_support import launch


HERE = os.path.dirname(os.path.abspath(__file__))
# One line per case and mode, in the script's order.
EXPECTED_LINES = [(name, mode) for name, _, modes in script.CASES for mode in modes]


class TorchContractTest(unittest.TestCase):
    def check(self, workers):
        status, out = launch(workers, os.path.join(HERE, "attach_torch_contract_script.py"))
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for line in lines:
            print(json.dumps(line))
        self.assertEqual([(line["case"], line["mode"]) for line in lines], EXPECTED_LINES, out)
        self.assertEqual([line for line in lines if not line["ok"]], [])
        for line in lines:
            self.assertEqual(line["world_size"], workers)
        self.assertEqual(status, 0, out)

    def test_one_worker(self):
        self.check(1)

    def test_two_workers(self):
        self.check(2)


if __name__ == "__main__":
    unittest.main()
