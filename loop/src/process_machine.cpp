// Trials as child `sextant` processes with a time limit.
#include "sextant/loop/process_machine.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "sextant/spec/json_io.hpp"

namespace sextant::loop {

std::string last_line(const std::string& file) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

namespace {

// Why a run failed, from its log: the first line Sextant wrote as an error (under mpirun the
// log ends in mpirun's banner of dashes, which says nothing), else the last line.
std::string failure_line(const std::string& file) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("error: ", 0) == 0 || line.rfind("Error: ", 0) == 0) return line;
  return last_line(file);
}

}  // namespace

std::string self_executable() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : "sextant";
}

std::optional<int> run_child(const std::vector<std::string>& args, const std::string& log,
                             double timeout_s) {
  // The child must not inherit (and later flush) what this process has buffered.
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    // File descriptors, not stdio: `stdout` may be a stream of this process's own (the command
    // line's wrapper, fopencookie) that freopen cannot turn into a file.
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (std::string& s : copy) argv.push_back(s.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);  // both sides set it: whichever runs first, the group exists before a kill
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        timeout_s) {
      kill(-pid, SIGKILL);  // the whole group: mpirun and its ranks
      waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

RunResult ProcessMachine::run(const TrialPlan& trial, int64_t steps, const std::string& base) {
  // A failed run must not be read as the files of an earlier one.
  for (const char* ext : {".steps.jsonl", ".measured.json", ".disturbed"})
    std::filesystem::remove(base + ext);
  spec::write_json_file(base + ".plan.json", spec::to_json(trial.plan));
  std::vector<std::string> args = {options_.sextant,
                                   "run",
                                   "--model",
                                   trial.model,
                                   "--np",
                                   std::to_string(trial.plan.world_size()),
                                   "--plan",
                                   base + ".plan.json",
                                   "--steps",
                                   std::to_string(steps),
                                   "--quiet",
                                   "--log-json",
                                   base + ".steps.jsonl",
                                   "--trace",
                                   base + ".measured.json"};
  args.insert(args.end(), options_.run_args.begin(), options_.run_args.end());
  const std::optional<int> rc = run_child(args, base + ".log", options_.timeout_s);
  if (!rc) {
    RunResult r;
    r.status = fmt::format("timed out after {:.0f} s", options_.timeout_s);
    return r;
  }
  if (*rc != 0) {
    RunResult r;
    r.status = fmt::format("failed (exit {}): {}", *rc, failure_line(base + ".log"));
    return r;
  }
  return read_run(base);
}

std::string ProcessMachine::disturbance() {
  if (options_.cores_reference.empty()) return "";
  const std::string log = options_.cores_reference + ".probe.log";
  const std::optional<int> rc = run_child({options_.sextant, "bench", "cores", "--repeats", "2",
                                           "--reference", options_.cores_reference},
                                          log, 60);
  if (rc && *rc == 0) return "";
  const std::string why = last_line(log);
  return why.empty() ? "the core check failed" : why;
}

void ProcessMachine::pause(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

bool ProcessMachine::benchmark(const std::string& path) {
  if (options_.bench_args.empty()) return false;
  std::vector<std::string> args = {options_.sextant, "bench"};
  args.insert(args.end(), options_.bench_args.begin(), options_.bench_args.end());
  args.insert(args.end(), {"--trace", path});
  const std::optional<int> rc = run_child(args, path + ".log", options_.timeout_s);
  if (!rc || *rc != 0)
    throw std::runtime_error(
        fmt::format("the benchmark `sextant bench {}` {}: see {}", options_.bench_args.front(),
                    rc ? fmt::format("failed (exit {})", *rc) : "timed out", path + ".log"));
  return true;
}

bool ProcessMachine::co_run(const std::string& path) {
  if (!options_.co_run) return false;
  const std::string log = path + ".log";
  const std::optional<int> rc = run_child(
      {options_.sextant, "bench", "cores", "--co-run", "--json", "--repeats", "5"}, log, 120);
  if (!rc || *rc != 0)
    throw std::runtime_error(fmt::format("`sextant bench cores --co-run` {}: see {}",
                                         rc ? fmt::format("failed (exit {})", *rc) : "timed out",
                                         log));
  std::ofstream(path) << last_line(log) << "\n";  // the JSON object is its only output
  return true;
}

}  // namespace sextant::loop
