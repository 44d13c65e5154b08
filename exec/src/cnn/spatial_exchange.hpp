// A CNN rank's block of every feature map in a spatial split (Dryden et al., IPDPS'19), and the
// halo exchange before a window slides over it: the rows and columns (and a volume's planes) its
// windows read beyond its block come from the ranks holding them, with non-blocking sends;
// backward, their gradients go back and are added by their holders. Unsplit (a grid of one), the
// same code pads the map.
//
// Blocks are spec::shard_rows of each axis (row-major grid); a rank's window input is
// spec::window_input_rows of its output block. Every rank computes every rank's block and window
// from the map's geometry, so a sender knows what its peer needs without asking. Blocks, halos and
// the messages between ranks are the backend's tensors, copied with DeviceMemory::copy_box, so an
// unsplit map is padded on the GPU as on the CPU; the CNN stage still runs split maps on CPU ranks
// only (its batch-norm sums travel in host vectors).
#pragma once

#include <cstdint>
#include <functional>

#include "sextant/exec/communicator.hpp"
#include "sextant/exec/kernels/memory.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::exec {

using Region = spec::MapBlock;
using WindowGeometry = spec::Window;

// Copies block `r` (whole-map coordinates) of every one of a map tensor's B x C maps from `src`,
// which holds region `from` of each, into `dst`, which holds `to`.
void copy_block(DeviceMemory& backend, const Tensor& src, const Region& from, Tensor& dst,
                const Region& to, const Region& r);

class SpatialExchange {
 public:
  // `comm`: the spatial group (null when unsplit); `index`: this rank's place in the grid.
  SpatialExchange(spec::SpatialSplit grid, int64_t index, Communicator* comm);

  // Rank `rank`'s block of a map (the whole map when unsplit): rows and columns, and a volume's
  // planes.
  Region block(const spec::MapExtent& map, int64_t rank) const;
  Region block(const spec::MapExtent& map) const { return block(map, index_); }
  // The input block rank `rank`'s window reads (its output block's window, reaching into the
  // padding at the map's edges).
  Region window_input(const WindowGeometry& g, int64_t rank) const;

  // This rank's window input [B, C, rows, cols] (a volume's [B, C, planes, rows, cols]): its own
  // block of `x`, the halo received from the ranks holding it, `fill` beyond the map (0, or
  // -infinity for max pooling).
  Tensor gather(DeviceMemory& backend, const Tensor& x, const WindowGeometry& g, float fill) const;
  // The adjoint: `dwindow`'s own part into dx (this rank's block), the halo's parts sent to their
  // holders, the parts others send back added.
  void scatter(DeviceMemory& backend, const Tensor& dwindow, const WindowGeometry& g,
               Tensor& dx) const;
  // The general form for any block a rank reads of a map held in blocks: `need(q)` is rank q's,
  // the same function on every rank (a window's input; U-Net's up-convolution and cropped concat:
  // spec::up_window_input_block, crop_input_block). Returns [B, C, need(this rank)]; give_back is
  // its adjoint (overwrites dx).
  Tensor fetch(DeviceMemory& backend, const Tensor& x, const spec::MapExtent& map,
               const std::function<Region(int64_t)>& need, float fill) const;
  void give_back(DeviceMemory& backend, const Tensor& dneed, const spec::MapExtent& map,
                 const std::function<Region(int64_t)>& need, Tensor& dx) const;
  // Elements per sample and channel the most loaded rank of the group receives for `g` (0: no
  // exchange; spec::halo_elements, what the lowering prices): what the trace reports for the
  // exchange, which waits for its largest transfer.
  int64_t largest_halo(const WindowGeometry& g) const;

  bool split() const { return ranks_ > 1; }
  int64_t index() const { return index_; }

 private:
  spec::SpatialSplit grid_;
  int64_t index_;
  int64_t ranks_;
  Communicator* comm_;
};

}  // namespace sextant::exec
