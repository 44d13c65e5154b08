// Runs trials of plans as child `mpirun ... sextant run` jobs with a time limit.
#include "verify.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "sextant/spec/json_io.hpp"

namespace sextant::cli {

namespace {

std::string self_path() {
  char self[4096] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : "sextant";
}

// Runs `args` in its own process group with stdout and stderr to `log`; kills the group after
// `timeout_s`. Returns the exit status, or nullopt on timeout.
std::optional<int> run_with_timeout(const std::vector<std::string>& args, const std::string& log,
                                    double timeout_s) {
  // The child must not inherit (and later flush) what this process has buffered.
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    FILE* out = std::freopen(log.c_str(), "w", stdout);
    if (out != nullptr) dup2(fileno(stdout), STDERR_FILENO);
    std::vector<char*> argv;
    std::vector<std::string> copy = args;
    for (std::string& s : copy) argv.push_back(s.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    int status = 0;
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        timeout_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string last_line(const std::string& file) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

}  // namespace

std::vector<Trial> verify(const std::vector<planner::RankedPlan>& ranked, int64_t top,
                          const VerifyOptions& o) {
  std::filesystem::create_directories(o.work_dir);
  std::vector<Trial> trials;
  for (size_t i = 0; i < ranked.size() && static_cast<int64_t>(i) < top; ++i) {
    Trial t;
    t.plan = ranked[i].plan;
    t.predicted_s = ranked[i].report.step_time_s;
    const std::string base = fmt::format("{}/trial{}", o.work_dir, i + 1);
    spec::write_json_file(base + ".plan.json", spec::to_json(t.plan));
    std::vector<std::string> args = {"mpirun", "-np", std::to_string(t.plan.world_size()),
                                     "--oversubscribe"};
    if (geteuid() == 0) args.push_back("--allow-run-as-root");
    for (const std::string& a :
         {self_path(), std::string("run"), std::string("--model"), o.model, std::string("--plan"),
          base + ".plan.json", std::string("--steps"), std::to_string(o.steps),
          std::string("--quiet"), std::string("--log-json"), base + ".steps.jsonl",
          std::string("--trace"), base + ".trace.json"})
      args.push_back(a);
    std::optional<int> rc = run_with_timeout(args, base + ".log", o.timeout_s);
    if (!rc) {
      t.status = fmt::format("timed out after {:.0f} s", o.timeout_s);
    } else if (*rc != 0) {
      t.status = fmt::format("failed (exit {}): {}", *rc, last_line(base + ".log"));
    } else {
      // Mean step time after the warm-up steps (the first two, or the first when fewer).
      std::ifstream in(base + ".steps.jsonl");
      std::vector<double> times;
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) times.push_back(spec::Json::parse(line).at("step_time_s").get<double>());
      size_t skip = times.size() > 3 ? 2 : (times.size() > 1 ? 1 : 0);
      double sum = 0;
      for (size_t k = skip; k < times.size(); ++k) sum += times[k];
      if (times.size() > skip) t.measured_s = sum / static_cast<double>(times.size() - skip);
      t.status = t.measured_s ? "ok" : "no steps logged";
      t.trace_file = base + ".trace.json";
    }
    trials.push_back(std::move(t));
  }
  return trials;
}

}  // namespace sextant::cli
