"""A trainer that asks its worker for a block the protocol never named (issue 25, item 2), run by
`python3 -m zeroshard.launch --workers 1`. map_block used to hand out any block by id: the
optimizer state, the masters. Now the worker refuses it and ends the run; the trainer gets the
reason. Prints one JSON line; exits 0 when the refusal came as expected.
"""

import json
import os
import sys

import torch

import zeroshard.torch as zt
from zeroshard._attach import AttachError
from zeroshard._proto.zeroshard.v1 import attach_pb2


def main():
    env = zt.init()
    # Issue 25, item 3: the worker's socket is its user's alone (it followed the umask).
    mode = os.stat(env.attach_socket).st_mode & 0o7777
    print(json.dumps({"case": "attach_socket_mode", "ok": mode == 0o600, "mode": oct(mode)}),
          flush=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-3, mode="zero1")
    named = {layout.param_block for layout in optimizer._layouts}
    named |= {layout.grad_block for layout in optimizer._layouts if layout.grad_block >= 0}
    unnamed = max(named) + 1  # the engine's next block: optimizer state or masters
    request = attach_pb2.AttachRequest()
    request.map_block.block = unnamed
    try:
        optimizer._connection.call(request, with_fd=True)
        error = None
    except AttachError as e:
        error = str(e)
    expected = f"block {unnamed} is not one a trainer maps"
    ok = error is not None and expected in error
    print(json.dumps({"case": "map_block_of_an_unnamed_block", "ok": ok, "named": sorted(named),
                      "asked": unnamed, "error": error}), flush=True)
    # The run is over (the worker ended it): skip the exit-time finish.
    sys.stdout.flush()
    os._exit(0 if ok and mode == 0o600 else 1)


if __name__ == "__main__":
    main()
