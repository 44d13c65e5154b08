// The executor's side of training through co-located parameter servers (spec/parameter_server.hpp):
// each data-parallel rank is a worker and the server of one range of the stage's parameters
// (spec::server_range). The messages travel point to point on the replicas' communicator, each
// kind in step order under its own tag; a server serves between its own steps (the trainer calls
// sum, then publishes after its update), the latest the staleness bound allows, so the pushes
// travel while it computes. CPU ranks, fp32 (spec/executor_support.hpp).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/exec/parameters.hpp"

namespace sextant::exec {

class ParameterServers {
 public:
  ParameterServers(Context& ctx, ParamStore& store);
  ParameterServers(const ParameterServers&) = delete;
  ParameterServers& operator=(const ParameterServers&) = delete;
  ~ParameterServers();

  // This rank's server range [begin, end) of the flat buffers.
  std::pair<int64_t, int64_t> range() const { return range_; }
  // The parameters each server updates, padded (what the simulator prices).
  int64_t shard() const;
  // The gradients of the step just run (the store's) copied aside and sent to their servers
  // (dp.ps_push). The copy lives until every server has received it.
  void push();
  // This rank's server: the oldest pushed step's parts from every worker, summed in worker order
  // into the store's gradients over range() (dp.ps_sum), as one process summing the global batch.
  void sum();
  // This rank's server: the new version of range() (`masters`' values there) sent to every
  // worker, itself included.
  void publish(const Tensor& masters);
  // The oldest version published and not yet pulled, from every server into the store's values
  // (dp.ps_pull); the compute copy refreshed.
  void pull();

 private:
  struct Outgoing {  // a buffer being sent, and its sends
    std::vector<float> data;
    std::vector<std::unique_ptr<CommRequest>> sends;
  };
  static void finish(std::deque<Outgoing>& sent, size_t keep);

  Context& ctx_;
  ParamStore& store_;
  Communicator& replicas_;
  int64_t servers_ = 1, me_ = 0;
  std::pair<int64_t, int64_t> range_;
  std::deque<Outgoing> pushed_;     // per step pushed and not yet summed by every server
  std::deque<Outgoing> published_;  // per version published and not yet pulled by every worker
  std::vector<float> part_;         // a worker's part received by this server
};

}  // namespace sextant::exec
