// Flat parameter storage and layout-independent initialisation.
#include "sextant/exec/parameters.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

float init_normal(uint64_t seed, const std::string& tensor, int64_t global_index) {
  // Box-Muller on two uniforms from a counter-based hash: the value depends only on its inputs.
  uint64_t base = splitmix64(seed ^ hash_name(tensor)) ^ static_cast<uint64_t>(global_index) * 2;
  uint64_t a = splitmix64(base);
  uint64_t b = splitmix64(base + 1);
  double u1 = (static_cast<double>(a >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
  double u2 = static_cast<double>(b >> 11) / 9007199254740992.0;          // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

ParamStore::ParamStore(DeviceMemory& backend, const std::vector<ParamSpec>& given)
    : backend_(backend) {
  std::vector<ParamSpec> specs = given;
  auto rank = [](const ParamSpec& s) { return s.replica_whole ? 2 : s.expert ? 1 : 0; };
  std::stable_sort(specs.begin(), specs.end(),
                   [&](const ParamSpec& a, const ParamSpec& b) { return rank(a) < rank(b); });
  int64_t total = 0;
  for (const ParamSpec& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    total += n;
  }
  values_ = backend.empty({total});
  grads_ = backend.zeros({total});
  compute_ = backend.activation_dtype() == DType::kF32
                 ? values_
                 : backend.empty({total}, backend.activation_dtype());
  std::vector<float> host(static_cast<size_t>(total));
  int64_t offset = 0;
  for (const ParamSpec& s : specs) {
    Param p;
    p.name = s.name;
    p.layer = s.layer;
    p.offset = offset;
    p.decay = s.decay;
    p.tp_replicated = s.tp_replicated;
    p.tp_partial = s.tp_partial.value_or(s.tp_replicated);
    p.grid_sharded = s.grid_sharded;
    p.tied_copy = s.tied_copy;
    p.expert = s.expert;
    p.replica_whole = s.replica_whole;
    p.replica_copy = s.replica_copy;
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(offset + i)] = s.init(i);
    p.value = values_.view({total}).rows(offset, n).view(s.shape);
    p.compute = compute_.rows(offset, n).view(s.shape);
    p.grad = grads_.view({total}).rows(offset, n).view(s.shape);
    offset += n;
    params_.push_back(std::move(p));
  }
  backend.from_host(host, values_);
  refresh_compute();
}

void ParamStore::refresh_compute(int64_t begin, int64_t end) {
  if (compute_.dtype() == values_.dtype() || end <= begin) return;
  Tensor to = compute_.rows(begin, end - begin);
  backend_.copy(values_.rows(begin, end - begin), to);
}

void ParamStore::add_version() {
  SEXTANT_CHECK(other_.empty(), "the parameters already have a second version");
  const Tensor& viewed = masters_versioned() ? values_ : compute_;
  other_ = backend_.empty({total()}, viewed.dtype());
  backend_.copy(viewed, other_);
}

void ParamStore::swap_versions() {
  SEXTANT_CHECK(!other_.empty(), "swap_versions without add_version");
  if (masters_versioned()) {
    std::swap(values_, other_);
    compute_ = values_;
  } else {
    std::swap(compute_, other_);
  }
  const int64_t n = total();
  for (Param& p : params_) {
    const std::vector<int64_t> shape = p.value.shape();
    const int64_t count = p.value.numel();
    p.value = values_.view({n}).rows(p.offset, count).view(shape);
    p.compute = compute_.rows(p.offset, count).view(shape);
  }
}

Param& ParamStore::get(const std::string& name) {
  for (Param& p : params_)
    if (p.name == name) return p;
  SEXTANT_CHECK(false, "no parameter named {}", name);
  return params_.front();
}

std::pair<int64_t, int64_t> ParamStore::layer_range(int32_t layer, bool experts) const {
  int64_t begin = -1, end = -1;
  for (const Param& p : params_) {
    if (p.layer != layer || p.expert != experts || p.replica_whole) continue;
    if (begin < 0) begin = p.offset;
    end = p.offset + p.value.numel();
  }
  if (begin < 0) return {0, 0};
  return {begin, end};
}

std::vector<int32_t> ParamStore::layers() const {
  std::vector<int32_t> out;
  for (const Param& p : params_)
    if (!p.expert && !p.replica_whole && (out.empty() || out.back() != p.layer))
      out.push_back(p.layer);
  return out;
}

int64_t ParamStore::replica_whole_begin() const {
  for (const Param& p : params_)
    if (p.replica_whole) return p.offset;
  return total();
}

}  // namespace sextant::exec
