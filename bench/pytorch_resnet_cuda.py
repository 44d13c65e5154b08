"""PyTorch's ResNet-50 training step on the GPU, the peer for `sextant run --model resnet50
--backend cuda` (scripts/gpu-check.sh cnn): torchvision's resnet50 (v1.5, as models/zoo/resnet50.json),
random 224x224 images and labels, cross-entropy, AdamW (fused), cuDNN convolutions. fp32 runs with
TF32 off (exact fp32 GEMMs and convolutions, as Sextant's --precision fp32), tf32 with it on.
Prints one JSON line: the mean step time over --steps after --warmup steps.

Usage: python3 bench/pytorch_resnet_cuda.py --precision fp32|tf32 [--micro-batch 32] [--steps 10]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
import torchvision


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--precision", choices=["fp32", "tf32"], default="fp32")
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    tf32 = args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50(num_classes=1000).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randn(args.micro_batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (args.micro_batch,), device="cuda")
    times = []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    t = sum(times) / len(times)
    print(json.dumps({"impl": f"pytorch cuda {args.precision} resnet50 (torchvision, cuDNN)",
                      "micro_batch": args.micro_batch, "step_time_s": t,
                      "images_per_s": args.micro_batch / t}))


if __name__ == "__main__":
    main()
