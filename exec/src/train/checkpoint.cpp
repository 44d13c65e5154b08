// Checkpoint files and their manifest.
#include "checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "sextant/exec/checkpoint_manifest.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::exec {

namespace fs = std::filesystem;

namespace {

uint64_t checksum(std::string_view bytes) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string step_dir(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step-{:08d}", step)).string();
}

std::string shard_name(int rank) {
  return fmt::format("rank-{:05d}.bin", rank);
}

void append_floats(std::string& out, const std::vector<float>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace

void save_checkpoint(const std::string& dir, const std::string& plan, const Shard& shard,
                     Communicator& world) {
  const std::string sdir = step_dir(dir, shard.step);
  if (world.rank() == 0) fs::create_directories(sdir);
  world.barrier();
  const ShardHeader header{.step = shard.step,
                           .rank = world.rank(),
                           .world = world.size(),
                           .plan = plan,
                           .elements = std::ssize(shard.values)};
  std::string body = to_json(header).dump() + "\n";
  append_floats(body, shard.values);
  append_floats(body, shard.m);
  append_floats(body, shard.v);
  for (const std::vector<float>& state : shard.exchange) append_floats(body, state);
  const std::string file = (fs::path(sdir) / shard_name(world.rank())).string();
  spec::write_file_atomically(file, body);
  spec::Json entry = {{"file", shard_name(world.rank())},
                      {"bytes", body.size()},
                      {"checksum", fmt::format("{:016x}", checksum(body))}};
  std::vector<std::string> entries = world.gather_strings(entry.dump(), 0);
  if (world.rank() == 0) {
    Manifest manifest{.step = shard.step, .world = world.size(), .plan = plan, .shards = {}};
    for (const std::string& e : entries) {
      const spec::Json j = spec::Json::parse(e);
      manifest.shards.push_back({.file = j.at("file").get<std::string>(),
                                 .bytes = j.at("bytes").get<int64_t>(),
                                 .checksum = j.at("checksum").get<std::string>()});
    }
    // The manifest is written last: a checkpoint without one never counts.
    spec::write_json_file((fs::path(sdir) / "manifest.json").string(), to_json(manifest));
  }
  world.barrier();
}

namespace {

// A checkpoint this run cannot use at all (another layout or model): an error, not damage.
struct Incompatible : InputError {
  using InputError::InputError;
};

// This rank's shard of the checkpoint in `sdir`; throws Incompatible, or InputError for damage.
Shard load_shard(const fs::path& sdir, const std::string& plan, int64_t elements,
                 Communicator& world) {
  Shard shard;
  const std::string file = (sdir / shard_name(world.rank())).string();
  const std::string manifest_file = (sdir / "manifest.json").string();
  const Manifest manifest = manifest_from_json(spec::read_json_file(manifest_file), manifest_file);
  if (manifest.world != world.size() || manifest.plan != plan) {
    throw Incompatible(manifest_file, "/plan", manifest.plan,
                       fmt::format("was written by another layout: this run is {} on {} ranks",
                                   plan, world.size()));
  }
  const ManifestEntry& entry = manifest.shards.at(static_cast<size_t>(world.rank()));
  std::string body = spec::read_text_file(file);
  if (std::ssize(body) != entry.bytes) {
    throw InputError(
        file, "", fmt::format("{} bytes", body.size()),
        fmt::format("truncated or damaged: the manifest records {} bytes", entry.bytes));
  }
  if (fmt::format("{:016x}", checksum(body)) != entry.checksum) {
    throw InputError(file, "", "", "checksum does not match the manifest: the file is damaged");
  }
  const size_t nl = body.find('\n');
  if (nl == std::string::npos) throw InputError(file, "", "", "no header line");
  const ShardHeader header = shard_header_from_json(
      spec::parse_json_text(std::string_view(body).substr(0, nl), file), file);
  if (header.elements != elements) {
    throw Incompatible(file, "/elements", std::to_string(header.elements),
                       fmt::format("this model holds {} parameters on this rank", elements));
  }
  shard.step = header.step;
  const size_t n = static_cast<size_t>(elements);
  // Values, two moments, the compressed exchange's state arrays (up to two) and PipeDream-2BW's
  // older weight version.
  const size_t arrays = n == 0 ? 3 : (body.size() - nl - 1) / (n * sizeof(float));
  if (arrays < 3 || arrays > 6 || body.size() != nl + 1 + arrays * n * sizeof(float)) {
    throw InputError(file, "", "", "the shard's length does not match its header");
  }
  const char* p = body.data() + nl + 1;
  shard.exchange.resize(arrays - 3);
  std::vector<std::vector<float>*> parts{&shard.values, &shard.m, &shard.v};
  for (std::vector<float>& state : shard.exchange) parts.push_back(&state);
  for (std::vector<float>* v : parts) {
    v->resize(n);
    std::memcpy(v->data(), p, n * sizeof(float));
    p += n * sizeof(float);
  }
  return shard;
}

// The first non-empty string of every rank's, on rank 0 ("" elsewhere).
std::string first_reason(const std::string& mine, Communicator& world) {
  for (const std::string& r : world.gather_strings(mine, 0))
    if (!r.empty()) return r;
  return "";
}

}  // namespace

std::optional<Shard> load_checkpoint(const std::string& dir, const std::string& plan,
                                     int64_t elements, Communicator& world,
                                     std::vector<std::string>* skipped) {
  // Step directories with a manifest, newest first (a checkpoint without one never counts).
  std::vector<std::pair<int64_t, fs::path>> steps;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (!fs::exists(entry.path() / "manifest.json")) continue;
      const bool digits = name.size() > 5 && name.rfind("step-", 0) == 0 &&
                          std::all_of(name.begin() + 5, name.end(),
                                      [](unsigned char c) { return std::isdigit(c) != 0; });
      if (!digits) {
        // A checkpoint renamed (step-00000020.good): it would be passed over for an older one
        // without a word.
        if (skipped != nullptr && world.rank() == 0)
          skipped->push_back(fmt::format(
              "{} skipped: it holds a manifest.json but is not named step-NNNNNNNN (renamed?)",
              entry.path().string()));
        continue;
      }
      steps.emplace_back(std::strtoll(name.c_str() + 5, nullptr, 10), entry.path());
    }
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  std::string newest_problem;
  for (const auto& [step, sdir] : steps) {
    std::string error;
    bool incompatible = false;
    Shard shard;
    try {
      shard = load_shard(sdir, plan, elements, world);
      if (shard.step != step)
        throw InputError(sdir.string(), "", fmt::format("step {}", shard.step),
                         fmt::format("its shards were written at another step than its name's "
                                     "({}): renamed?",
                                     step));
    } catch (const Incompatible& e) {
      error = e.what();
      incompatible = true;
    } catch (const InputError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = fmt::format("{}: cannot read the checkpoint: {}",
                          (sdir / shard_name(world.rank())).string(), e.what());
    }
    // Every rank agrees before anyone goes on: on damage anywhere, all try the next older one.
    double verdict[2] = {error.empty() ? 0.0 : 1.0, incompatible ? 1.0 : 0.0};
    world.all_reduce(verdict, 2);
    if (verdict[0] == 0) return shard;
    const std::string reason = first_reason(error, world);
    if (verdict[1] > 0) {
      throw InputError("--resume", "", "",
                       world.rank() == 0 ? reason : "the checkpoint was written by another run");
    }
    if (newest_problem.empty()) newest_problem = reason;
    if (skipped != nullptr && world.rank() == 0)
      skipped->push_back(fmt::format("{} skipped: {}", sdir.string(), reason));
  }
  if (steps.empty()) return std::nullopt;
  throw InputError("--resume", "", dir,
                   world.rank() == 0
                       ? fmt::format("no intact checkpoint (the newest: {})", newest_problem)
                       : "no intact checkpoint (another rank could not load its shard)");
}

}  // namespace sextant::exec
