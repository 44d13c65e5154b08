// Trial results: a run read back from its files.
#include "sextant/loop/trial.hpp"

#include <filesystem>
#include <fstream>

#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::loop {

RunResult read_run(const std::string& base) {
  RunResult r;
  const std::string steps_file = base + ".steps.jsonl";
  std::ifstream in(steps_file);
  if (!in) throw InputError(steps_file, "", "", "missing: the run's step log (measure first)");
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    spec::Json j;
    try {
      j = spec::Json::parse(line);
    } catch (const spec::Json::exception& e) {
      throw InputError(steps_file, "line " + std::to_string(line_no), "", e.what());
    }
    if (!j.is_object() || !j.contains("step_time_s") || !j.at("step_time_s").is_number())
      throw InputError(steps_file, "line " + std::to_string(line_no) + " /step_time_s", "",
                       "expected a number of seconds");
    r.step_times_s.push_back(j.at("step_time_s").get<double>());
  }
  r.status = r.step_times_s.empty() ? "no steps logged" : "ok";
  if (std::filesystem::exists(base + ".measured.json")) r.trace_file = base + ".measured.json";
  if (std::ifstream d(base + ".disturbed"); d) {
    std::getline(d, r.disturbed);
    if (r.disturbed.empty()) r.disturbed = "disturbed";
  }
  return r;
}

}  // namespace sextant::loop
