"""Issue 27 items 3 and 4 on a real local cluster (python3 -m zeroshard.launch, W = 2):
attach_export_rewind_script.py's checks. A tied-weight LSTM trained with zeroshard.torch is
exported by the CLI (`zeroshard export JOB`, without --step: the latest committed checkpoint,
naming its step) and by zt.save, and plain torch loads both with strict=True; after a
load_state_dict() of step 30 at step 50 the job's step follows the model's, the replay's
checkpoints are named by it, and every committed manifest is intact or marked superseded. The
same model in zero3: its export and zt.save (inside opt.full_parameters()) load strictly too.
"""

import json
import os
import unittest

from cluster_support import launch, runfiles_workspace

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "attach_export_rewind_script.py")

CHECKS = ["export_latest_while_running", "progress_before_load", "step_follows_the_load",
          "replay_names_the_steps_again", "committed_manifests_intact",
          "superseded_state_dict_refused", "zt_save_strict_load", "export_final_strict_load",
          "job_step_is_the_model_step", "torch_format_load_step", "torch_format_load_step",
          "zero3_save_strict_load", "zero3_export_strict_load"]


class ExportRewindTest(unittest.TestCase):
    def test_weights_out_and_the_step_follows_the_load(self):
        cli = os.path.join(runfiles_workspace(), "client", "zeroshard")
        status, out = launch(2, SCRIPT, "--cli", cli)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for line in lines:
            print(json.dumps(line))
        self.assertEqual([line["check"] for line in lines], CHECKS, out)
        self.assertEqual([line for line in lines if not line["ok"]], [])
        by_check = {line["check"]: line for line in lines}
        self.assertIn("decoder.weight", by_check["zt_save_strict_load"]["names"])
        self.assertIn("encoder.weight", by_check["export_final_strict_load"]["names"])
        # Which later steps were committed depends on timing (a due checkpoint whose writer is
        # busy is deferred: 31 instead of 30, as seen on a loaded machine); the script checks
        # that each one is superseded, and here they are after the loaded step.
        superseded = by_check["committed_manifests_intact"]["superseded"]
        self.assertTrue(superseded and all(step > 30 for step in superseded), superseded)
        self.assertEqual(status, 0)


if __name__ == "__main__":
    unittest.main()
