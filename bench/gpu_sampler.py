"""Samples one GPU's SM clock, memory clock, board power, temperature and clock-event reasons through
NVML every `period_s` in a background thread, each sample stamped with time.time(), so that a
benchmark can cut the samples by its own phases. Used by gpu_power_clock.py and
pytorch_llama_layers.py. nvidia-smi reads the same NVML counters; the device script logs it too.
"""
import threading
import time

import pynvml


class Sampler:
    def __init__(self, period_s=0.1, index=0):
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.period_s, self.samples, self.marks = period_s, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self):
        h = self.handle
        row = {"t": time.time(),
               "sm_MHz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
               "mem_MHz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
               "power_W": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
               "temp_C": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}
        try:
            row["reasons"] = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        except Exception:  # older NVML: the throttle-reasons name
            row["reasons"] = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        return row

    def _run(self):
        while not self._stop.is_set():
            self.samples.append(self._read())
            time.sleep(self.period_s)

    def static(self):
        h = self.handle
        return {"name": pynvml.nvmlDeviceGetName(h),
                "power_limit_W": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
                "max_sm_MHz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "max_mem_MHz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "driver": pynvml.nvmlSystemGetDriverVersion()}

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()

    def mark(self, name):
        """Marks the start of a phase (a phase ends where the next begins)."""
        self.marks.append((name, time.time()))

    def summary(self, t0, t1, skip_s=0.0):
        """Mean and spread of the samples in [t0 + skip_s, t1]."""
        rows = [s for s in self.samples if t0 + skip_s <= s["t"] <= t1]
        if not rows:
            return {}
        out = {"samples": len(rows)}
        for k in ("sm_MHz", "power_W", "temp_C", "mem_MHz"):
            v = sorted(r[k] for r in rows)
            out[k] = {"mean": sum(v) / len(v), "min": v[0], "p50": v[len(v) // 2], "max": v[-1]}
        reasons = 0
        for r in rows:
            reasons |= r["reasons"]
        out["reasons_any"] = reasons
        return out
