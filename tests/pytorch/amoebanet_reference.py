"""An independent PyTorch build of a Sextant CNN with AmoebaNet-D cells (stem conv, amoeba_cell
layers, global pool, fc): counts its parameters with PyTorch and the FLOPs of one 224x224 forward
pass with hooks (2 x multiply-adds of every convolution and linear layer), and prints them as
JSON. The cell follows the genotype and operations of torchgpipe's benchmarks/models/amoebanet
(Real et al. 2019, AmoebaNet-D; Huang et al. 2019, GPipe), written here from their description;
tests/cli/amoebanet_reference.sh compares the figures with `sextant models show`.

Usage: amoebanet_reference.py MODEL.json
"""
import json
import sys

import torch
from torch import nn


def relu_conv_bn(ci, co, kernel=(1, 1), stride=(1, 1), padding=(0, 0)):
    return nn.Sequential(nn.ReLU(), nn.Conv2d(ci, co, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(co))


class FactorizedReduce(nn.Module):
    def __init__(self, ci, co):
        super().__init__()
        self.conv1 = nn.Conv2d(ci, co // 2, 1, 2, bias=False)
        self.conv2 = nn.Conv2d(ci, co // 2, 1, 2, bias=False)
        self.bn = nn.BatchNorm2d(co)

    def forward(self, x):
        x = torch.relu(x)
        shifted = nn.functional.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.conv1(x), self.conv2(shifted)], 1))


def operation(name, c, stride):
    if name == "conv_1x1":
        return relu_conv_bn(c, c, (1, 1), (stride, stride))
    if name == "conv_3x3":
        return nn.Sequential(relu_conv_bn(c, c // 4),
                             relu_conv_bn(c // 4, c // 4, (3, 3), (stride, stride), (1, 1)),
                             relu_conv_bn(c // 4, c))
    if name == "conv_1x7_7x1":
        return nn.Sequential(relu_conv_bn(c, c // 4),
                             relu_conv_bn(c // 4, c // 4, (1, 7), (1, stride), (0, 3)),
                             relu_conv_bn(c // 4, c // 4, (7, 1), (stride, 1), (3, 0)),
                             relu_conv_bn(c // 4, c))
    if name == "max_pool_3x3":
        return nn.MaxPool2d(3, stride, 1)
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride, 1, count_include_pad=False)
    if name == "max_pool_2x2":
        return nn.MaxPool2d(2, stride)
    if name == "none":
        return nn.Identity() if stride == 1 else FactorizedReduce(c, c)
    raise ValueError(name)


NORMAL = [(1, "conv_1x1"), (1, "max_pool_3x3"), (1, "none"), (0, "conv_1x7_7x1"),
          (0, "conv_1x1"), (0, "conv_1x7_7x1"), (2, "max_pool_3x3"), (2, "none"),
          (1, "avg_pool_3x3"), (5, "conv_1x1")]
NORMAL_CONCAT = [0, 3, 4, 6]
REDUCTION = [(0, "max_pool_2x2"), (0, "max_pool_3x3"), (2, "none"), (1, "conv_3x3"),
             (2, "conv_1x7_7x1"), (2, "max_pool_3x3"), (3, "none"), (1, "max_pool_2x2"),
             (2, "avg_pool_3x3"), (3, "conv_1x1")]
REDUCTION_CONCAT = [4, 5, 6]


class Cell(nn.Module):
    def __init__(self, channels_prev_prev, channels_prev, c, reduction, reduction_prev):
        super().__init__()
        self.reduce1 = relu_conv_bn(channels_prev, c)
        if reduction_prev:
            self.reduce2 = FactorizedReduce(channels_prev_prev, c)
        elif channels_prev_prev != c:
            self.reduce2 = relu_conv_bn(channels_prev_prev, c)
        else:
            self.reduce2 = nn.Identity()
        genotype = REDUCTION if reduction else NORMAL
        self.concat = REDUCTION_CONCAT if reduction else NORMAL_CONCAT
        self.inputs = [i for i, _ in genotype]
        self.ops = nn.ModuleList(
            [operation(name, c, 2 if reduction and i < 2 else 1) for i, name in genotype])

    def forward(self, states):
        prev, prev_prev = states
        s = [self.reduce1(prev), self.reduce2(prev_prev)]
        for k in range(0, len(self.ops), 2):
            s.append(self.ops[k](s[self.inputs[k]]) + self.ops[k + 1](s[self.inputs[k + 1]]))
        return torch.cat([s[i] for i in self.concat], 1), prev


class Net(nn.Module):
    def __init__(self, cnn):
        super().__init__()
        self.layers = nn.ModuleList()
        channels = cnn["input"]["channels"]
        cell_input_channels = None  # the last cell's input channels (its successor's second input)
        reduction_prev = False
        for layer in cnn["layers"]:
            kind = layer["type"]
            if kind == "conv":
                k, s, p = layer["kernel"], layer.get("stride", 1), layer.get("padding", 0)
                mods = [nn.Conv2d(channels, layer["out_channels"], k, s, p, bias=layer["bias"])]
                if layer.get("batch_norm"):
                    mods.append(nn.BatchNorm2d(layer["out_channels"]))
                if layer.get("relu"):
                    mods.append(nn.ReLU())
                self.layers.append(nn.Sequential(*mods))
                channels, cell_input_channels = layer["out_channels"], None
            elif kind == "amoeba_cell":
                for _ in range(layer.get("blocks", 1)):
                    cell = Cell(cell_input_channels or channels, channels, layer["filters"],
                                layer.get("reduction", False),
                                cell_input_channels is not None and reduction_prev)
                    self.layers.append(cell)
                    cell_input_channels = channels
                    reduction_prev = layer.get("reduction", False)
                    channels = layer["filters"] * len(cell.concat)
            elif kind == "adaptive_avg_pool":
                self.layers.append(nn.AdaptiveAvgPool2d(layer["output"]))
                cell_input_channels = None
            elif kind == "fc":
                self.layers.append(nn.Sequential(nn.Flatten(), nn.Linear(channels, layer["out_features"],
                                                                         bias=layer["bias"])))
                channels = layer["out_features"]
            else:
                raise ValueError(f"this reference builds conv, amoeba_cell, adaptive_avg_pool and fc layers, not {kind}")

    def forward(self, x):
        states = None
        for layer in self.layers:
            if isinstance(layer, Cell):
                states = layer(states if states is not None else (x, x))
                x = states[0]
            else:
                x = layer(x)
                states = None
        return x


def main():
    model = json.load(open(sys.argv[1]))
    cnn = model["cnn"]
    net = Net(cnn)
    macs = [0]

    def count(module, _, out):
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            macs[0] += out.numel() * module.in_channels * kh * kw
        elif isinstance(module, nn.Linear):
            macs[0] += out.numel() * module.in_features

    for m in net.modules():
        m.register_forward_hook(count)
    image = torch.zeros(1, cnn["input"]["channels"], cnn["input"]["height"], cnn["input"]["width"])
    with torch.no_grad():
        net.eval()(image)
    print(json.dumps({"parameters": sum(p.numel() for p in net.parameters()),
                      "forward_flops": 2 * macs[0]}))


if __name__ == "__main__":
    main()
