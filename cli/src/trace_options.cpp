// --trace, --trace-ranks, --trace-steps.
#include "trace_options.hpp"

namespace sextant::cli {

void add_trace_flags(CLI::App& cmd, TraceFlags& f, const std::string& what) {
  CLI::Option* trace = cmd.add_option(
      "--trace", f.file,
      "Write " + what + " (Chrome/Perfetto JSON; gzip-compressed when the name ends in .gz)");
  // A selection without a trace to apply it to was ignored; it is a mistake to say so.
  cmd.add_option("--trace-ranks", f.ranks,
                 "Ranks the trace keeps: comma-separated ranks, ranges A-B, last, stages (one per "
                 "pipeline stage), replicas (one per data-parallel replica); default all")
      ->needs(trace);
  cmd.add_option("--trace-steps", f.steps,
                 "Steps the trace keeps: comma-separated steps or ranges A-B from 0; default all")
      ->needs(trace);
}

spec::TraceSelection trace_selection_from(const TraceFlags& f, const spec::Plan& plan) {
  return spec::parse_trace_selection(f.ranks, f.steps, plan);
}

}  // namespace sextant::cli
