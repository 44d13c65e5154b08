"""Makes pytorch-cpu-kineto.json: a PyTorch profiler measurement (torch.profiler with
record_shapes=True) of two AdamW steps of a small MLP on CPU, in Kineto's Chrome-trace layout.

Debian's python3-torch 1.13 is built without Kineto: its export_chrome_trace writes the legacy
layout without shapes. The events (names, times, input shapes) are the profiler's own; this script
writes them in the layout a Kineto-enabled PyTorch exports ("cat": "cpu_op", "args": {"Input
Dims", "External id"}), which is what `sextant calibrate --kineto` reads.
Run: /usr/bin/python3 make_pytorch_profile.py
"""
import json

import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128), nn.LayerNorm(128),
                      nn.Linear(128, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(256, 128)
y = torch.randint(0, 256, (256,))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True) as prof:
    for _ in range(2):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

events = []
for e in prof.events():
    events.append({
        "ph": "X", "cat": "cpu_op", "name": e.name, "pid": 0, "tid": e.thread,
        "ts": e.time_range.start, "dur": e.time_range.end - e.time_range.start,
        "args": {"Input Dims": [list(s) for s in e.input_shapes], "External id": e.id},
    })
with open("pytorch-cpu-kineto.json", "w") as f:
    json.dump({"schemaVersion": 1, "traceEvents": events,
               "note": "torch.profiler events of torch 1.13 (CPU) in Kineto's layout"}, f)
