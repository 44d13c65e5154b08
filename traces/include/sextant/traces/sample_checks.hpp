// Measurements checked against what the machine could have done, before any is fitted. A reader
// checks its own format (a damaged file is refused naming the line or event); these checks see
// every source alike and drop what no device of the cluster file could have produced (an op faster
// than the device's peak by far, a collective faster than its links allow, a time that is not a
// positive finite number), each reason said once with a count and an example. Profiles made on
// another kind of device than the file describes are refused.
#pragma once

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/traces/samples.hpp"

namespace sextant::traces {

// How far past the file's figures a measurement may go and still be kept. FLOPs: 1.5x the highest
// peak the file gives for any dtype (boost clocks run past the datasheet's; nothing runs 1.5x
// past them). Bytes: 10x the memory or link bandwidth (on-chip caches deliver a few times DRAM's:
// an H100's L2 about 3x its HBM; ten times is past any cache).
inline constexpr double kMaxPeakFactor = 1.5;
inline constexpr double kMaxBandwidthFactor = 10;
// A collective timed more than this many times the median of its shape's other samples (3 or
// more) stalled on something else (a descheduled rank, a page fault storm): left out.
inline constexpr double kMaxOutlierFactor = 10;

// `samples` less what cannot be a measurement of `cluster`'s devices (in any dtype), with a
// warning for each reason something was left out. Throws InputError naming the file when a
// profile's ops ran on another kind of device (a CPU profile for a GPU cluster, or the reverse).
Samples screen_samples(const Samples& samples, const spec::ClusterSpec& cluster);

}  // namespace sextant::traces
