// Checkpoint files and their manifest.
#include "sextant/exec/checkpoint.hpp"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::exec {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSchema = "sextant.checkpoint/1";

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
  std::string body;
  spec::Json header = {{"schema", kSchema},    {"step", shard.step},
                       {"rank", world.rank()}, {"world", world.size()},
                       {"plan", plan},         {"elements", shard.values.size()}};
  body = header.dump() + "\n";
  append_floats(body, shard.values);
  append_floats(body, shard.m);
  append_floats(body, shard.v);
  const std::string file = (fs::path(sdir) / shard_name(world.rank())).string();
  spec::write_file_atomically(file, body);
  spec::Json entry = {{"file", shard_name(world.rank())},
                      {"bytes", body.size()},
                      {"checksum", fmt::format("{:016x}", checksum(body))}};
  std::vector<std::string> entries = world.gather_strings(entry.dump(), 0);
  if (world.rank() == 0) {
    spec::Json manifest = {{"schema", "sextant.checkpoint_manifest/1"},
                           {"step", shard.step},
                           {"world", world.size()},
                           {"plan", plan},
                           {"shards", spec::Json::array()}};
    for (const std::string& e : entries) manifest["shards"].push_back(spec::Json::parse(e));
    // The manifest is written last: a checkpoint without one never counts.
    spec::write_json_file((fs::path(sdir) / "manifest.json").string(), manifest);
  }
  world.barrier();
}

std::optional<Shard> load_checkpoint(const std::string& dir, const std::string& plan,
                                     int64_t elements, Communicator& world) {
  // The newest step directory with a manifest.
  std::optional<fs::path> newest;
  int64_t newest_step = -1;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step-", 0) != 0 || !fs::exists(entry.path() / "manifest.json")) continue;
      int64_t step = std::stoll(name.substr(5));
      if (step > newest_step) {
        newest_step = step;
        newest = entry.path();
      }
    }
  }
  if (!newest) return std::nullopt;
  std::string error;
  Shard shard;
  const std::string file = (*newest / shard_name(world.rank())).string();
  try {
    spec::Json manifest = spec::read_json_file((*newest / "manifest.json").string());
    if (manifest.at("world").get<int>() != world.size() ||
        manifest.at("plan").get<std::string>() != plan) {
      throw InputError((*newest / "manifest.json").string(), "/plan", manifest.at("plan").dump(),
                       fmt::format("was written by another layout: this run is {} on {} ranks",
                                   plan, world.size()));
    }
    const spec::Json& entry = manifest.at("shards").at(static_cast<size_t>(world.rank()));
    std::string body = spec::read_text_file(file);
    if (body.size() != entry.at("bytes").get<size_t>()) {
      throw InputError(file, "", fmt::format("{} bytes", body.size()),
                       fmt::format("truncated or damaged: the manifest records {} bytes",
                                   entry.at("bytes").get<size_t>()));
    }
    if (fmt::format("{:016x}", checksum(body)) != entry.at("checksum").get<std::string>()) {
      throw InputError(file, "", "", "checksum does not match the manifest: the file is damaged");
    }
    size_t nl = body.find('\n');
    spec::Json header = spec::parse_json_text(std::string_view(body).substr(0, nl), file);
    if (header.at("elements").get<int64_t>() != elements) {
      throw InputError(file, "/elements", header.at("elements").dump(),
                       fmt::format("this model holds {} parameters on this rank", elements));
    }
    shard.step = header.at("step").get<int64_t>();
    const size_t n = static_cast<size_t>(elements);
    if (body.size() != nl + 1 + 3 * n * sizeof(float)) {
      throw InputError(file, "", "", "the shard's length does not match its header");
    }
    const char* p = body.data() + nl + 1;
    for (std::vector<float>* v : {&shard.values, &shard.m, &shard.v}) {
      v->resize(n);
      std::memcpy(v->data(), p, n * sizeof(float));
      p += n * sizeof(float);
    }
  } catch (const InputError& e) {
    error = e.what();
  } catch (const std::exception& e) {
    error = fmt::format("{}: cannot read the checkpoint: {}", file, e.what());
  }
  // Every rank agrees before anyone goes on.
  double failed = error.empty() ? 0 : 1;
  world.all_reduce(&failed, 1);
  if (failed > 0) {
    if (!error.empty()) throw InputError("--resume", "", "", error);
    throw InputError("--resume", "", "", "another rank could not load its checkpoint shard");
  }
  return shard;
}

}  // namespace sextant::exec
