"""The trainer of attach_cuda_check.py: a seeded MLP trained with zt.ShardedOptimizer on CPU or
CUDA parameters (whichever its workers are), its final parameters saved by rank 0.

    python3 -m zeroshard.launch --workers W attach_cuda_script.py --device cuda --mode zero2 \
        --steps 20 --out params.pt
"""

import argparse

import torch

import zeroshard.torch as zt


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--mode", choices=["ddp", "zero1", "zero2"], required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    zt.init()
    if args.device == "cuda":
        # The CPU run is the reference: no TF32 rounding in the GPU's matmuls.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        device = torch.device("cuda", 0)
    else:
        device = torch.device("cpu")
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 16)).to(device)
    no_decay = [model[0].bias, model[2].bias]
    opt = zt.ShardedOptimizer(model, "adamw", lr=1e-2, weight_decay=0.1, mode=args.mode,
                              param_groups=[{"params": no_decay, "weight_decay": 0.0}])
    data = torch.Generator().manual_seed(100 + zt.rank())
    for step in range(args.steps):
        x = torch.randn(16, 32, generator=data).to(device)
        y = torch.randn(16, 16, generator=data).to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step(loss=loss.item())
        opt.zero_grad()
        if zt.rank() == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    if zt.rank() == 0:
        torch.save({name: p.detach().cpu() for name, p in model.named_parameters()}, args.out)
    zt.finish()


if __name__ == "__main__":
    main()
