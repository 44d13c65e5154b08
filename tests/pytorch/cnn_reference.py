"""An independent reference for Sextant's CNN executor: the same network written with PyTorch's own
conv2d (conv3d for volumes), batch_norm (training mode), max/avg/adaptive pooling and linear layers, with the same
initial weights and samples regenerated from Sextant's definitions (gpt_reference.init_normal:
counter-based normal init keyed by tensor name and global element index; Gaussian images labelled
by a fixed random linear teacher, exec/src/train/data.cpp classification_sample; a network ending in a
conv labels every pixel of its last map, segmentation_sample), trained with
torch.optim.AdamW and clip_grad_norm_. Prints one JSON line per step: {"step", "loss",
"grad_norm", "step_time_s"} (the time of the step's compute, the samples' generation left out: what
bench/cnn_executor_bench.sh compares with Sextant's step).

Usage: /usr/bin/python3 cnn_reference.py --model-json MODEL.json --global-batch 8 --micro-batch 2
                                          --steps 5 [--seed 1234] [--lr 1e-3] [--dtype float64]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import init_normal  # noqa: E402
from amoebanet_reference import NORMAL, NORMAL_CONCAT, REDUCTION, REDUCTION_CONCAT  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-json", required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)
    seed = args.seed
    cnn = json.load(open(args.model_json))["cnn"]
    C, H, W = cnn["input"]["channels"], cnn["input"]["height"], cnn["input"]["width"]
    # A volume ("depth" in the input) runs PyTorch's 3D layers over [B, C, D, H, W]; its windows
    # are cubic, as Sextant's.
    D = cnn["input"].get("depth")
    spatial = [H, W] if D is None else [D, H, W]
    nd = len(spatial)
    conv_nd = F.conv2d if nd == 2 else F.conv3d
    conv_transpose_nd = F.conv_transpose2d if nd == 2 else F.conv_transpose3d
    max_pool_nd = F.max_pool2d if nd == 2 else F.max_pool3d
    avg_pool_nd = F.avg_pool2d if nd == 2 else F.avg_pool3d
    segmentation = cnn["layers"][-1]["type"] == "conv"
    classes = cnn["layers"][-1]["out_channels" if segmentation else "out_features"]

    decay, no_decay = [], []

    def normal(name, shape, std):
        t = torch.tensor(std * init_normal(seed, name, int(np.prod(shape))).reshape(shape), dtype=dtype,
                         requires_grad=True)
        decay.append(t)
        return t

    def const(n, value):
        t = torch.full((n,), value, dtype=dtype, requires_grad=True)
        no_decay.append(t)
        return t

    # Sextant's lowered layers: bottleneck stages expand into their blocks, named layer0, layer1...
    layers = []  # (kind, spec, params, extra)
    kept_channels = []  # the channels of maps kept for a concat (U-Net's skips)

    def conv_params(name, cin, cout, k, bias, bn):
        return {"w": normal(name + ".weight", (cout, cin) + (k,) * nd, math.sqrt(2.0 / (cin * k ** nd))),
                "b": const(cout, 0.0) if bias else None,
                "g": const(cout, 1.0) if bn else None,
                "beta": const(cout, 0.0) if bn else None}

    def bn(x, p_):
        return F.batch_norm(x, None, None, p_["g"], p_["beta"], training=True, eps=1e-5)

    def relu_conv_bn(name, ci, co, kh=1, kw=1, sh=1, sw=1):
        # torchgpipe's relu_conv_bn and the steps of its conv operations: ReLU, a kh x kw
        # convolution padded by half the window, batch norm.
        p_ = {"w": normal(name + ".weight", (co, ci, kh, kw), math.sqrt(2.0 / (ci * kh * kw))),
              "g": const(co, 1.0), "beta": const(co, 0.0)}
        return lambda x: bn(F.conv2d(F.relu(x), p_["w"], stride=(sh, sw),
                                     padding=((kh - 1) // 2, (kw - 1) // 2)), p_)

    def factorized_reduce(name, ci, co):
        w1 = normal(name + ".conv1.weight", (co // 2, ci, 1, 1), math.sqrt(2.0 / ci))
        w2 = normal(name + ".conv2.weight", (co // 2, ci, 1, 1), math.sqrt(2.0 / ci))
        p_ = {"g": const(co, 1.0), "beta": const(co, 0.0)}

        def run(x):
            x = F.relu(x)
            shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
            return bn(torch.cat([F.conv2d(x, w1, stride=2), F.conv2d(shifted, w2, stride=2)], 1), p_)
        return run

    def edge(name, op, c, stride):
        if op == "conv_1x1":
            return relu_conv_bn(name, c, c, 1, 1, stride, stride)
        if op == "conv_3x3":
            fs = [relu_conv_bn(name + ".conv1", c, c // 4), relu_conv_bn(name + ".conv2", c // 4, c // 4, 3, 3, stride, stride),
                  relu_conv_bn(name + ".conv3", c // 4, c)]
        elif op == "conv_1x7_7x1":
            fs = [relu_conv_bn(name + ".conv1", c, c // 4), relu_conv_bn(name + ".conv2", c // 4, c // 4, 1, 7, 1, stride),
                  relu_conv_bn(name + ".conv3", c // 4, c // 4, 7, 1, stride, 1), relu_conv_bn(name + ".conv4", c // 4, c)]
        elif op == "max_pool_3x3":
            return lambda x: F.max_pool2d(x, 3, stride, 1)
        elif op == "avg_pool_3x3":
            return lambda x: F.avg_pool2d(x, 3, stride, 1, count_include_pad=False)
        elif op == "max_pool_2x2":
            return lambda x: F.max_pool2d(x, 2, stride)
        else:  # "none"
            return (lambda x: x) if stride == 1 else factorized_reduce(name, c, c)

        def chain(x):
            for f in fs:
                x = f(x)
            return x
        return chain

    def amoeba_cell(name, c_prev, c_prev_prev, filters, reduction, reduction_prev):
        # AmoebaNet-D's cell (Real et al. 2019) as torchgpipe builds it: both inputs to `filters`
        # channels, five nodes of two edges each, the joined states. Returns it and its channels.
        reduce1 = relu_conv_bn(name + ".reduce1", c_prev, filters)
        if reduction_prev:
            reduce2 = factorized_reduce(name + ".reduce2", c_prev_prev, filters)
        elif c_prev_prev != filters:
            reduce2 = relu_conv_bn(name + ".reduce2", c_prev_prev, filters)
        else:
            reduce2 = lambda x: x  # noqa: E731
        genotype, concat = (REDUCTION, REDUCTION_CONCAT) if reduction else (NORMAL, NORMAL_CONCAT)
        edges = [(i, edge(f"{name}.node{k // 2}.{'ab'[k % 2]}", op, filters, 2 if reduction and i < 2 else 1))
                 for k, (i, op) in enumerate(genotype)]

        def run(prev, prev_prev):
            states = [reduce1(prev), reduce2(prev_prev)]
            for k in range(0, len(edges), 2):
                (i, f), (j, g) = edges[k], edges[k + 1]
                states.append(f(states[i]) + g(states[j]))
            return torch.cat([states[i] for i in concat], 1)
        return run, filters * len(concat)

    def basic_conv(name, ci, co, kh, kw, stride=1, ph=0, pw=0):
        # torchvision's BasicConv2d: convolution without bias, batch norm, ReLU.
        p_ = {"w": normal(name + ".weight", (co, ci, kh, kw), math.sqrt(2.0 / (ci * kh * kw))),
              "g": const(co, 1.0), "beta": const(co, 0.0)}
        return lambda x: F.relu(bn(F.conv2d(x, p_["w"], stride=stride, padding=(ph, pw)), p_))

    def inception_module(name, ci, module, width, divisor):
        # Inception-v3's InceptionA..E as torchvision's models/inception.py builds them (Szegedy
        # et al. 2016, Figures 5-7), the paper's widths divided by `divisor`. A branch is a list
        # of ("conv", out, kh, kw, stride, ph, pw) / ("avg",) / ("max",) steps, or (steps, splits)
        # for module e's 1x3/3x1 outputs. Returns the module and its output channels.
        n = lambda c: c // divisor  # noqa: E731
        same = lambda co, kh, kw: ("conv", co, kh, kw, 1, (kh - 1) // 2, (kw - 1) // 2)  # noqa: E731
        one = lambda co: ("conv", co, 1, 1, 1, 0, 0)  # noqa: E731
        down = lambda co: ("conv", co, 3, 3, 2, 0, 0)  # noqa: E731
        if module == "a":
            branches = [[one(n(64))], [one(n(48)), same(n(64), 5, 5)],
                        [one(n(64)), same(n(96), 3, 3), same(n(96), 3, 3)], [("avg",), one(width)]]
        elif module == "b":
            branches = [[down(n(384))], [one(n(64)), same(n(96), 3, 3), down(n(96))], [("max",)]]
        elif module == "c":
            branches = [[one(n(192))], [one(width), same(width, 1, 7), same(n(192), 7, 1)],
                        [one(width), same(width, 7, 1), same(width, 1, 7), same(width, 7, 1),
                         same(n(192), 1, 7)],
                        [("avg",), one(n(192))]]
        elif module == "d":
            branches = [[one(n(192)), down(n(320))],
                        [one(n(192)), same(n(192), 1, 7), same(n(192), 7, 1), down(n(192))], [("max",)]]
        else:
            pair = [[same(n(384), 1, 3)], [same(n(384), 3, 1)]]
            branches = [[one(n(320))], ([one(n(384))], pair),
                        ([one(n(448)), same(n(384), 3, 3)], pair), [("avg",), one(n(192))]]

        def chain(scope, steps, c):
            fs = []
            for j, st in enumerate(steps):
                if st[0] == "avg":
                    fs.append(lambda x: F.avg_pool2d(x, 3, 1, 1))  # count_include_pad=True
                elif st[0] == "max":
                    fs.append(lambda x: F.max_pool2d(x, 3, 2))
                else:
                    _, co, kh, kw, stride, ph, pw = st
                    fs.append(basic_conv(f"{scope}.{j}", c, co, kh, kw, stride, ph, pw))
                    c = co

            def run(x):
                for f in fs:
                    x = f(x)
                return x
            return run, c

        runs, out = [], 0
        for b, branch in enumerate(branches):
            if isinstance(branch, tuple):
                head, c = chain(f"{name}.b{b}", branch[0], ci)
                parts = [chain(f"{name}.b{b}.s{k}", steps, c) for k, steps in enumerate(branch[1])]
                runs.append(lambda x, head=head, parts=parts: torch.cat([f(head(x)) for f, _ in parts], 1))
                out += sum(c_ for _, c_ in parts)
            else:
                f, c = chain(f"{name}.b{b}", branch, ci)
                runs.append(f)
                out += c
        return (lambda x: torch.cat([f(x) for f in runs], 1)), out

    cell_input_channels, reduction_prev = None, False  # the last cell's input, when the unit before is one
    channels, flat = C, None
    extent = list(spatial)  # the current map's extent (a segmentation head's labels sit on the last)
    index = 0
    for i, l in enumerate(cnn["layers"]):
        kind = l["type"]
        repeats = l.get("blocks", 1) if kind in ("bottleneck", "amoeba_cell", "inception") else 1
        for r in range(repeats):
            name = f"layer{index}"
            index += 1
            if kind == "conv":
                k = l.get("kernel", 1)
                stride, padding = l.get("stride", 1), l.get("padding", 0)
                layers.append(("conv", dict(stride=stride, padding=padding, relu=l.get("relu", False),
                                            skip=l.get("skip", False)),
                               conv_params(name + ".conv", channels, l["out_channels"], k, l.get("bias", False),
                                           l.get("batch_norm", False))))
                channels = l["out_channels"]
                extent = [(n + 2 * padding - k) // stride + 1 for n in extent]
            elif kind in ("max_pool", "avg_pool"):
                k = l.get("kernel", 1)
                stride, padding = l.get("stride", k), l.get("padding", 0)
                layers.append((kind, dict(kernel=k, stride=stride, padding=padding, skip=l.get("skip", False)),
                               None))
                extent = [(n + 2 * padding - k) // stride + 1 for n in extent]
            elif kind == "up_conv":
                # ConvTranspose2d's [in, out, k, k] weight (3d's [in, out, k, k, k]), std
                # sqrt(2 / (in k^2)) (k^3) as the executor draws it.
                k, stride = l["kernel"], l.get("stride", l["kernel"])
                layers.append(("up_conv", dict(stride=stride),
                               {"w": normal(name + ".up_conv.weight", (channels, l["out_channels"]) + (k,) * nd,
                                            math.sqrt(2.0 / (channels * k ** nd))),
                                "b": const(l["out_channels"], 0.0) if l.get("bias", False) else None}))
                channels = l["out_channels"]
                extent = [(n - 1) * stride + k for n in extent]
            elif kind == "amoeba_cell":
                run, out = amoeba_cell(name, channels, cell_input_channels or channels, l["filters"],
                                       l.get("reduction", False),
                                       cell_input_channels is not None and reduction_prev)
                layers.append(("amoeba_cell", dict(reads_skip=cell_input_channels is not None), run))
                cell_input_channels, reduction_prev = channels, l.get("reduction", False)
                channels = out
            elif kind == "inception":
                run, channels = inception_module(name, channels, l["module"], l.get("width", 0),
                                                 l.get("divisor", 1))
                layers.append(("inception", {}, run))
                if l["module"] in ("b", "d"):
                    extent = [(n - 3) // 2 + 1 for n in extent]
            elif kind == "concat":
                layers.append(("concat", {}, None))
                channels += kept_channels.pop()
            elif kind == "adaptive_avg_pool":
                layers.append((kind, dict(output=l.get("output", 1)), None))
                flat = channels * l.get("output", 1) ** nd
            elif kind == "fc":
                fin = flat if flat is not None else channels
                last = i + 1 == len(cnn["layers"])
                layers.append(("fc", dict(relu=l.get("relu", False)),
                               {"w": normal(name + ".fc.weight", (fin, l["out_features"]),
                                            0.01 if last else math.sqrt(2.0 / fin)),
                                "b": const(l["out_features"], 0.0) if l.get("bias", True) else None}))
                flat = l["out_features"]
            elif kind == "bottleneck":
                stride = l.get("stride", 1) if r == 0 else 1
                mid, out = l["mid_channels"], l["out_channels"]
                params = {"conv1": conv_params(name + ".conv1", channels, mid, 1, False, True),
                          "conv2": conv_params(name + ".conv2", mid, mid, 3, False, True),
                          "conv3": conv_params(name + ".conv3", mid, out, 1, False, True)}
                if stride != 1 or channels != out:
                    params["downsample"] = conv_params(name + ".downsample", channels, out, 1, False, True)
                layers.append(("bottleneck", dict(stride=stride), params))
                channels = out
            else:
                raise SystemExit(f"unknown layer type {kind}")
            if kind != "amoeba_cell":
                cell_input_channels = None
            if l.get("skip", False):
                kept_channels.append(channels)

    def conv(x, p_, stride, padding, relu):
        y = conv_nd(x, p_["w"], p_["b"], stride=stride, padding=padding)
        if p_["g"] is not None:
            y = F.batch_norm(y, None, None, p_["g"], p_["beta"], training=True, eps=1e-5)
        return F.relu(y) if relu else y

    def forward(x):
        kept = []
        skip = None  # the last cell's input (its successor's second input)
        for kind, s, p_ in layers:
            if kind == "amoeba_cell":
                x, skip = p_(x, skip if s["reads_skip"] else x), x
                continue
            skip = None
            if kind == "inception":
                x = p_(x)
            elif kind == "conv":
                x = conv(x, p_, s["stride"], s["padding"], s["relu"])
            elif kind == "max_pool":
                x = max_pool_nd(x, s["kernel"], s["stride"], s["padding"])
            elif kind == "avg_pool":
                x = avg_pool_nd(x, s["kernel"], s["stride"], s["padding"])
            elif kind == "up_conv":
                x = conv_transpose_nd(x, p_["w"], p_["b"], stride=s["stride"])
            elif kind == "concat":
                # The kept map's centre crop (floor of half the difference before, on every
                # axis), then x.
                k = kept.pop()
                crop = tuple(slice((a - b) // 2, (a - b) // 2 + b) for a, b in zip(k.shape[2:], x.shape[2:]))
                x = torch.cat([k[(slice(None), slice(None)) + crop], x], dim=1)
            elif kind == "adaptive_avg_pool":
                x = (F.adaptive_avg_pool2d if nd == 2 else F.adaptive_avg_pool3d)(x, s["output"])
            elif kind == "fc":
                x = torch.flatten(x, 1) @ p_["w"]
                if p_["b"] is not None:
                    x = x + p_["b"]
                if s["relu"]:
                    x = F.relu(x)
            else:
                a = conv(x, p_["conv1"], 1, 0, True)
                a = conv(a, p_["conv2"], s["stride"], 1, True)
                a = conv(a, p_["conv3"], 1, 0, False)
                short = conv(x, p_["downsample"], s["stride"], 0, False) if "downsample" in p_ else x
                x = F.relu(a + short)
            if s.get("skip", False):
                kept.append(x)
        return x

    pixels = C * int(np.prod(spatial))  # the image's elements
    read = min(pixels, 1024)  # exec/src/train/data.hpp kTeacherInputs
    teacher = init_normal(seed, "teacher", read * classes).astype(np.float32).reshape(read, classes)
    # segmentation_sample: a teacher over the channels of the image pixel under each output pixel
    # (the image's centre crop), float32 scores accumulated channel by channel.
    pixel_teacher = init_normal(seed, "pixel_teacher", C * classes).astype(np.float32).reshape(C, classes)
    crop = tuple(slice((a - b) // 2, (a - b) // 2 + b) for a, b in zip(spatial, extent))

    def pixel_labels(x):
        image = x.astype(np.float32).reshape([C] + spatial)[(slice(None),) + crop]
        scores = np.zeros([classes] + extent, dtype=np.float32)
        axes = (None,) * nd
        for ch in range(C):
            scores += image[ch][(None,) + (slice(None),) * nd] * pixel_teacher[ch][(slice(None),) + axes]
        return np.argmax(scores, axis=0)

    def sample(index):
        x = init_normal(seed, f"sample{index}", pixels)
        if segmentation:
            return x, pixel_labels(x)
        # classification_sample: the float32 scores accumulated in order, argmax (first on ties).
        scores = np.zeros(classes, dtype=np.float32)
        for j in range(read):
            scores += x[j] * teacher[j]
        return x, int(np.argmax(scores))

    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    params = decay + no_decay
    for step in range(args.steps):
        batches = []
        for m in range(args.global_batch // args.micro_batch):
            xs, ys = zip(*[sample(step * args.global_batch + m * args.micro_batch + i)
                           for i in range(args.micro_batch)])
            batches.append((torch.tensor(np.stack(xs).reshape([args.micro_batch, C] + spatial), dtype=dtype),
                            torch.tensor(np.array(ys))))
        start = time.perf_counter()
        opt.zero_grad()
        total = 0.0
        for x, y in batches:
            if segmentation:
                # Each sample's mean over its pixels (voxels), summed over the samples.
                per_pixel = F.cross_entropy(forward(x), y, reduction="none")
                loss = per_pixel.mean(dim=tuple(range(1, nd + 1))).sum() / args.global_batch
            else:
                loss = F.cross_entropy(forward(x), y, reduction="sum") / args.global_batch
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        elapsed = time.perf_counter() - start
        print(json.dumps({"step": step, "loss": total, "grad_norm": float(norm), "step_time_s": elapsed}))


if __name__ == "__main__":
    main()
